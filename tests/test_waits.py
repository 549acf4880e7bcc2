"""Waits are events from their first moment, and durations say work and waiting apart: a model
call behind a saturated endpoint (behind its own process's callers too) is told at once; a
step's and a run's waits (for an endpoint's limits, for a person's approval) are counted apart
from their work, in executions, events, the store and the CLI's step table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runs_helpers import until

from minions import AgentExecutor, AgentRecipe, DefaultStep, StepExecution, tool
from minions._fold import RunStates
from minions._step import waits as waits_module
from minions._step.waits import RunWaits, Waits
from minions.cli._show import shown_steps, steps_table
from minions.events import (
    ApprovalRequested,
    Event,
    ModelCallStarted,
    ModelCallWaiting,
    RunCompleted,
    StepCompleted,
)
from minions.models import EndpointLimit, Limits, LocalLimiter
from minions.models._limits import EndpointWait
from minions.recipes import parse_recipe
from minions.runs._async import AsyncDatabase
from minions.runs._db import Database
from minions.runs._limiter import StoreLimiter
from minions.testing import FakeOpenAIServer, FakeReply, ScriptedModel
from minions.tools import ApprovalDecision, ApprovalRequest

ONE_STEP = "id: ask\nsteps:\n  - {id: ask, goal: say hi}\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(waits_module, "monotonic", clock)
    return clock


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[AsyncDatabase]:
    adapter = AsyncDatabase(Database(f"sqlite:///{tmp_path / 'runs.db'}", create=True))
    try:
        yield adapter
    finally:
        adapter.close()


# -- told at once --------------------------------------------------------------------------------


async def test_a_caller_behind_its_own_process_line_is_told_at_once(store: AsyncDatabase) -> None:
    url = "http://127.0.0.1:9/v1"
    limits = Limits(endpoints=(EndpointLimit(match=url, max_concurrent=1),))
    elsewhere = StoreLimiter(store, limits, holder="other-process", lease=10.0)
    here = StoreLimiter(store, limits, holder="this-process", lease=10.0)
    held = await elsewhere.acquire((url, "m"), tokens=1)
    assert held is not None
    first: list[EndpointWait] = []
    second: list[EndpointWait] = []
    head = asyncio.create_task(here.acquire((url, "m"), tokens=1, on_wait=first.append))
    await until(lambda: bool(first))  # the head of this process's line waits in the store's
    behind = asyncio.create_task(here.acquire((url, "m"), tokens=1, on_wait=second.append))
    # Told before anything moved: not when it reaches the head of the line.
    await until(lambda: bool(second))
    assert [w.reason for w in second] == ["max_concurrent"]
    assert not head.done()
    assert not behind.done()
    head.cancel()
    behind.cancel()
    await asyncio.gather(head, behind, return_exceptions=True)
    await here.settle()


async def test_a_step_behind_a_saturated_endpoint_waits_at_once_and_says_work_and_waiting_apart() -> (
    None
):
    events: list[Event] = []
    async with FakeOpenAIServer(lambda _: FakeReply.text("hi")) as server:
        limiter = LocalLimiter(
            Limits(endpoints=(EndpointLimit(match=server.url, max_concurrent=1),))
        )
        held = await limiter.acquire((server.url, "fake-model"), tokens=1)  # saturated
        assert held is not None
        executor = AgentExecutor(model=server.model(), limits=limiter, listeners=[events.append])
        run = asyncio.create_task(executor.execute(parse_recipe(ONE_STEP)))
        await until(lambda: any(isinstance(e, ModelCallWaiting) for e in events))
        assert server.chat_requests == []  # nothing sent: the wait was told before
        kinds = [e.kind for e in events]
        assert kinds[kinds.index("step_started") + 1] == "model_call_waiting"
        limiter.release(held)
        result = await run
    execution = result.step("ask")
    [completed] = [e for e in events if isinstance(e, StepCompleted)]
    [ended] = [e for e in events if isinstance(e, RunCompleted)]
    assert execution.duration is not None
    assert execution.work is not None
    assert 0 < execution.waited <= execution.duration
    assert execution.work == pytest.approx(execution.duration - execution.waited)
    assert completed.waited == execution.waited
    # The run's one step waited: so was the run blocked.
    assert 0 < ended.waited <= ended.duration
    assert result.waited == ended.waited


async def test_a_step_that_never_waits_worked_all_its_time() -> None:
    recipe = parse_recipe(ONE_STEP)
    result = await AgentExecutor(model=ScriptedModel(["hi"])).execute(recipe)
    execution = result.step("ask")
    assert execution.waited == 0.0
    assert execution.work == execution.duration
    assert result.waited == 0.0


@tool(requires_approval=True)
def deploy(target: str) -> str:
    """Deploy to a target."""
    return f"deployed {target}"


async def test_the_wait_for_an_approval_is_waiting_not_work() -> None:
    decided = asyncio.Event()
    events: list[Event] = []

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        await decided.wait()
        return ApprovalDecision(approved=True)

    recipe = AgentRecipe(
        id="ship",
        steps=[DefaultStep("ship", "Deploy to prod.", tools=["deploy"])],
        tools=[deploy],
    )
    model = ScriptedModel([[("deploy", {"target": "prod"})], "Done."])
    executor = AgentExecutor(model=model, approver=approver, listeners=[events.append])
    run = asyncio.create_task(executor.execute(recipe))
    await until(lambda: any(isinstance(e, ApprovalRequested) for e in events))
    decided.set()
    result = await run
    assert result.ok
    assert result.step("ship").waited > 0
    assert 0 < result.waited <= result.duration


# -- the accounting ------------------------------------------------------------------------------


def test_a_run_is_blocked_only_while_every_running_step_waits(clock: Clock) -> None:
    run = RunWaits()
    one, _two = Waits(run), Waits(run)
    run.started()
    run.started()
    one.enter()  # one waits, two works: the run works
    clock.now += 5
    run.ended()  # two ended: every running step waits
    clock.now += 3
    assert run.seconds == 3
    one.leave()
    clock.now += 7
    assert run.seconds == 3
    assert one.seconds == 8


def test_parallel_waits_of_a_step_count_once_and_an_items_waits_are_its_loops(clock: Clock) -> None:
    loop = Waits()
    item_a, item_b = Waits(), Waits()
    item_a.parent = item_b.parent = loop
    item_a.enter()
    clock.now += 2
    item_b.enter()  # both wait at once: the loop waits once
    clock.now += 2
    item_a.leave()
    clock.now += 1
    item_b.leave()
    clock.now += 10
    assert (item_a.seconds, item_b.seconds, loop.seconds) == (4, 3, 5)


def test_a_stored_execution_keeps_what_it_waited() -> None:
    execution = StepExecution(step_id="s", started_at=10.0, finished_at=14.0, waited=3.0)
    restored = StepExecution.from_data(execution.to_data())
    assert (restored.waited, restored.work) == (3.0, 1.0)


def test_the_step_table_shows_the_time_waited_and_what_a_step_waits_for() -> None:
    from rich.console import Console

    events: list[Event] = [
        StepStartedAt("a", 1.0),
        StepCompleted(step_id="a", timestamp=5.0, duration=4.0, waited=2.5),
        StepStartedAt("b", 5.0),
        ModelCallWaiting(step_id="b", endpoint="http://gpu/v1"),
    ]
    steps = shown_steps(RunStates.of(events))
    assert [(s.step_id, s.waited, s.waiting) for s in steps] == [
        ("a", 2.5, None),
        ("b", 0.0, "limit"),
    ]
    console = Console(width=200, record=True)
    console.print(steps_table(steps, now=9.0))
    text = console.export_text()
    assert "waited" in text
    assert "2.50s" in text
    assert "waiting for endpoint" in text
    steps = shown_steps(RunStates.of([*events, ModelCallStarted(step_id="b")]))
    assert steps[1].waiting is None


def test_a_followed_runs_progress_line_says_what_its_steps_wait_for() -> None:
    from minions.cli._progress import FollowedRun
    from minions.events import ApprovalRequested, StepStarted

    followed = FollowedRun("r1")
    for event in (
        StepStarted(step_id="each", seq=1),
        StepStarted(step_id="each[0]", seq=2),
        ModelCallWaiting(step_id="each[0]", endpoint="http://gpu/v1", reason="retry_after", seq=3),
        StepStarted(step_id="ask", seq=4),
        ApprovalRequested(step_id="ask", call_id="ask#1/c", name="shout", seq=5),
    ):
        followed(event)
    line = followed.line()
    assert line is not None
    # A loop item's wait is its step's; read from the one fold, as `runs show` reads it.
    assert "each (" in line
    assert "waits for http://gpu/v1 (retry_after)" in line
    assert "waits for approval of shout" in line
    followed(ModelCallStarted(step_id="each[0]", seq=6))
    line = followed.line()
    assert line is not None
    assert "http://gpu/v1" not in line


def StepStartedAt(step_id: str, at: float) -> Event:
    from minions.events import StepStarted

    return StepStarted(step_id=step_id, timestamp=at)
