"""Durable runs on SQLite: submit, workers, the event log, cancel, resume, recovery after a
SIGKILL, idempotent submit, recipe snapshots, and bad input. Workers are real `minions worker`
processes."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

import pytest
from postgres import fresh_database
from runs_helpers import (
    STEPS,
    completed,
    finished,
    insert_run,
    ledger_lines,
    minions,
    run_here,
    until,
    worker,
    write_ledger_recipe,
)

from minions.errors import RunStateError, StoreError, UnknownRunError
from minions.events import ApprovalResolved, RunRequeued
from minions.runs import RunStore

pytestmark = pytest.mark.slow


async def test_a_submitted_run_completes_with_contiguous_events(tmp_path: Path, url: str) -> None:
    recipe = write_ledger_recipe(tmp_path)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    run_id, created = await store.submit(recipe, {"tag": "r1"})
    assert created
    assert (await store.get(run_id)).status == "queued"
    with worker(url, tmp_path, "w1", ledger):
        assert await finished(store, run_id) == "completed"
    record = await store.get(run_id)
    assert record.output == "r1:five"
    assert [(s.step_id, s.visit, s.status) for s in record.steps] == [
        (s, 1, "completed") for s in STEPS
    ]
    events = await store.events(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].kind == "run_started"
    assert events[-1].kind == "run_completed"
    assert all(e.kind != "token_delta" for e in events)
    # Each tool call got an idempotency key naming the run, the step execution and the call.
    keys = [key for _, _, key in ledger_lines(ledger)]
    assert keys[0].startswith(f"{run_id}/one#1/")
    assert len(set(keys)) == 5


async def test_submitting_twice_with_one_key_gives_one_run(tmp_path: Path, url: str) -> None:
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    first = await store.submit(recipe, {"tag": "x"}, idempotency_key="k")
    again = await store.submit(recipe, {"tag": "x"}, idempotency_key="k")
    assert first == (first[0], True)
    assert again == (first[0], False)
    assert len(await store.list_runs()) == 1


async def test_the_recipe_is_snapshotted_at_submission(tmp_path: Path, url: str) -> None:
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "snap"})
    recipe.write_text(recipe.read_text().replace("step: five", "step: EDITED"))
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        assert await finished(store, run_id) == "completed"
    assert (await store.get(run_id)).output == "snap:five"


async def test_a_run_killed_mid_way_resumes_after_its_last_completed_step(
    tmp_path: Path, url: str
) -> None:
    recipe = write_ledger_recipe(tmp_path, seconds=0.4)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "k"})
    first = worker(url, tmp_path, "w1", ledger)
    process = first.__enter__()
    await until(lambda: len(ledger_lines(ledger)) >= 2)
    process.kill()
    done_before = [step for _, step, _ in ledger_lines(ledger)]
    with worker(url, tmp_path, "w1", ledger):  # the same executor id recovers its runs
        assert await finished(store, run_id) == "completed"
    steps = [step for _, step, _ in ledger_lines(ledger)]
    # Completed steps ran once; the one in flight at the kill at most twice.
    for step in STEPS:
        assert 1 <= steps.count(step) <= (2 if step not in done_before[:-1] else 1)
    events = await store.events(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events].count("run_started") == 1
    assert events[-1].kind == "run_completed"


async def test_cancel_a_running_run_then_resume_it(tmp_path: Path, url: str) -> None:
    recipe = write_ledger_recipe(tmp_path, seconds=0.5)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "c"})
    with worker(url, tmp_path, "w1", ledger):
        # Cancelled once step one is stored as done (its ledger line alone comes before that).
        await completed(store, run_id, "one")
        cancelled = await store.cancel(run_id)
        assert cancelled.status == "cancelled"
        events = await store.events(run_id)
        assert events[-1].kind == "run_failed"
        with pytest.raises(RunStateError, match="nothing to cancel"):
            await store.cancel(run_id)
        done = {step for _, step, _ in ledger_lines(ledger)}
        assert done != set(STEPS)
        resumed = await store.resume(run_id)
        assert resumed.status == "queued"
        assert await finished(store, run_id) == "completed"
    steps = [step for _, step, _ in ledger_lines(ledger)]
    assert sorted(set(steps)) == sorted(STEPS)
    assert steps.count("one") == 1  # completed before the cancel: not run again


async def test_a_queued_run_is_cancelled_at_once(tmp_path: Path, url: str) -> None:
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "q"})
    record = await store.cancel(run_id)
    assert record.status == "cancelled"
    assert [e.kind for e in await store.events(run_id)] == ["run_failed"]
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        await asyncio.sleep(1)
    assert (await store.get(run_id)).status == "cancelled"
    assert ledger_lines(tmp_path / "ledger.txt") == []


async def test_wrong_states_and_unknown_runs(tmp_path: Path, url: str) -> None:
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "w"})
    with pytest.raises(RunStateError, match="only a failed or cancelled run resumes"):
        await store.resume(run_id)
    with pytest.raises(RunStateError, match="waits for no approval"):
        await store.approve(run_id)
    for operation in (store.get, store.cancel, store.resume, store.events):
        with pytest.raises(UnknownRunError, match="no run 'nope'"):
            await operation("nope")


def test_reading_a_store_that_is_not_there_writes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.db"
    with pytest.raises(StoreError, match="no run store at"):
        RunStore(f"sqlite:///{missing}")
    assert not missing.exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="is not a minions run store"):
        RunStore(f"sqlite:///{garbage}")
    with pytest.raises(StoreError, match="unsupported database URL"):
        RunStore("mysql://x/y")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs", "show", "nope"], "error: no run 'nope'"),
        (["runs", "cancel", "nope"], "error: no run 'nope'"),
        (["runs", "list", "--status", "lost"], "unknown status 'lost'"),
        (["runs", "list", "--since", "soon"], "--since 'soon': give an age"),
        (["runs", "step", "nope", "x"], "error: no run 'nope'"),
        (["submit", "missing.yaml"], "no such recipe file"),
        (
            ["runs", "list", "--database-url", "postgresql://u:pw@127.0.0.1:1/x"],
            "cannot use the run store 'postgresql://***@127.0.0.1:1/x'",
        ),
    ],
)
def test_the_cli_says_bad_input_with_exit_2(
    tmp_path: Path, url: str, args: list[str], message: str
) -> None:
    write_ledger_recipe(tmp_path)
    RunStore(url, create=True).close()
    if "--database-url" not in args:
        args = [*args, "--database-url", url]
    done = minions(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    assert "pw" not in done.stderr


def test_the_cli_end_to_end(tmp_path: Path, url: str) -> None:
    recipe = write_ledger_recipe(tmp_path)
    submitted = minions("submit", str(recipe), "-i", "tag=cli", "--json", "--database-url", url)
    assert submitted.returncode == 0, submitted.stderr
    said = json.loads(submitted.stdout)
    run_id = said["run_id"]
    assert said == {"run_id": run_id, "created": True}
    keyed = ("submit", str(recipe), "-i", "tag=cli", "--idempotency-key", "x", "--json")
    first, again = (minions(*keyed, "--database-url", url) for _ in range(2))
    assert (first.returncode, again.returncode) == (0, 0)
    made, found = json.loads(first.stdout), json.loads(again.stdout)
    assert (made["created"], found) == (True, {"run_id": made["run_id"], "created": False})
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        followed = minions("runs", "events", run_id, "--follow", "--json", "--database-url", url)
    lines = [json.loads(line) for line in followed.stdout.splitlines()]
    assert [e["seq"] for e in lines] == list(range(1, len(lines) + 1))
    assert lines[-1]["kind"] == "run_completed"
    after = minions(
        "runs", "events", run_id, "--after", str(len(lines) - 1), "--json", "--database-url", url
    )
    assert [json.loads(x)["seq"] for x in after.stdout.splitlines()] == [len(lines)]
    shown = json.loads(minions("runs", "show", run_id, "--json", "--database-url", url).stdout)
    assert shown["status"] == "completed"
    assert [s["step_id"] for s in shown["steps"]] == STEPS
    listed = minions("runs", "list", "--status", "completed", "--database-url", url)
    assert run_id in listed.stdout
    text = minions("runs", "show", run_id, "--database-url", url).stdout
    assert f"run {run_id}: completed (ledger)" in text


APPROVAL = """\
id: gated
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - {id: before, tool: mark, params: {run: "{{ inputs.tag }}", step: before}}
  - id: ship
    depends_on: [before]
    tool: mark
    params: {run: "{{ inputs.tag }}", step: ship}
    requires_approval: true
