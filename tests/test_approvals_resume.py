"""A parked run resumes at its waiting call (issue 37): the step that waited keeps its state
when its run parks (in the park's transaction), and when a decision queues the run again it
goes on from there: no model call is made again for the turns before the call, the approved
call runs once (a rejected one gives the model the reason), the other calls of that turn
that were made are not made again, and the run's usage stays the sum of its model calls. A
state over the limit is not kept: the step starts again from its start, and says why."""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from runs_helpers import WorkerProcess, finished, run_here, until, watched

from minions import Message, ModelCallResponse, Prompt, ToolCall, Usage
from minions.events import (
    ApprovalResolved,
    Event,
    ModelCallCompleted,
    StepStarted,
    ToolCallStarted,
)
from minions.runs import RunStore, _runner
from minions.runs import _approvals as approvals
from minions.runs import _leases as leases
from minions.runs._db import Database
from minions.runs._tables import SCHEMA_VERSION
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest, FunctionModel

TOOLS = '''\
import asyncio
import os
from pathlib import Path

from minions import tool
from minions.runs import RunStore
from minions.tools import ToolContext


def _effect(line: str) -> None:
    with open(Path(__file__).parent / "effects.txt", "a") as effects:
        effects.write(line + "\\n")


@tool
async def probe(ctx: ToolContext[None], target: str) -> str:
    """Look at a target before a deploy (done once its sibling call asked for a decision: the
    run parks while this call runs)."""
    store = RunStore(os.environ["RESUME_STORE"])
    try:
        while not (await store.get(ctx.run_id)).approvals:
            await asyncio.sleep(0.01)
    finally:
        store.close()
    _effect(f"probe {target}")
    return f"{target} is ready"


@tool(requires_approval=True)
async def deploy(target: str) -> str:
    """Deploy to a target (held after its effect while the file GATE names exists)."""
    _effect(f"deploy {target}")
    gate = os.environ.get("GATE")
    while gate and os.path.exists(gate):
        await asyncio.sleep(0.02)
    return f"deployed {target}"
'''

RECIPE = """\
id: release
tools: [resume_tools]
steps:
  - id: ship
    goal: Deploy to prod.
    tools: [probe, deploy]
"""


def release(folder: Path) -> Path:
    (folder / "resume_tools.py").write_text(TOOLS)
    path = folder / "release.yaml"
    path.write_text(RECIPE)
    return path


def effects(folder: Path) -> list[str]:
    path = folder / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


def asking(target: str, n: int = 1) -> ModelCallResponse:
    """An answer asking for a probe and a deploy of `target`, at once (call ids numbered
    `n`)."""
    calls = [
        ToolCall(id=f"probe-{n}", name="probe", arguments={"target": target}),
        ToolCall(id=f"deploy-{n}", name="deploy", arguments={"target": target}),
    ]
    return ModelCallResponse(
        message=Message.assistant("", calls), usage=Usage.of_call(50, 7), finish_reason="tool_calls"
    )


def changing_model() -> FunctionModel:
    """A model whose answer to the goal differs each time it is asked (the target is
    numbered by its requests); told the results, it says what it was told."""

    def answer(prompt: Prompt) -> ModelCallResponse | str:
        last = prompt.messages[-1]
        if last.role == "tool":
            return "Told: " + " | ".join(m.content for m in prompt.messages if m.role == "tool")
        n = len(model.requests)
        return asking(f"prod-{n}", n)

    model = FunctionModel(answer)
    return model


def usage_of(logged: list[Event]) -> tuple[int, int, int]:
    """The tokens and calls of the run's model calls, as its events tell them."""
    done = [e for e in logged if isinstance(e, ModelCallCompleted)]
    return (
        sum(e.usage.prompt_tokens for e in done),
        sum(e.usage.completion_tokens for e in done),
        len(done),
    )


