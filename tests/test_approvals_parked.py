"""Approvals hold no worker place (issue 37): a durable run that waits for a person's decision
is parked (its execution ends, the run stays `waiting` in the store, held by nobody), and the
decision queues it again, to resume at the waiting call from its checkpoints; an approval's
timeout rejects the call or fails the run, and an escalation is said once, with no worker
holding the run; of a decision and a timeout at once, exactly one wins."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from runs_helpers import (
    WorkerProcess,
    finished,
    ledger_lines,
    minions,
    run_here,
    worker,
    write_ledger_recipe,
)

from minions.errors import RecipeError, RunStateError
from minions.events import ApprovalEscalated, ApprovalRequested, ApprovalResolved, RunFailed
from minions.recipes import parse_recipe
from minions.runs import RunStore, _approvals
from minions.runs import _decisions as decisions
from minions.runs import _leases as leases
from minions.runs import _runs as runs
from minions.runs._db import Database
from minions.testing import ScriptedModel

GATED = """\
id: gated
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - id: before
    tool: mark
    params: {run: "{{ inputs.tag }}", step: before}
  - id: ship
    tool: mark
    params: {run: "{{ inputs.tag }}", step: ship}
    depends_on: [before]
    requires_approval: true
"""

PLAIN = """\
id: plain
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - id: only
    tool: mark
    params: {run: "{{ inputs.tag }}", step: only}
"""


def gated(folder: Path, approval: str = "") -> Path:
    """The gated recipe (an ordinary step, then one that needs approval), with `approval`
    (the recipe's ``approval:`` block, YAML) when given."""
    write_ledger_recipe(folder)
    path = folder / "gated.yaml"
    path.write_text(GATED + (f"approval: {approval}\n" if approval else ""))
    return path


def holder(database: Database, run_id: str) -> str | None:
    with database.read() as db:
        found: str | None = runs.row(db, run_id).holder
    return found


async def parked(store: RunStore, database: Database, run_id: str, within: float = 60) -> None:
    """Wait until the run waits for a decision, given back to the store (held by nobody)."""
    for _ in range(int(within / 0.05)):
        record = await store.get(run_id)
        if record.status == "waiting" and holder(database, run_id) is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} was never parked: {record}")


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger of the runs run in this process."""
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger.txt"))


Enqueued = list[tuple[str, int]]


def recording(seen: Enqueued) -> Callable[[Any, str, int], None]:
    """An enqueue that records what it would queue (the test runs it in this process)."""
    return lambda _db, run_id, attempt: seen.append((run_id, attempt))


# -- the proof: ten waiting runs, two places, an ordinary run --------------------------------------


@pytest.mark.slow
async def test_runs_waiting_for_approval_hold_no_worker_place(tmp_path: Path, url: str) -> None:
    """A worker with two places, ten runs waiting for a decision, then an ordinary run: it
    completes without any decision. The worker is killed while they wait; approving the ten
    (five with no worker alive, five with a new one) resumes each at its waiting call: each
    side effect once, the step before it never again."""
    recipe, plain = gated(tmp_path), tmp_path / "plain.yaml"
    plain.write_text(PLAIN)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    tags = [f"g{i}" for i in range(10)]
    ids = [(await store.submit(recipe, {"tag": tag}))[0] for tag in tags]
    database = Database(url)
    first = WorkerProcess(url, tmp_path, "w1", ledger, "--concurrency", "2")
    try:
        for run_id in ids:
            await parked(store, database, run_id)
        ordinary, _ = await store.submit(plain, {"tag": "plain"})
        assert await finished(store, ordinary) == "completed"
        assert [(await store.get(run_id)).status for run_id in ids] == ["waiting"] * 10
    finally:
        first.kill()
    # Its log says each run parked, and no step failed (those cut short by a park did not).
    said = first.log.read_text()
    assert said.count("run parked") == 10
    assert "step_failed" not in said
    assert "run_failed" not in said
    for run_id in ids[:5]:  # nobody runs them: each is queued by its decision
        record = await store.approve(run_id, actor="alice")
        assert record.status == "queued"
    with worker(url, tmp_path, "w2", ledger, "--concurrency", "2"):
        for run_id in ids[5:]:
            await store.approve(run_id, actor="bob")
        for run_id in ids:
            assert await finished(store, run_id) == "completed"
    effects = [(run, step) for run, step, _ in ledger_lines(ledger)]
    for tag in tags:
        assert effects.count((tag, "before")) == 1
        assert effects.count((tag, "ship")) == 1
    assert effects.count(("plain", "only")) == 1
    for run_id in ids:
        logged = await store.events(run_id)
        assert [e.seq for e in logged] == list(range(1, len(logged) + 1))
        done = [e.step_id for e in logged if e.kind == "step_completed"]
        assert sorted(str(step) for step in done) == ["before", "ship"]
        [resolved] = [e for e in logged if isinstance(e, ApprovalResolved)]
        assert resolved.approved
        assert resolved.actor in ("alice", "bob")
        [approval] = (await store.get(run_id)).approvals
        assert approval.decided_by == resolved.actor
    database.close()
    store.close()


# -- parking, in this process ------------------------------------------------------------------


async def test_a_parked_run_is_waiting_held_by_nobody_and_no_takeover_queues_it(
    tmp_path: Path, url: str
) -> None:
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(gated(tmp_path), {"tag": "a"})
    await run_here(url, run_id)  # returns: the run is parked
    record = await store.get(run_id)
    assert (record.status, record.attempt) == ("waiting", 2)
    database = Database(url)
    assert holder(database, run_id) is None
    [approval] = record.approvals
    assert approval.decided_at is None
    assert approval.call_id == "ship#1/ship-call"
    assert runs.expired(database, time.time() + 3600) == []  # waits for a person, not a worker
    # A delivery of the attempt that parked finds nothing to run (it is stale).
    await run_here(url, run_id, 1)
    assert (await store.get(run_id)).status == "waiting"
    # A cancel ends it at once: nobody holds it.
    cancelled = await store.cancel(run_id, wait=0, actor="carol")
    assert cancelled.status == "cancelled"
    database.close()
    store.close()


SUB = """\
id: outer
inputs: {tag: {type: string}}
steps:
  - id: sub
    recipe: gated.yaml
    inputs: {tag: "{{ inputs.tag }}"}