"""


async def waiting_call(store: RunStore, run_id: str) -> str:
    for _ in range(600):
        record = await store.get(run_id)
        if record.status == "waiting" and record.approvals:
            return record.approvals[0].call_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run never waited: {record.status}")


async def test_a_run_waits_durably_for_approval_across_a_worker_restart(
    tmp_path: Path, url: str
) -> None:
    write_ledger_recipe(tmp_path)
    recipe = tmp_path / "gated.yaml"
    recipe.write_text(APPROVAL)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "g"})
    first = worker(url, tmp_path, "w1", ledger)
    process = first.__enter__()
    call_id = await waiting_call(store, run_id)
    assert call_id == "ship#1/ship-call"
    [approval] = (await store.get(run_id)).approvals
    assert (approval.tool, approval.arguments) == (
        "mark",
        {"run": "g", "step": "ship", "seconds": 0.0},
    )
    process.kill()  # the wait survives the worker
    with worker(url, tmp_path, "w1", ledger):
        assert await waiting_call(store, run_id) == call_id
        await store.approve(run_id)
        assert await finished(store, run_id) == "completed"
    assert [step for _, step, _ in ledger_lines(ledger)] == ["before", "ship"]
    kinds = [e.kind for e in await store.events(run_id)]
    assert "approval_requested" in kinds
    assert "approval_resolved" in kinds
    with pytest.raises(RunStateError, match="waits for no approval"):
        await store.approve(run_id)


async def test_a_rejected_call_fails_the_tool_step_with_the_reason(
    tmp_path: Path, url: str
) -> None:
    write_ledger_recipe(tmp_path)
    recipe = tmp_path / "gated.yaml"
    recipe.write_text(APPROVAL)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "r"})
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        call_id = await waiting_call(store, run_id)
        with pytest.raises(RunStateError, match="does not wait for call 'other'"):
            await store.approve(run_id, "other")
        done = minions(
            "runs", "approve", run_id, call_id, "--reject", "not today", "--database-url", url
        )
        assert done.returncode == 0, done.stderr
        assert await finished(store, run_id) == "failed"
    record = await store.get(run_id)
    assert "not today" in (record.error or "")
    assert [step for _, step, _ in ledger_lines(tmp_path / "ledger.txt")] == ["before"]
    # Who decided: the command's user, in the approval, its event and `runs show`.
    [approval] = record.approvals
    assert (approval.decided_by or "").startswith("cli")
    resolved = [e for e in await store.events(run_id) if isinstance(e, ApprovalResolved)]
    assert [e.actor for e in resolved] == [approval.decided_by]
    shown = minions("runs", "show", run_id, "--database-url", url).stdout
    assert f"rejected: not today (by {approval.decided_by})" in shown


async def test_a_live_worker_recovers_the_runs_of_a_worker_killed_for_good(
    tmp_path: Path, url: str
) -> None:
    recipe = write_ledger_recipe(tmp_path, seconds=0.3)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    run_ids = [(await store.submit(recipe, {"tag": f"m{i}"}))[0] for i in range(6)]
    with worker(url, tmp_path, "w1", ledger) as doomed, worker(url, tmp_path, "w2", ledger):

        async def doomed_is_busy() -> bool:
            runs = [await store.get(r) for r in run_ids]
            return any(r.executor_id == "w1" and r.status == "running" for r in runs)

        for _ in range(600):
            if await doomed_is_busy():
                break
            await asyncio.sleep(0.05)
        doomed.kill()  # never comes back
        statuses = [await finished(store, r, within=120) for r in run_ids]
    assert statuses == ["completed"] * 6
    for run_id in run_ids:
        events = await store.events(run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].kind == "run_completed"
    lines = ledger_lines(ledger)
    for i in range(6):
        steps = [step for run, step, _ in lines if run == f"m{i}"]
        assert sorted(set(steps)) == sorted(STEPS)
        assert all(steps.count(s) <= 2 for s in STEPS)  # at most the step in flight twice


async def test_a_run_taken_from_the_queue_by_a_worker_that_died_before_starting_it(
    tmp_path: Path,
) -> None:
    """The dead worker had dequeued the run (pending in DBOS) but not started it (still
    `queued` in minions' tables): a live worker recovers it all the same."""
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    hold = tmp_path / "hold"
    hold.touch()
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "q"})
    ledger = tmp_path / "ledger.txt"
    with worker(url, tmp_path, "w1", ledger, HOLD_BEFORE_CLAIM=str(hold)) as stuck:
        await until(Path(f"{hold}.reached").exists)
        stuck.kill()
    assert (await store.get(run_id)).status == "queued"
    with worker(url, tmp_path, "w2", ledger):
        assert await finished(store, run_id, within=120) == "completed"
    assert [step for _, step, _ in ledger_lines(ledger)] == STEPS