@pytest.fixture
def url(url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The store (SQLite, Postgres), where the probe tool of this module looks too."""
    monkeypatch.setenv("RESUME_STORE", url)
    return url


async def waiting(folder: Path, url: str, model: FunctionModel) -> tuple[RunStore, str]:
    """A run of the release recipe, run here with `model` until it parks at the deploy."""
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(release(folder))
    await run_here(url, run_id, model=model)
    return store, run_id


async def test_an_approved_call_goes_on_at_the_call_and_asks_the_model_once_per_turn(
    tmp_path: Path, url: str
) -> None:
    model = changing_model()
    # Parked once the probe beside the call is done.
    store, run_id = await waiting(tmp_path, url, model)
    record = await store.get(run_id)
    assert record.status == "waiting"
    assert [r.messages[-1].role for r in model.requests] == ["user"]
    assert effects(tmp_path) == ["probe prod-1"]
    await store.approve(run_id, actor="alice")
    await run_here(url, run_id, 2, model=model)
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    # One request per turn in all: the turn that waited was not asked again.
    assert len(model.requests) == 2
    assert effects(tmp_path) == ["probe prod-1", "deploy prod-1"]
    told = model.requests[1].messages
    assert [(m.tool_call_id, m.content) for m in told if m.role == "tool"] == [
        ("probe-1", "prod-1 is ready"),
        ("deploy-1", "deployed prod-1"),
    ]
    assert record.output == "Told: prod-1 is ready | deployed prod-1"
    logged = await store.events(run_id)
    started = [e for e in logged if isinstance(e, StepStarted)]
    assert [(e.resumed_at, e.restarted) for e in started] == [
        (None, None),
        ("ship#1/deploy-1", None),
    ]
    # Nothing of the turn before is said again: one model call per turn, one start of the
    # probe; the waiting call starts again and finds its decision.
    assert [e.name for e in logged if isinstance(e, ToolCallStarted)] == [
        "probe",
        "deploy",
        "deploy",
    ]
    [resolved] = [e for e in logged if isinstance(e, ApprovalResolved)]
    assert (resolved.approved, resolved.actor) == (True, "alice")
    # The run's usage, and its step's, is the sum of its model calls.
    prompt, completion, calls = usage_of(logged)
    assert calls == 2
    assert record.usage["prompt_tokens"] == prompt
    assert record.usage["completion_tokens"] == completion
    assert record.usage["calls"] == calls
    [step] = record.steps
    assert step.usage["calls"] == calls
    assert step.usage["prompt_tokens"] == prompt
    store.close()


async def test_a_rejected_call_gives_the_model_the_reason_and_it_goes_on(
    tmp_path: Path, url: str
) -> None:
    model = changing_model()
    store, run_id = await waiting(tmp_path, url, model)
    await store.approve(run_id, approved=False, reason="not on a Friday", actor="bob")
    await run_here(url, run_id, 2, model=model)
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    assert len(model.requests) == 2
    assert effects(tmp_path) == ["probe prod-1"]  # the deploy was never made
    results = [m for m in model.requests[1].messages if m.role == "tool"]
    assert results[0].content == "prod-1 is ready"
    assert results[1].content.startswith(
        "A person rejected this call to 'deploy': not on a Friday."
    )
    assert record.output is not None
    assert "not on a Friday" in str(record.output)
    store.close()


async def test_a_state_over_the_limit_is_not_kept_and_the_step_starts_again(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What happened before: the step runs again from its start (the model is asked again;
    this one answers the same, so its call finds its decision), and its log says why."""
    monkeypatch.setattr(_runner, "STATE_LIMIT", 300)

    def answer(prompt: Prompt) -> ModelCallResponse | str:
        return "Done." if prompt.messages[-1].role == "tool" else asking("prod")

    model = FunctionModel(answer)
    store, run_id = await waiting(tmp_path, url, model)
    await store.approve(run_id, actor="alice")
    await run_here(url, run_id, 2, model=model)
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    assert len(model.requests) == 3  # the first turn asked again
    # The probe made again (in parallel with the deploy, decided by now: in either order).
    assert sorted(effects(tmp_path)) == ["deploy prod", "probe prod", "probe prod"]
    started = [e for e in await store.events(run_id) if isinstance(e, StepStarted)]
    assert started[1].resumed_at is None
    assert started[1].restarted is not None
    assert "over the 300 a parked run keeps" in started[1].restarted
    assert "'ship#1/deploy-1'" in started[1].restarted
    store.close()


async def test_sequential_calls_after_the_waiting_one_run_once_it_is_decided(
    tmp_path: Path, url: str
) -> None:
    """In the model's order: the probe runs first (before the deploy asks), the calls after
    the deploy only once the run goes on."""
    (tmp_path / "resume_tools.py").write_text(TOOLS)
    recipe = tmp_path / "release.yaml"
    recipe.write_text(RECIPE.replace("tools: [probe, deploy]", SEQUENTIAL))

    def answer(prompt: Prompt) -> ModelCallResponse | str:
        if prompt.messages[-1].role == "tool":
            return "Done."
        calls = [
            ToolCall(id="a", name="deploy", arguments={"target": "a"}),
            ToolCall(id="b", name="deploy", arguments={"target": "b"}),
        ]
        return ModelCallResponse(message=Message.assistant("", calls), usage=Usage.of_call(9, 9))

    model = FunctionModel(answer)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe)
    await run_here(url, run_id, model=model)
    assert [a.call_id for a in (await store.get(run_id)).approvals] == ["ship#1/a"]
    await store.approve(run_id, actor="alice")
    await run_here(url, run_id, 2, model=model)  # `a` is made, `b` waits: parked again
    record = await store.get(run_id)
    assert record.status == "waiting"
    assert [a.call_id for a in record.approvals] == ["ship#1/a", "ship#1/b"]
    assert effects(tmp_path) == ["deploy a"]
    await store.approve(run_id, actor="alice")
    await run_here(url, run_id, 3, model=model)
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    assert effects(tmp_path) == ["deploy a", "deploy b"]
    assert len(model.requests) == 2
    started = [e.resumed_at for e in await store.events(run_id) if isinstance(e, StepStarted)]
    assert started == [None, "ship#1/a", "ship#1/b"]
    store.close()


