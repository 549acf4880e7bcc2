"""Eager scheduling: steps start as soon as their own dependencies are done, bounded by
max_parallel_steps; sync steps run alone; fire-and-forget steps hold nobody up."""

from __future__ import annotations

import asyncio
import dataclasses

from agent_helpers import (
    FAST,
    HANG_GUARD,
    Recorder,
    model_calls_started,
    model_of,
    run,
    statuses,
    step,
    step_finished,
)

from minions import AgentExecutor, AgentRecipe, DefaultStep, ModelError, StepStatus
from minions.events import StepCompleted, StepSkipped, StepStarted
from minions.testing import ScriptedModel


async def test_linear_chain_runs_each_step_once_in_order() -> None:
    recorder = Recorder()
    steps = [step("a", "A"), step("b", "B", depends_on=["a"]), step("c", "C", depends_on=["b"])]
    result = await run(steps, recorder=recorder)
    assert result.status is StepStatus.COMPLETED
    assert [e.step_id for e in result.executions] == ["a", "b", "c"]
    assert [e.status for e in result.executions] == [StepStatus.COMPLETED] * 3
    assert result.skipped == ()
    assert [e.step_id for e in recorder.of(StepStarted)] == ["a", "b", "c"]
    assert not recorder.of(StepSkipped)
    assert result.output == "C"
    assert "[b]\nB" in str(model_of(steps[2]).requests[0])


async def test_long_chain_passes_outputs_along_templates() -> None:
    steps = [DefaultStep("s0", "start", model=ScriptedModel(["out 0"]))]
    for i in range(1, 30):
        steps.append(
            DefaultStep(
                f"s{i}",
                f"step {i}: {{{{ s{i - 1}.output }}}}",
                depends_on=[f"s{i - 1}"],
                model=ScriptedModel([f"out {i}"]),
            )
        )
    result = await run(steps)
    assert result.ok
    assert len(result.executions) == 30
    assert result.output == "out 29"
    last = steps[-1].model
    assert isinstance(last, ScriptedModel)
    assert "step 29: out 28" in str(last.requests[0])


async def test_fan_out_and_join() -> None:
    recorder = Recorder()
    # b, c and d answer only once all three are waiting on their models: they must run at once.
    all_three = recorder.event_when(model_calls_started(4))  # plan's call and theirs
    steps = [
        step("plan"),
        *(step(name, gate=all_three, depends_on=["plan"]) for name in ("b", "c", "d")),
        step("join", depends_on=["b", "c", "d"]),
    ]
    result = await run(steps, recorder=recorder)
    assert result.ok
    assert recorder.max_concurrency() == 3
    join_started = recorder.started("join")
    assert all(recorder.finished(s) < join_started for s in ("b", "c", "d"))
    prompt = str(model_of(steps[-1]).requests[0])
    assert "[b]\nb done" in prompt
    assert "[c]\nc done" in prompt
    assert "[d]\nd done" in prompt
    assert "plan done" not in prompt  # only direct dependencies


async def test_a_step_starts_when_its_own_dependencies_are_done_not_a_wave() -> None:
    recorder = Recorder()
    steps = [
        step("fast"),
        # A wave scheduler would wait for "slow" before starting "after_fast": a deadlock.
        step("slow", gate=recorder.event_when(step_finished("after_fast"))),
        step("after_fast", depends_on=["fast"]),
        step("after_slow", depends_on=["slow"]),
    ]
    result = await run(steps, recorder=recorder)
    assert result.ok
    assert recorder.started("after_fast") < recorder.finished("slow")
    assert recorder.finished("after_fast") < recorder.finished("slow")