async def test_a_run_queued_by_an_older_minions_is_run_by_todays_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the durable format had its own version, DBOS's application version was the
    package's: a run queued under one is taken over by a worker of today (an upgrade strands
    nothing)."""
    from minions.runs import _queue

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    monkeypatch.setattr(_queue, "APP_VERSION", "minions-0.0.1")
    old, _ = await store.submit(recipe, {"tag": "old"})
    monkeypatch.undo()
    store.close()
    store = RunStore(url)
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        assert await finished(store, old) == "completed"
    assert (await store.get(old)).attempt == 2
    # Its log says why it was queued again, then that it started (once).
    said = await store.events(old)
    assert [e.kind for e in said][:2] == ["run_requeued", "run_started"]
    requeued = said[0]
    assert isinstance(requeued, RunRequeued)
    assert (requeued.attempt, requeued.by) == (2, "w1")
    assert "minions-0.0.1" in requeued.reason


async def test_a_worker_says_which_runs_belong_to_a_newer_minions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run queued by a newer durable format is not taken, and a worker that starts says
    so instead of leaving it stranded in silence."""
    from minions.runs import _queue

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    monkeypatch.setattr(_queue, "APP_VERSION", "minions-durable-99")
    new, _ = await store.submit(recipe, {"tag": "new"})
    monkeypatch.undo()
    store.close()
    store = RunStore(url)
    current, _ = await store.submit(recipe, {"tag": "now"})
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt") as process:
        assert await finished(store, current) == "completed"
        said = process.log.read_text()
    assert "1 queued or unfinished run(s) belong to minions-durable-99, a newer minions" in said
    assert new in said
    assert (await store.get(new)).status == "queued"