"""


@pytest.mark.parametrize("where", ["step", "sub-recipe"])
async def test_a_parked_run_is_not_logged_as_failed_by_its_worker(
    tmp_path: Path, url: str, where: str
) -> None:
    """The steps cut short when a run parks did not fail: the worker's log (structlog, as
    `minions worker` configures it) says of the run what its event log says, then that it
    parked and where it waits; nothing of steps or runs failing or cancelled, not even of
    a recipe step's inner run."""
    recipe = gated(tmp_path)
    if where == "sub-recipe":
        recipe = tmp_path / "outer.yaml"
        recipe.write_text(SUB)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "a"})
    with structlog.testing.capture_logs() as logs:
        await run_here(url, run_id)  # returns: the run is parked
    assert (await store.get(run_id)).status == "waiting"
    said = [(e["seq"], e["event"]) for e in logs if e.get("run_id") == run_id and "seq" in e]
    assert said == [(e.seq, e.kind) for e in await store.events(run_id)]
    assert not [e for e in logs if e["event"] in ("step_failed", "run_failed", "tool_call_failed")]
    [parked_line] = [e for e in logs if e["event"].startswith("run parked")]
    assert parked_line["run_id"] == run_id
    assert (parked_line["step_id"], parked_line["tool"]) == ("ship", "mark")
    assert parked_line["log_level"] == "info"
    store.close()


async def test_a_decision_resumes_the_run_at_the_waiting_call(tmp_path: Path, url: str) -> None:
    store = RunStore(url, create=True)
    recipe = gated(tmp_path)
    ledger = tmp_path / "ledger.txt"
    run_id, _ = await store.submit(recipe, {"tag": "a"})
    await run_here(url, run_id)
    decided = await store.approve(run_id, actor="alice")
    assert (decided.status, decided.attempt, decided.queued_by) == ("queued", 2, "alice")
    with pytest.raises(RunStateError, match="approved already"):
        await store.approve(run_id, approved=False, reason="late", actor="bob")
    await run_here(url, run_id, 2)
    record = await store.get(run_id)
    assert record.status == "completed"
    assert [(r, s) for r, s, _ in ledger_lines(ledger)] == [("a", "before"), ("a", "ship")]
    logged = await store.events(run_id)
    asked = [e for e in logged if isinstance(e, ApprovalRequested)]
    assert len(asked) == 2  # asked before the park, and found decided after it
    [resolved] = [e for e in logged if isinstance(e, ApprovalResolved)]
    assert (resolved.approved, resolved.actor) == (True, "alice")
    assert [e.step_id for e in logged if e.kind == "step_completed"] == ["before", "ship"]
    store.close()