SEQUENTIAL = "tools: [deploy]\n    config: {sequential_tool_calls: true}"


# -- the park's transaction --------------------------------------------------------------------


def claimed(database: Database, run_id: str) -> leases.Lease:
    now = time.time()
    start = leases.claim(
        database, run_id, attempt=1, holder="h", executor_id="w", lease_until=now + 60, now=now
    )
    assert isinstance(start, leases.Start)
    return start.lease


def state_of(database: Database, run_id: str) -> list[Any]:
    with database.read() as db:
        return [
            (row.call_id, row.resume)
            for row in db.execute(
                sa.text(
                    "SELECT call_id, resume FROM minions_approvals WHERE run_id = :run "
                    "ORDER BY call_id"
                ),
                {"run": run_id},
            )
        ]


async def test_the_state_is_kept_in_the_parks_transaction_or_not_at_all(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(url, create=True)
    database = Database(url)
    run_id, _ = await store.submit(release(tmp_path))
    lease = claimed(database, run_id)
    for call in ("ship#1/a", "ship#1/b"):
        leases.request_approval(
            database, lease, call_id=call, step_id="ship", tool="deploy", arguments={}
        )
    kept = approvals.Resume(scope="ship#1", seq=0, state={"any": "thing"}).text()

    def fails(db: sa.Connection, run_id: str) -> None:
        raise OSError("the process died here")

    with monkeypatch.context() as patched:
        patched.setattr(leases, "_parked", fails)
        with pytest.raises(OSError):
            leases.park(database, lease, call_id="ship#1/b", resume=kept)
    # Neither the state nor the park: the holder still holds the run.
    assert state_of(database, run_id) == [("ship#1/a", None), ("ship#1/b", None)]
    record = await store.get(run_id)
    assert record.status == "running"
    assert approvals.kept(database, run_id) == []
    assert leases.park(database, lease, call_id="ship#1/b", resume=kept) is None
    assert (await store.get(run_id)).status == "waiting"
    assert state_of(database, run_id) == [("ship#1/a", None), ("ship#1/b", kept)]
    [found] = approvals.kept(database, run_id)
    assert (found.scope, found.state) == ("ship#1", {"any": "thing"})
    # A person's read of the run's calls does not carry the state.
    assert {a.call_id for a in (await store.get(run_id)).approvals} == {"ship#1/a", "ship#1/b"}
    database.close()
    store.close()


async def test_a_state_kept_before_the_run_ended_is_not_used_when_it_is_resumed(
    tmp_path: Path, url: str
) -> None:
    store = RunStore(url, create=True)
    database = Database(url)
    run_id, _ = await store.submit(release(tmp_path))
    lease = claimed(database, run_id)
    leases.request_approval(
        database, lease, call_id="ship#1/a", step_id="ship", tool="deploy", arguments={}
    )
    kept = approvals.Resume(scope="ship#1", seq=0, state={}).text()
    assert leases.park(database, lease, call_id="ship#1/a", resume=kept) is None
    assert len(approvals.kept(database, run_id)) == 1
    await store.cancel(run_id, wait=0, actor="carol")  # its log ends after the park
    assert approvals.kept(database, run_id) == []
    database.close()
    store.close()


def test_a_store_of_schema_12_migrates_to_keep_states(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    Database(f"sqlite:///{path}", create=True).close()
    with sqlite3.connect(path) as db:  # what schema 12 had: no state at a call
        db.execute("ALTER TABLE minions_approvals DROP COLUMN resume")
        db.execute(
            "INSERT INTO minions_approvals (run_id, call_id, step_id, tool, arguments, "
            "requested_at) VALUES ('r', 'c', 's', 't', '{}', 1.0)"
        )
        db.execute("UPDATE minions_meta SET value = '12' WHERE key = 'schema_version'")
    store = Database(f"sqlite:///{path}")
    assert approvals.kept(store, "r") == []
    assert approvals.get(store, "r", "c") is not None
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM minions_meta").fetchone()[0] == str(SCHEMA_VERSION)
        columns = {row[1] for row in db.execute("PRAGMA table_info(minions_approvals)")}
    assert "resume" in columns


# -- the proof: a worker killed while the run waits ------------------------------------------------


def counting_server() -> FakeOpenAIServer:
    """A model server whose answer to the goal differs each time it is asked (the target
    numbered by its requests); told the results, it answers in text."""
    count = itertools.count(1)
    lock = threading.Lock()

    def reply(request: FakeRequest) -> FakeReply:
        if request.last_message.get("role") == "tool":
            return FakeReply.text("Deployed.")
        with lock:
            n = next(count)
        target = {"target": f"prod-{n}"}
        return FakeReply.calls(("probe", target), ("deploy", target))

    return FakeOpenAIServer(reply)


def worker_env(server: FakeOpenAIServer, url: str) -> dict[str, str]:
    """What the worker processes of these tests run with: the server's model, the store."""
    return {
        "MINIONS_MODEL": f"openai-compatible:fake-model@{server.url}",
        "OPENAI_API_KEY": "sk-test",
        "RESUME_STORE": url,
    }


@pytest.mark.slow
async def test_a_run_waiting_with_its_worker_killed_goes_on_at_the_call(
    tmp_path: Path, url: str
) -> None:
    recipe = release(tmp_path)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    with counting_server() as server:
        env = worker_env(server, url)
        run_id, _ = await store.submit(recipe)
        first = WorkerProcess(url, tmp_path, "w1", ledger, **env)
        try:
            await parked(store, url, run_id)
        finally:
            first.kill()
        await store.approve(run_id, actor="alice")  # no worker alive
        with watched(WorkerProcess(url, tmp_path, "w2", ledger, **env)):
            assert await finished(store, run_id) == "completed"
        asked = [r for r in server.requests if r.path.endswith("/chat/completions")]
    assert len(asked) == 2  # one per turn, over both workers
    assert effects(tmp_path) == ["probe prod-1", "deploy prod-1"]
    logged = await store.events(run_id)
    record = await store.get(run_id)
    [approval] = record.approvals
    assert approval.arguments == {"target": "prod-1"}
    assert [e.resumed_at for e in logged if isinstance(e, StepStarted)] == [
        None,
        approval.call_id,
    ]
    prompt, completion, calls = usage_of(logged)
    assert (record.usage["prompt_tokens"], record.usage["calls"]) == (prompt, calls)
    assert record.usage["completion_tokens"] == completion
    store.close()


@pytest.mark.slow
async def test_a_step_that_went_on_at_its_call_goes_on_there_again_after_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its worker killed after the approved call's effect, before the step ended: the run is
    taken over and the step goes on at the same call again (the call made again, as work
    inside an unfinished step is: at least once), not from its start."""
    url = f"sqlite:///{tmp_path / 'takeover.db'}"
    monkeypatch.setenv("RESUME_STORE", url)
    recipe = release(tmp_path)
    ledger, gate = tmp_path / "ledger.txt", tmp_path / "gate"
    store = RunStore(url, create=True)
    with counting_server() as server:
        env = {**worker_env(server, url), "GATE": str(gate)}
        run_id, _ = await store.submit(recipe)
        gate.touch()
        first = WorkerProcess(url, tmp_path, "w1", ledger, **env)
        try:
            await parked(store, url, run_id)
            await store.approve(run_id, actor="alice")
            # Killed after the deploy's effect, as it is held before its result.
            await until(lambda: "deploy prod-1" in effects(tmp_path))
        finally:
            first.kill()
        gate.unlink()
        with watched(WorkerProcess(url, tmp_path, "w2", ledger, **env)):
            assert await finished(store, run_id) == "completed"
        asked = [r for r in server.requests if r.path.endswith("/chat/completions")]
    assert len(asked) == 2
    assert effects(tmp_path) == ["probe prod-1"] + ["deploy prod-1"] * 2
    [approval] = (await store.get(run_id)).approvals
    resumed = [e.resumed_at for e in await store.events(run_id) if isinstance(e, StepStarted)]
    # (A killed worker's last events may not have been stored: at least the takeovers'.)
    assert resumed[0] is None
    assert resumed[1:] in ([approval.call_id], [approval.call_id] * 2)
    store.close()


async def parked(store: RunStore, url: str, run_id: str, within: float = 60) -> None:
    """Wait until the run waits for a decision, given back to the store (held by nobody)."""
    import asyncio

    database = Database(url)
    try:
        for _ in range(int(within / 0.05)):
            record = await store.get(run_id)
            with database.read() as db:
                holder = db.execute(
                    sa.text("SELECT holder FROM minions_runs WHERE run_id = :r"), {"r": run_id}
                ).scalar_one()
            if record.status == "waiting" and holder is None:
                return
            await asyncio.sleep(0.05)
    finally:
        database.close()
    raise AssertionError(f"run {run_id} was never parked: {record}")


LOOP = """\
id: releases
tools: [resume_tools]
inputs: {targets: {type: array}}
steps:
  - id: each
    loop: "{{ inputs.targets }}"
    parallel: 1
    goal: "Deploy to {{ loop.item }}."
    tools: [deploy]
"""


async def test_a_loop_item_goes_on_at_its_call(tmp_path: Path, url: str) -> None:
    """An item of a run's loop step waits: the items done are not run again (their
    checkpoints), the waiting one goes on at its call, and the next item does not start
    while the run parks."""
    (tmp_path / "resume_tools.py").write_text(TOOLS)
    recipe = tmp_path / "releases.yaml"
    recipe.write_text(LOOP)

    def answer(prompt: Prompt) -> ModelCallResponse | str:
        last = prompt.messages[-1]
        if last.role == "tool":
            return f"Done: {last.content}."
        target = last.content.removeprefix("Deploy to ").rstrip(".")
        call = ToolCall(id=f"d-{len(model.requests)}", name="deploy", arguments={"target": target})
        return ModelCallResponse(message=Message.assistant("", [call]), usage=Usage.of_call(5, 5))

    model = FunctionModel(answer)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"targets": ["a", "b"]})
    for attempt in (1, 2, 3):
        await run_here(url, run_id, attempt, model=model)
        if attempt < 3:
            assert (await store.get(run_id)).status == "waiting"
            await store.approve(run_id, actor="alice")
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    assert effects(tmp_path) == ["deploy a", "deploy b"]
    # Two turns per item, each asked once (and the second item not started while the first
    # waited: the run parked before it could).
    assert [(r.scope, r.messages[-1].role) for r in model.requests] == [
        ("each#1[0]", "user"),
        ("each#1[0]", "tool"),
        ("each#1[1]", "user"),
        ("each#1[1]", "tool"),
    ]
    started = [
        (e.step_id, e.resumed_at) for e in await store.events(run_id) if e.kind == "step_started"
    ]
    assert ("each[0]", "each#1[0]/d-1") in started
    assert ("each[1]", "each#1[1]/d-3") in started
    store.close()


async def test_a_turn_that_was_asked_again_goes_on_with_its_note(tmp_path: Path, url: str) -> None:
    """The answer that asked for the call came after a re-ask (the model's first answer was
    unusable): the step goes on in that turn as it was, the note kept once, its re-asks
    counted."""

    def answer(prompt: Prompt) -> Any:
        last = prompt.messages[-1]
        if last.role == "tool":
            return "Done."
        if len(model.requests) == 1:
            return [("deploy", '{"target": ')]  # not JSON: the step asks again, with a note
        return [("deploy", {"target": "prod"})]

    model = FunctionModel(answer)
    store = RunStore(url, create=True)
    (tmp_path / "resume_tools.py").write_text(TOOLS)
    recipe = tmp_path / "release.yaml"
    recipe.write_text(RECIPE.replace("tools: [probe, deploy]", "tools: [deploy]"))
    run_id, _ = await store.submit(recipe)
    await run_here(url, run_id, model=model)
    await store.approve(run_id, actor="alice")
    await run_here(url, run_id, 2, model=model)
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    assert len(model.requests) == 3
    last = model.requests[2].messages
    assert [m.role for m in last] == ["user", "user", "assistant", "tool"]
    assert "were not valid JSON" in last[1].content
    assert effects(tmp_path) == ["deploy prod"]
    logged = await store.events(run_id)
    turns = [(e.turn, e.attempt) for e in logged if e.kind == "model_call_started"]
    assert turns == [(1, 1), (1, 2), (2, 1)]
    store.close()