async def test_max_parallel_steps_bounds_concurrency() -> None:
    recorder = Recorder()
    # Nobody answers before two steps are waiting at once, and answers take a few event-loop
    # turns, in which more steps would start if the bound let them.
    two_running = recorder.event_when(model_calls_started(2))
    steps = [step(f"s{i}", gate=two_running, turns=3) for i in range(6)]
    config = dataclasses.replace(FAST, max_parallel_steps=2)
    result = await run(steps, recorder=recorder, config=config)
    assert result.ok
    assert len(result.completed) == 6
    assert recorder.max_concurrency() == 2
    # Ready steps start in recipe order.
    assert [e.step_id for e in recorder.of(StepStarted)] == [f"s{i}" for i in range(6)]


async def test_recipe_config_overrides_the_executor_config() -> None:
    recorder = Recorder()
    # Each answer takes a few event-loop turns, in which other steps would start if allowed.
    steps = [step(f"s{i}", turns=3) for i in range(4)]
    recipe = AgentRecipe(id="one", steps=steps, config={"max_parallel_steps": 1})
    async with asyncio.timeout(HANG_GUARD):
        result = await AgentExecutor(config=FAST).execute(recipe, listeners=[recorder])
    assert result.ok
    assert recorder.max_concurrency() == 1


async def test_a_sync_step_runs_alone() -> None:
    recorder = Recorder()
    # a and b answer only once both are running; each answer takes a few event-loop turns,
    # in which other steps would start if the sync step let them.
    both = recorder.event_when(model_calls_started(2))
    steps = [
        step("a", gate=both, turns=3),
        step("b", gate=both, turns=3),
        step("alone", turns=3, mode="sync"),
        step("c", turns=3),
        step("d", turns=3),
    ]
    result = await run(steps, recorder=recorder)
    assert result.ok
    started, finished = recorder.started("alone"), recorder.finished("alone")
    running = 0
    for event in recorder.events:
        if event.seq == started:
            assert running == 0, "something was running when the sync step started"
        if isinstance(event, StepStarted):
            running += 1
            assert not started < event.seq < finished, "a step started during the sync step"
        elif isinstance(event, StepCompleted):
            running -= 1
    # The steps before it in recipe order started first; those after it waited.
    assert recorder.started("a") < started
    assert recorder.started("b") < started
    assert recorder.started("c") > finished
    assert recorder.started("d") > finished


async def test_fire_and_forget_holds_nobody_up_and_its_outcome_is_recorded() -> None:
    recorder = Recorder()
    steps = [
        # It answers only after the last step finished: nobody may wait for it.
        step("notify", gate=recorder.event_when(step_finished("last")), mode="fire_and_forget"),
        step("next", depends_on=["notify"]),
        step("last", depends_on=["next"]),
    ]
    result = await run(steps, recorder=recorder)
    assert result.ok
    assert recorder.started("next") < recorder.finished("notify")
    assert recorder.finished("last") < recorder.finished("notify")
    # The run waited for it and recorded it.
    assert result.step("notify").status is StepStatus.COMPLETED
    assert result.executions[-1].step_id == "notify"
    assert result.output == "last done"  # a fire-and-forget step is never the run's output
    assert "notify" not in str(model_of(steps[1]).requests[0])


async def test_a_failing_fire_and_forget_step_does_not_fail_the_run() -> None:
    recorder = Recorder()
    after_work = recorder.event_when(step_finished("work"))
    steps = [
        step("notify", ModelError("mail server down"), gate=after_work, mode="fire_and_forget"),
        step("work", depends_on=["notify"]),
    ]
    result = await run(steps, recorder=recorder)
    assert recorder.finished("work") < recorder.finished("notify")
    assert result.status is StepStatus.COMPLETED
    assert statuses(result) == {"work": "completed", "notify": "failed"}
    assert "mail server down" in (result.step("notify").error or "")


async def test_fire_and_forget_steps_are_cancelled_after_the_grace_period() -> None:
    steps = [step("background", delay=30, mode="fire_and_forget"), step("work")]
    config = dataclasses.replace(FAST, fire_and_forget_grace=0.01)
    result = await run(steps, config=config)
    assert result.status is StepStatus.COMPLETED
    background = result.step("background")
    assert background.status is StepStatus.FAILED
    assert "fire_and_forget_grace" in (background.error or "")