AGENT_TOOLS = '''\
from pathlib import Path

from minions import tool


@tool(requires_approval=True)
def deploy(target: str) -> str:
    """Deploy to a target."""
    with open(Path(__file__).parent / "effects.txt", "a") as effects:
        effects.write(target + "\\n")
    return f"deployed {target}"
'''

AGENT = """\
id: ship
tools: [agent_tools]
approval: {timeout: 2h, escalate_after: 30m}
steps:
  - id: ship
    goal: Deploy to prod.
    tools: [deploy]
"""


async def test_a_timeout_rejects_the_call_and_the_model_is_told_why(
    tmp_path: Path, url: str
) -> None:
    (tmp_path / "agent_tools.py").write_text(AGENT_TOOLS)
    recipe = tmp_path / "ship.yaml"
    recipe.write_text(AGENT)
    store = RunStore(url, create=True)
    database = Database(url)
    run_id, _ = await store.submit(recipe)

    def script() -> ScriptedModel:
        return ScriptedModel([[("deploy", {"target": "prod"})], "Not deployed."])

    await run_here(url, run_id, model=script())
    [approval] = (await store.get(run_id)).approvals
    assert approval.due_at is not None
    assert approval.escalate_at is not None
    assert approval.due_at - approval.requested_at == 7200
    assert approval.escalate_at - approval.requested_at == 1800
    assert approval.on_timeout == "reject"
    seen: Enqueued = []
    # Nothing is due yet: the sweep says when something is.
    assert decisions.sweep(database, enqueue=recording(seen), now=approval.requested_at + 60) == (
        approval.escalate_at
    )
    # Past the escalation: one approval_escalated event, said once whoever sweeps again.
    later = approval.requested_at + 1801
    assert decisions.sweep(database, enqueue=recording(seen), now=later) == approval.due_at
    decisions.sweep(database, enqueue=recording(seen), now=later + 1)
    [escalated] = [e for e in await store.events(run_id) if isinstance(e, ApprovalEscalated)]
    assert (escalated.call_id, escalated.name) == (approval.call_id, "deploy")
    assert escalated.waited == pytest.approx(1801)
    assert seen == []
    assert (await store.get(run_id)).status == "waiting"
    # Past the timeout: rejected by "timeout", and the run queued again.
    assert decisions.sweep(database, enqueue=recording(seen), now=approval.due_at + 1) is None
    assert seen == [(run_id, 2)]
    record = await store.get(run_id)
    assert record.status == "queued"
    [approval] = record.approvals
    assert (approval.approved, approval.decided_by) == (False, "timeout")
    assert "nobody decided within 2h" in (approval.reason or "")
    model = script()
    await run_here(url, run_id, 2, model=model)
    assert (await store.get(run_id)).status == "completed"
    told = model.requests[-1].messages[-1].content
    assert told is not None
    assert told.startswith("Nobody approved this call to 'deploy' in time: nobody decided within")
    assert "2h (the recipe's approval timeout)" in told
    assert not (tmp_path / "effects.txt").exists()  # the call was never made
    database.close()
    store.close()