async def test_a_worker_traces_the_runs_it_executes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`minions worker --otel` hands its tracer provider to the runs: a durable run is an
    `invoke_workflow` span with a child per step, as in the foreground."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger.txt"))
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(write_ledger_recipe(tmp_path), {"tag": "t"})
    from minions._tracing.tracer import RunTracer

    await run_here(url, run_id, tracer=RunTracer(provider))
    assert (await store.get(run_id)).status == "completed"
    spans = exporter.get_finished_spans()
    (run,) = [s for s in spans if s.name == "invoke_workflow ledger"]
    steps = [s for s in spans if s.name.startswith("invoke_agent ")]
    assert [s.name for s in steps] == [f"invoke_agent {step}" for step in STEPS]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in steps)
    assert run.attributes is not None
    assert run.attributes["minions.run.id"] == run_id


def test_thousands_of_events_in_one_write_are_stored_in_order(url: str) -> None:
    """A big loop's events can reach the store at once: more than one statement holds."""
    from minions.events import RunCompleted, StepStarted
    from minions.runs import _checkpoints, _events, _leases, _runs
    from minions.runs._checkpoints import Checkpoint
    from minions.runs._db import Database

    database = Database(url, create=True)
    insert_run(database, "r")
    start = _leases.claim(
        database, "r", attempt=1, holder="h", executor_id="e", lease_until=1e12, now=0.0
    )
    assert isinstance(start, _leases.Start)
    step = Checkpoint(name="a", visit=1, status="completed", data={})
    rows = [_events.row_of(StepStarted(run_id="r", step_id="a", seq=i)) for i in range(1, 2501)]
    _leases.append(database, start.lease, after=0, events=rows, checkpoint=step)
    last = _events.row_of(RunCompleted(run_id="r", seq=2501))
    _leases.append(database, start.lease, after=2500, events=[last])
    assert [e.seq for e in _events.after(database, "r")] == list(range(1, 2502))
    assert list(_checkpoints.saved(database, "r")) == [("a", 1)]
    assert _runs.head(database, "r") == _runs.Head(status="running", last_seq=2501)
    database.close()


