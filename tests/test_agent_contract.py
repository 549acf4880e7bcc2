"""The agent issue's contract program, as users will write it, and the executor's entry points."""

from __future__ import annotations

import asyncio

import pytest
from agent_helpers import FAST, Recorder, numbered, step

from minions import AgentExecutor, AgentRecipe, DefaultStep, MessageBundle, ModelError, StepStatus
from minions.errors import UnknownRecipeError
from minions.events import RunCompleted, RunStarted, StepFailed, event_from_json, event_to_json
from minions.testing import ScriptedModel


def test_contract_program() -> None:
    report_model = ScriptedModel(["Bees pollinate crops (P1)."])
    recipe = AgentRecipe(id="research", steps=[
        DefaultStep("wiki", MessageBundle(goal="Collect facts about {{ inputs.topic }}."), model=ScriptedModel(["Facts: bees pollinate."])),
        DefaultStep("papers", MessageBundle(goal="List papers about {{ inputs.topic }}."), model=ScriptedModel(["Papers: P1."])),
        DefaultStep("report", MessageBundle(goal="Write a one-line report."), depends_on=["wiki", "papers"], model=report_model),
    ])  # fmt: skip
    result = asyncio.run(AgentExecutor().execute(recipe, inputs={"topic": "bees"}))
    assert result.status is StepStatus.COMPLETED
    assert result.step("report").output == "Bees pollinate crops (P1)."
    prompt = str(report_model.requests[0])
    assert "Facts: bees pollinate." in prompt
    assert "Papers: P1." in prompt
    assert "Collect facts" not in prompt
    # And the run as a whole.
    assert result.output == "Bees pollinate crops (P1)."
    assert [e.step_id for e in result.executions][-1] == "report"
    assert result.usage.calls == 3
    assert result.usage == sum((e.usage for e in result.executions), start=type(result.usage)())
    assert result.finished_at >= result.started_at


def recipe_named(recipe_id: str) -> AgentRecipe:
    return AgentRecipe(id=recipe_id, steps=[step("only", "hello")])


async def test_registered_recipe_runs_by_id() -> None:
    executor = AgentExecutor(recipes=[recipe_named("greet")])
    result = await executor.execute("greet")
    assert result.ok
    assert result.output == "hello"
    assert result.recipe_id == "greet"


async def test_unknown_recipe_id_is_a_clear_error() -> None:
    executor = AgentExecutor(recipes=[recipe_named("greet")])
    with pytest.raises(
        UnknownRecipeError, match=r"unknown recipe 'great' \(known recipes: 'greet'\)"
    ):
        await executor.execute("great")


def test_two_recipes_with_one_id_are_refused() -> None:
    with pytest.raises(ValueError, match="two different recipes"):
        AgentExecutor(recipes=[recipe_named("a"), recipe_named("a")])


def test_execute_sync_wraps_execute() -> None:
    result = AgentExecutor().execute_sync(recipe_named("sync"))
    assert result.ok
    assert result.output == "hello"


async def test_stream_yields_events_in_order_and_ends_with_the_run() -> None:
    recipe = AgentRecipe(
        id="streamed", steps=[step("a"), step("b", depends_on=["a"])], inputs={"x": 1}
    )
    stream = AgentExecutor().stream(recipe, inputs={"y": 2})
    events = [event async for event in stream]
    assert isinstance(events[0], RunStarted)
    assert events[0].inputs == {"x": 1, "y": 2}
    assert isinstance(events[-1], RunCompleted)
    assert numbered(events)
    assert len({e.run_id for e in events}) == 1
    assert stream.result is not None
    assert stream.result.output == "b done"
    assert stream.result.run_id == events[0].run_id
    for event in events:
        assert event_from_json(event_to_json(event)) == event


async def test_leaving_a_stream_early_cancels_the_run() -> None:
    recorder = Recorder()
    slow = step("slow", delay=30)
    recipe = AgentRecipe(id="left", steps=[slow])
    executor = AgentExecutor(listeners=[recorder])
    async with executor.stream(recipe) as stream:
        async for event in stream:
            if event.kind == "model_call_started":
                break
    assert stream.result is None
    assert "model_call_completed" not in recorder.kinds()  # the slow answer never came
    assert recorder.events[-1].kind == "run_failed"
    assert "cancelled" in recorder.events[-1].error
    assert [e.step_id for e in recorder.of(StepFailed)] == ["slow"]


async def test_a_failing_run_streams_to_its_failure_event() -> None:
    recipe = AgentRecipe(
        id="bad", steps=[step("a", ModelError("down")), step("b", depends_on=["a"])]
    )
    stream = AgentExecutor(config=FAST).stream(recipe)
    events = [event async for event in stream]
    assert events[-1].kind == "run_failed"
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert stream.result is not None
    assert stream.result.status is StepStatus.FAILED


def test_an_executor_caches_graphs_of_recent_recipes_only() -> None:
    executor = AgentExecutor()
    recipe = AgentRecipe(id="kept", steps=[step("a")])
    assert executor.graph(recipe) is executor.graph(recipe)  # validated once
    for i in range(100):
        executor.graph(AgentRecipe(id=f"r{i}", steps=[step("a")]))
    assert len(executor._graphs) <= 32  # ad-hoc recipes do not pile up