async def test_a_timeout_that_fails_the_run_ends_it_saying_which_call(
    tmp_path: Path, url: str
) -> None:
    store = RunStore(url, create=True)
    database = Database(url)
    run_id, _ = await store.submit(gated(tmp_path, "{timeout: 1h, on_timeout: fail}"), {"tag": "a"})
    await run_here(url, run_id)
    [approval] = (await store.get(run_id)).approvals
    assert approval.due_at is not None
    shown = minions("runs", "show", run_id, "--database-url", url, COLUMNS="200").stdout
    assert "ship#1/ship-call: mark(" in shown
    assert re.search(r"waiting, times out in (1h|59m5\ds) \(fails the run\)", shown), shown
    seen: Enqueued = []
    swept = decisions.sweep(database, enqueue=recording(seen), now=approval.due_at + 1, by="w9")
    assert swept is None
    assert seen == []
    record = await store.get(run_id)
    assert record.status == "failed"
    # The audit log says who decided: the timeout, swept by worker w9.
    [timed_out] = await store.audit(action="approval")
    assert (timed_out.action, timed_out.actor, timed_out.address, timed_out.target) == (
        "approval.reject",
        "timeout",
        "w9",
        run_id,
    )
    assert timed_out.detail["on_timeout"] == "fail"
    assert timed_out.detail["call"] == approval.call_id
    assert record.error == "call 'ship#1/ship-call' (mark) waited 1h for a decision: timed out"
    last = (await store.events(run_id))[-1]
    assert isinstance(last, RunFailed)
    assert last.actor == "timeout"
    [approval] = record.approvals
    assert (approval.approved, approval.decided_by) == (False, "timeout")
    with pytest.raises(RunStateError, match="rejected already"):
        await store.approve(run_id)
    database.close()
    store.close()


async def test_a_worker_times_out_an_approval_with_no_worker_holding_the_run(
    tmp_path: Path, url: str
) -> None:
    """End to end: a worker parks the run, and its sweep (or any worker's) rejects the call
    once the timeout passed; the tool step fails with the reason."""
    store = RunStore(url, create=True)
    ledger = tmp_path / "ledger.txt"
    run_id, _ = await store.submit(gated(tmp_path, "{timeout: 1s}"), {"tag": "t"})
    with worker(url, tmp_path, "w1", ledger):
        assert await finished(store, run_id) == "failed"
    record = await store.get(run_id)
    [approval] = record.approvals
    assert (approval.approved, approval.decided_by) == (False, "timeout")
    assert "nobody decided within 1s" in (record.error or "")
    assert [(r, s) for r, s, _ in ledger_lines(ledger)] == [("t", "before")]
    store.close()


# -- races -------------------------------------------------------------------------------------


def together(*calls: Callable[[], Any]) -> list[Any]:
    """Run `calls` in threads at once; what each returned (or raised)."""
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int, call: Callable[[], Any]) -> None:
        start.wait()
        try:
            results[i] = call()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


async def test_a_decision_racing_the_timeout_and_two_sweeps_exactly_one_wins(
    tmp_path: Path, url: str
) -> None:
    store = RunStore(url, create=True)
    recipe = gated(tmp_path, "{timeout: 1h}")
    ids = [(await store.submit(recipe, {"tag": f"r{i}"}))[0] for i in range(6)]
    for run_id in ids:
        await run_here(url, run_id)
    databases = [Database(url) for _ in range(3)]
    seen: Enqueued = []
    for run_id in ids:
        [approval] = (await store.get(run_id)).approvals
        assert approval.due_at is not None
        past = approval.due_at + 1
        call, enqueue = approval.call_id, recording(seen)
        outcomes = together(
            partial(
                decisions.decide,
                databases[0],
                run_id,
                call,
                approved=True,
                reason=None,
                actor="alice",
                enqueue=enqueue,
            ),
            partial(decisions.expire, databases[1], run_id, call, enqueue=enqueue, now=past),
            partial(decisions.expire, databases[2], run_id, call, enqueue=enqueue, now=past),
        )
        assert not any(isinstance(o, Exception) for o in outcomes), outcomes
        won = [bool(o) for o in outcomes]
        assert won.count(True) == 1, outcomes
        [decided] = (await store.get(run_id)).approvals
        assert decided.decided_by == ("alice" if won[0] else "timeout")
        # Only the timeout that won wrote an entry (alice's decision here was given none).
        timed_out = [e for e in await store.audit(action="approval") if e.target == run_id]
        assert [e.actor for e in timed_out] == ([] if won[0] else ["timeout"])
        record = await store.get(run_id)
        assert (record.status, record.attempt) == ("queued", 2)
    assert sorted(seen) == sorted((run_id, 2) for run_id in ids)  # each queued once
    for database in databases:
        database.close()
    store.close()