def test_a_store_survives_its_postgres_connections_being_dropped(
    postgres: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooled connection that rested is checked before use: one the server dropped (a
    restart, an idle timeout) is replaced, and the read or write goes through."""
    import psycopg

    from minions.events import RunStarted
    from minions.runs import _db, _events, _leases, _runs

    url = fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")
    store = _db.Database(url, create=True)
    insert_run(store, "r")
    start = _leases.claim(
        store, "r", attempt=1, holder="h", executor_id="e", lease_until=1e12, now=0.0
    )
    assert isinstance(start, _leases.Start)
    monkeypatch.setattr(_db, "IDLE_PING", -1.0)  # every connection counts as rested
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(postgres, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
    assert _runs.get(store, "r").status == "running"
    first = _events.row_of(RunStarted(run_id="r", seq=1, recipe_id="x"))
    _leases.append(store, start.lease, after=0, events=[first])
    assert [e.seq for e in _events.after(store, "r")] == [1]
    store.close()


async def test_a_durable_run_calls_the_tools_of_its_recipes_mcp_server(tmp_path: Path) -> None:
    """A worker connects to the MCP servers of the run's recipe (a stdio child here), once
    per run, and a tool step calls through it."""
    server = Path(__file__).parent / "mcp_test_server.py"
    log = tmp_path / "calls.txt"
    recipe = tmp_path / "mcp.yaml"
    recipe.write_text(
        "id: mcp_durable\n"
        "mcp_servers:\n"
        f"  test: {{command: {json.dumps(sys.executable)}, args: [{json.dumps(str(server))}],"
        f" env: {{MCP_CALL_LOG: {json.dumps(str(log))}}}}}\n"
        "steps:\n"
        "  - {id: one, tool: test.echo, params: {text: hello}}\n"
        "  - {id: two, depends_on: [one], tool: test.add, params: {a: 2, b: 3}}\n"
    )
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe)
    await run_here(url, run_id)
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    assert [s.output for s in record.steps] == ["hello", 5]
    assert log.read_text() == "echo hello\n"


def test_recipe_graphs_are_kept_by_their_text_within_a_bound_of_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from minions.runs import _snapshot

    monkeypatch.setattr(_snapshot, "STEPS_KEPT", 6)
    monkeypatch.setattr(_snapshot, "_graphs", _snapshot._Graphs())
    parsed: list[str] = []
    parse = _snapshot._parse_graph

    def counted(text: str) -> tuple[_snapshot.RecipeNode, ...]:
        parsed.append(text)
        return parse(text)

    monkeypatch.setattr(_snapshot, "_parse_graph", counted)

    def recipe(name: str, steps: int = 1) -> str:
        return f"id: {name}\nsteps:\n" + "".join(
            f"  - {{id: s{i}, goal: Go.}}\n" for i in range(steps)
        )

    def graph(text: str) -> list[str]:
        return [node.id for node in _snapshot.recipe_graph(text)]

    one, two, three, big = recipe("one"), recipe("two", 2), recipe("three"), recipe("big", 6)
    assert graph(one) == graph(one) == ["s0"]
    assert graph(two) == ["s0", "s1"]
    assert parsed == [one, two]  # each parsed once: 2 + 3 of 6 steps kept
    assert graph(big) == graph(big) == [f"s{i}" for i in range(6)]
    assert parsed[2:] == [big, big]  # larger than the bound: never kept
    assert graph(one) == ["s0"]  # read last: `two` is the least recently read
    assert graph(three) == ["s0"]  # 2 + 3 + 2 > 6: `two` goes
    assert graph(one) == graph(three) == ["s0"]
    assert graph(two) == ["s0", "s1"]
    assert parsed[4:] == [three, two]
    assert _snapshot.recipe_graph("id: x\nsteps: [oops") == ()  # not a recipe: no steps
