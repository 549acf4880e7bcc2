"""Failure policy: failures skip their dependents with the reason, independent branches go on,
fail_fast cancels, optional steps let dependents run, timeouts and outside cancellation end
steps cleanly, and a run token budget holds across parallel steps."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from agent_helpers import (
    FAST,
    Recorder,
    model_calls_started,
    model_of,
    run,
    statuses,
    step,
    step_finished,
    step_started,
)

from minions import (
    AgentExecutor,
    AgentRecipe,
    AgentResult,
    DefaultStep,
    ExecutionConfig,
    ModelError,
    StepStatus,
    tool,
)
from minions.events import ModelCallStarted, RunFailed, StepFailed, StepSkipped
from minions.testing import ScriptedModel


def boom(message: str = "the model is down") -> ModelError:
    return ModelError(message)


async def test_a_failed_step_skips_its_dependents_and_independent_branches_go_on() -> None:
    recorder = Recorder()
    result = await run(
        [
            step("a", boom()),
            step("b", depends_on=["a"]),
            step("c", depends_on=["b"]),
            # The independent branch is still running when "a" fails.
            step("other", gate=recorder.event_when(step_finished("a"))),
            step("after_other", depends_on=["other"]),
        ],
        recorder=recorder,
    )
    assert result.status is StepStatus.FAILED
    assert statuses(result) == {
        "a": "failed",
        "b": "skipped",
        "c": "skipped",
        "other": "completed",
        "after_other": "completed",
    }
    assert result.step("b").error == "dependency 'a' failed"
    assert result.step("c").error == "dependency 'b' was skipped after a failure"
    assert result.error is not None
    assert "step 'a' failed" in result.error
    assert "the model is down" in result.error
    [failed] = recorder.of(RunFailed)
    assert failed.error == result.error
    assert [e.step_id for e in recorder.of(StepSkipped)] == ["b", "c"]
    assert recorder.finished("a") < recorder.started("after_other")


async def test_fail_fast_cancels_running_steps() -> None:
    slow = step("slow", delay=5.0)
    result = await run(
        [step("bad", boom()), slow, step("later", depends_on=["slow"])],
        config=dataclasses.replace(FAST, fail_fast=True),
    )
    assert result.status is StepStatus.FAILED
    assert result.error is not None
    assert "step 'bad' failed and fail_fast is set" in result.error
    assert result.step("slow").status is StepStatus.FAILED
    assert "cancelled" in (result.step("slow").error or "")
    assert result.step("later").status is StepStatus.SKIPPED
    assert result.step("slow").model_calls == []  # cancelled before its model answered


async def test_without_fail_fast_running_steps_finish() -> None:
    recorder = Recorder()
    # "bad" fails only once "slow" has started, and "slow" answers only after that failure:
    # it is running when the failure comes.
    bad = step("bad", boom(), gate=recorder.event_when(step_started("slow")))
    slow = step("slow", gate=recorder.event_when(step_finished("bad")))
    result = await run([bad, slow, step("later", depends_on=["slow"])], recorder=recorder)
    assert recorder.started("slow") < recorder.finished("bad") < recorder.finished("slow")
    assert statuses(result) == {"bad": "failed", "slow": "completed", "later": "completed"}
    assert result.status is StepStatus.FAILED


async def test_an_optional_failure_lets_dependents_run_with_none() -> None:
    join = step("join", "joined", depends_on=["maybe", "sure"])
    result = await run(
        [step("maybe", boom(), optional=True), step("sure", "sure output"), join],
    )
    assert result.status is StepStatus.COMPLETED
    assert statuses(result)["maybe"] == "failed"
    assert result.output == "joined"
    prompt = str(model_of(join).requests[0])
    assert "sure output" in prompt
    assert "[maybe]" in prompt
    assert "[maybe]\n(no result: this step did not succeed)" in prompt


async def test_a_step_timeout_cancels_the_step_and_its_tool_calls() -> None:
    started = asyncio.Event()
    finished: list[str] = []

    @tool
    async def crawl(url: str) -> str:
        """Crawl a page slowly."""
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            finished.append("cancelled")
            raise
        finished.append("ended")
        return "page"

    slow = DefaultStep(
        "crawl",
        "Crawl it.",
        tools={"crawl"},
        timeout=0.1,
        model=ScriptedModel([[("crawl", {"url": "x"})], "done"]),
    )
    recipe = AgentRecipe(
        id="t", steps=[slow, step("after", depends_on=["crawl"]), step("free")], tools=[crawl]
    )
    result = await AgentExecutor(config=FAST).execute(recipe)
    assert result.step("crawl").status is StepStatus.FAILED
    assert "timed out after 0.1" in (result.step("crawl").error or "")
    # The run's error names the step once (not "step 'crawl' failed: step 'crawl' timed out").
    assert result.error == "step 'crawl' timed out after 0.1s"
    assert finished == ["cancelled"]  # the tool call itself was cancelled, not left running
    assert statuses(result)["after"] == "skipped"
    assert statuses(result)["free"] == "completed"


async def test_cancelling_the_run_from_outside_cancels_every_step() -> None:
    recorder = Recorder()
    steps = [step("x", delay=10.0), step("y", delay=10.0), step("z", depends_on=["x"])]
    recipe = AgentRecipe(id="cancel-me", steps=steps)
    task = asyncio.create_task(AgentExecutor(config=FAST).execute(recipe, listeners=[recorder]))
    # Cancel once both x and y are waiting on their models.
    await recorder.until(lambda events: len(recorder.of(ModelCallStarted)) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [failed] = recorder.of(RunFailed)
    assert "cancelled" in failed.error
    step_failures = {e.step_id: e.error for e in recorder.of(StepFailed)}
    assert set(step_failures) == {"x", "y"}
    assert [e.step_id for e in recorder.of(StepSkipped)] == ["z"]
    assert recorder.events[-1] is failed


async def test_the_run_token_budget_holds_across_parallel_steps() -> None:
    recorder = Recorder()
    all_three = recorder.event_when(model_calls_started(3))
    steps = [step(name, gate=all_three) for name in ("a", "b", "c")]
    steps.append(step("d", depends_on=["a", "b", "c"]))
    # The budget is checked before each call: the three parallel calls start with nothing
    # spent yet (none answers before all three have started), and once they have spent more
    # than the budget the join's call is refused.
    result = await run(
        steps, config=dataclasses.replace(FAST, run_token_budget=1), recorder=recorder
    )
    assert result.status is StepStatus.FAILED
    assert statuses(result) == {"a": "completed", "b": "completed", "c": "completed", "d": "failed"}
    assert "token budget" in (result.step("d").error or "")
    assert len(model_of(steps[3]).requests) == 0
    assert result.usage.total_tokens > 1


async def test_the_run_budget_is_checked_before_every_call() -> None:
    def chain(model: ScriptedModel) -> list[DefaultStep]:
        return [
            DefaultStep("a", "A", model=model),
            DefaultStep("b", "B", model=model, depends_on=["a"]),
            DefaultStep("c", "C", model=model, depends_on=["b"]),
        ]

    first = await run(chain(ScriptedModel(["one"]))[:1])
    budget = first.usage.total_tokens * 2  # enough for two calls' worth, not three
    model = ScriptedModel(["one", "two", "three"])
    result = await run(chain(model), config=dataclasses.replace(FAST, run_token_budget=budget))
    assert statuses(result) == {"a": "completed", "b": "completed", "c": "failed"}
    assert "token budget" in (result.step("c").error or "")
    assert len(model.requests) == 2


def test_results_list_completed_failed_and_skipped() -> None:
    result: AgentResult = asyncio.run(
        run([step("a"), step("b", boom()), step("c", depends_on=["b"])])
    )
    assert result.completed == ("a",)
    assert result.failed == ("b",)
    assert result.skipped == ("c",)
    assert result.finished_at >= result.started_at


async def test_an_exception_escaping_a_listener_does_not_hang_the_run() -> None:
    def bad_listener(event: object) -> None:
        raise RuntimeError("listener bug")

    recipe = AgentRecipe(id="l", steps=[step("a")])
    result = await asyncio.wait_for(
        AgentExecutor(config=ExecutionConfig()).execute(recipe, listeners=[bad_listener]), 5
    )
    assert result.status is StepStatus.COMPLETED


async def test_the_run_budget_also_stops_retries() -> None:
    from minions import ModelOutputError, Usage

    costly = ModelOutputError("not JSON", usage=Usage.of_call(150, 50))
    flaky = step("flaky", costly, "ok")
    result = await run([flaky], config=dataclasses.replace(FAST, run_token_budget=100))
    assert result.step("flaky").status is StepStatus.FAILED
    assert "token budget" in (result.step("flaky").error or "")
    assert len(model_of(flaky).requests) == 1  # the re-ask was refused before it was sent
    assert result.usage.total_tokens == 200  # the failed attempt still counts


async def test_a_failed_run_has_no_output_of_its_own() -> None:
    done, broken = step("done", "done's output"), step("broken", boom(), depends_on=["done"])
    result = await run([done, broken])
    assert result.status is StepStatus.FAILED
    assert result.output is None  # not the output of `done`, which completed before
    assert result.step("done").output == "done's output"