async def test_a_park_and_a_decision_at_once_never_leave_a_decided_run_parked(
    tmp_path: Path, url: str
) -> None:
    """The holder parks the run while a person decides its call: either the park sees the
    decision (the holder goes on with it) or the decision sees the run parked (and queues
    it); never a decided call in a run that nobody will run."""
    store = RunStore(url, create=True)
    recipe = gated(tmp_path)
    park_db, decide_db = Database(url), Database(url)
    outcomes = {"parked": 0, "went on": 0}
    for i in range(8):
        run_id, _ = await store.submit(recipe, {"tag": f"p{i}"})
        now = time.time()
        start = leases.claim(
            park_db, run_id, attempt=1, holder="h", executor_id="w", lease_until=now + 60, now=now
        )
        assert isinstance(start, leases.Start)
        call = "ship#1/ship-call"
        leases.request_approval(
            park_db, start.lease, call_id=call, step_id="ship", tool="mark", arguments={}
        )
        seen: Enqueued = []
        park, decide = together(
            partial(leases.park, park_db, start.lease, call_id=call),
            partial(
                decisions.decide,
                decide_db,
                run_id,
                call,
                approved=True,
                reason=None,
                actor="alice",
                enqueue=recording(seen),
            ),
        )
        assert decide is not None
        record = await store.get(run_id)
        if park is None:  # parked first: the decision queued it
            outcomes["parked"] += 1
            assert (record.status, seen) == ("queued", [(run_id, 2)])
        else:  # decided first: the park saw it, the holder goes on holding the run
            outcomes["went on"] += 1
            assert park.approved
            assert seen == []
            assert record.status == "running"
    park_db.close()
    decide_db.close()
    store.close()


# -- bad values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("approval", "said"),
    [
        ("{timeout: soon}", "'soon' is not a duration"),
        ("{timeout: 0}", "is not a duration"),
        ("{timeout: 4000d}", "longer than 3650d"),
        ("{timeout: 1h, on_timeout: retry}", "on_timeout"),
        ("{on_timeout: fail}", "give `timeout` too"),
        ("{escalate_after: 2h, timeout: 1h}", "must be shorter than `timeout`"),
        ("{}", "give `timeout`, `escalate_after` or both"),
        ("{timeout: 1h, after: 2h}", "after"),
        ("true", "approval"),
    ],
)
def test_bad_approval_options_are_refused_clearly(approval: str, said: str) -> None:
    text = f"id: x\napproval: {approval}\nsteps: [{{id: a, goal: hi}}]\n"
    with pytest.raises(RecipeError) as raised:
        parse_recipe(text)
    assert said in str(raised.value)
    assert "approval" in str(raised.value)


def test_a_store_of_schema_5_migrates_its_approvals(tmp_path: Path) -> None:
    import sqlite3

    from minions.runs._tables import SCHEMA_VERSION

    path = tmp_path / "m.db"
    made = Database(f"sqlite:///{path}", create=True)
    made.close()
    with sqlite3.connect(path) as db:  # what schema 5 had: approvals without deadlines
        for column in ("due_at", "on_timeout", "escalate_at", "escalated_at"):
            db.execute(f"ALTER TABLE minions_approvals DROP COLUMN {column}")
        db.execute(
            "INSERT INTO minions_approvals (run_id, call_id, step_id, tool, arguments, "
            "requested_at) VALUES ('r', 'c', 's', 't', '{}', 1.0)"
        )
        db.execute("UPDATE minions_meta SET value = '5' WHERE key = 'schema_version'")
    store = Database(f"sqlite:///{path}")
    found = _approvals.get(store, "r", "c")
    assert found is not None
    assert (found.due_at, found.on_timeout, found.escalate_at) == (None, None, None)
    assert decisions.next_due(store) is None
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM minions_meta").fetchone()[0] == str(SCHEMA_VERSION)


def test_runs_show_says_no_worker_holds_a_parked_run() -> None:
    """A run waiting for a person is held by no worker: no hint that its (last) worker
    died and a live one takes it over; a running run of a dead worker still gets one."""
    from minions.cli._show import dead_worker_hint
    from minions.runs import RunRecord, WorkerRecord

    now = time.time()
    dead = WorkerRecord(
        executor_id="w1", started_at=0, heartbeat_at=now - 600, stopped_at=None, version="1",
        runs=[],
    )  # fmt: skip
    waiting = RunRecord(run_id="r", recipe_id="x", status="waiting", created_at=0, executor_id="w1")
    assert dead_worker_hint(waiting, [dead], now) == ""
    running = RunRecord(run_id="r", recipe_id="x", status="running", created_at=0, executor_id="w1")
    assert "seems dead" in dead_worker_hint(running, [dead], now)
