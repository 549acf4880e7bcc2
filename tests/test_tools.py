"""Tools from typed functions, and how their failures reach the model."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Annotated, Literal

import pytest
from conftest import FAST, assert_tool_invariant
from pydantic import BaseModel, Field

from minions import (
    AgentContext,
    DefaultStep,
    ExecutionConfig,
    StepDefinitionError,
    StepExecutor,
    StepStatus,
    Tool,
    ToolCall,
    ToolCallExecutor,
    ToolDefinitionError,
    ToolError,
    ToolRegistry,
    tool,
)
from minions.events import RetryScheduled, ToolCallFailed
from minions.testing import ScriptedModel


@tool
def forecast(city: str, days: int = 1, unit: Literal["C", "F"] = "C") -> dict[str, object]:
    """Get the weather forecast.

    Args:
        city: the city's name.
        days: how many days ahead.
        unit: temperature unit.
    """
    return {"city": city, "days": days, "unit": unit}


def execute(call: ToolCall, *tools: Tool, config: ExecutionConfig = FAST) -> ToolCall:
    executor = ToolCallExecutor(ToolRegistry(tools), config=config)
    return asyncio.run(executor.execute(call))


def test_an_executed_call_keeps_every_field_of_the_call() -> None:
    # The executor copies a call field by field (cheaper than `dataclasses.replace`): a field
    # added to `ToolCall` must be copied there too, or this fails.
    assert [f.name for f in dataclasses.fields(ToolCall)] == ["id", "name", "arguments", "response"]
    call = ToolCall(id="c1", name="forecast", arguments={"city": "Oslo"})
    done = execute(call, forecast)
    assert done.response is not None
    assert done.response.error is None
    assert done == dataclasses.replace(call, response=done.response)


def test_schema_comes_from_type_hints_and_docstring() -> None:
    spec = forecast.spec
    assert spec.name == "forecast"
    assert spec.description == "Get the weather forecast."
    params = spec.parameters
    assert params["required"] == ["city"]
    assert params["properties"]["city"] == {"description": "the city's name.", "type": "string"}
    assert params["properties"]["days"]["default"] == 1
    assert params["properties"]["unit"]["enum"] == ["C", "F"]
    assert params["additionalProperties"] is False


DUNE = {"title": "Dune", "year": 1965}


class Book(BaseModel):
    title: str
    year: int


def test_generated_titles_go_but_a_title_in_a_default_or_an_example_stays() -> None:
    @tool
    def shelve(
        book: Annotated[dict[str, object], Field(examples=[DUNE])] = DUNE,
        first: Book | None = None,
    ) -> str:
        """Shelve a book."""
        return ""

    params = shelve.spec.parameters
    assert params["properties"]["book"]["default"] == DUNE
    assert params["properties"]["book"]["examples"] == [DUNE]
    # pydantic's generated titles are dropped; a property called "title" is not a title.
    assert "title" not in params["properties"]["book"]
    assert params["$defs"]["Book"]["properties"]["title"] == {"type": "string"}
    assert "title" not in params["$defs"]["Book"]


def test_tool_is_still_callable_and_options_apply() -> None:
    assert forecast("Oslo") == {"city": "Oslo", "days": 1, "unit": "C"}

    @tool(name="weather", description="Custom.")
    def other(city: str) -> str:
        return city

    assert other.name == "weather"
    assert other.spec.description == "Custom."


def test_arguments_are_validated_and_converted() -> None:
    call = execute(
        ToolCall(id="1", name="forecast", arguments={"city": "Oslo", "days": "3"}), forecast
    )
    assert call.response is not None
    assert call.response.result == {"city": "Oslo", "days": 3, "unit": "C"}
    assert call.response.content == '{"city":"Oslo","days":3,"unit":"C"}'


def test_invalid_arguments_name_each_problem() -> None:
    call = execute(ToolCall(id="1", name="forecast", arguments={"days": "x", "color": 1}), forecast)
    assert call.response is not None
    error = call.response.error or ""
    assert error.startswith("Invalid arguments for tool 'forecast':")
    assert "city: Field required" in error
    assert "days: Input should be a valid integer" in error
    assert "color: Extra inputs are not permitted" in error


def test_unknown_tool_lists_available_tools() -> None:
    call = execute(ToolCall(id="1", name="forcast", arguments={}), forecast)
    assert call.response is not None
    assert call.response.error == "Unknown tool 'forcast'. Available tools: forecast."


def test_failing_tool_is_retried_then_its_error_is_the_result() -> None:
    attempts = 0

    @tool
    def flaky() -> str:
        """Fail twice, then work."""
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise ConnectionError("network down")
        return "ok"

    call = execute(ToolCall(id="1", name="flaky"), flaky)
    assert call.response is not None
    assert call.response.result == "ok"
    assert call.response.attempts == 3

    attempts = -10
    failed = execute(ToolCall(id="2", name="flaky"), flaky)
    assert failed.response is not None
    assert failed.response.error == (
        "Tool 'flaky' failed after 3 attempts: ConnectionError: network down"
    )
    assert failed.response.attempts == 3


def test_tool_error_is_not_retried() -> None:
    attempts = 0

    @tool
    async def picky(city: str) -> str:
        """Know one city."""
        nonlocal attempts
        attempts += 1
        raise ToolError(f"I only know Oslo, not {city}.")

    call = execute(ToolCall(id="1", name="picky", arguments={"city": "Rome"}), picky)
    assert call.response is not None
    assert call.response.error == "I only know Oslo, not Rome."
    assert attempts == 1


def test_results_are_serialized_as_json() -> None:
    class Point(BaseModel):
        x: int

    @dataclasses.dataclass
    class Pair:
        a: int

    @tool
    def shapes() -> dict[str, object]:
        """Return shapes."""
        return {"point": Point(x=1), "pair": Pair(a=2), "none": None}

    call = execute(ToolCall(id="1", name="shapes"), shapes)
    assert call.response is not None
    assert call.response.content == '{"point":{"x":1},"pair":{"a":2},"none":null}'


def test_a_non_serializable_result_goes_back_as_an_error() -> None:
    @tool
    def opaque():  # type: ignore[no-untyped-def]  # no annotation: checked at run time
        """Return something opaque."""
        return object()

    call = execute(
        ToolCall(id="1", name="opaque"),
        opaque,
        config=dataclasses.replace(FAST, max_tool_call_retries=0),
    )
    assert call.response is not None
    assert "is not JSON-serializable" in (call.response.error or "")


def test_a_non_serializable_return_type_is_a_definition_error_before_any_model_call() -> None:
    class Opaque:
        pass

    @tool
    def opaque() -> Opaque:
        """Return something opaque."""
        return Opaque()

    model = ScriptedModel(["never"])
    step = DefaultStep("s", "x", tools={"opaque"})
    with pytest.raises(StepDefinitionError) as raised:
        StepExecutor(step, AgentContext(model=model, tools=[opaque]))
    assert "step 's': tool 'opaque' returns" in str(raised.value)
    assert "cannot be serialized to JSON" in str(raised.value)
    assert model.requests == []


def test_bad_tool_definitions_are_named() -> None:
    with pytest.raises(ToolDefinitionError, match=r"\*args"):

        @tool
        def variadic(*numbers: int) -> int:
            return sum(numbers)

    with pytest.raises(ToolDefinitionError, match="tool name 'has space'"):
        Tool(lambda: 1, name="has space")

    registry = ToolRegistry([forecast])
    with pytest.raises(ToolDefinitionError, match="two different tools are named 'forecast'"):
        registry.register(Tool(lambda: 1, name="forecast"))


def test_failed_tool_results_reach_the_model_and_the_loop_goes_on() -> None:
    @tool
    def broken() -> str:
        """Always fail."""
        raise RuntimeError("disk full")

    events: list[object] = []
    model = ScriptedModel([[("broken", {}), ("nope", {})], "I could not do it."])
    context = AgentContext(model=model, tools=[broken], config=FAST, listeners=[events.append])
    execution = asyncio.run(
        StepExecutor(DefaultStep("s", "x", tools={"broken"}), context).execute()
    )
    assert execution.status is StepStatus.COMPLETED
    results = [m.content for m in model.requests[1].messages if m.role == "tool"]
    assert results == [
        "Tool 'broken' failed after 3 attempts: RuntimeError: disk full",
        "Unknown tool 'nope'. Available tools: broken.",
    ]
    assert [e.attempt for e in events if isinstance(e, RetryScheduled)] == [1, 2]
    assert sorted(e.name for e in events if isinstance(e, ToolCallFailed)) == ["broken", "nope"]


def test_the_model_can_only_call_the_steps_own_tools() -> None:
    model = ScriptedModel([[("forecast", {"city": "Oslo"})], "ok"])
    context = AgentContext(model=model, tools=[forecast, tool(name="other")(lambda: 1)])
    step = DefaultStep("s", "x", tools={"other"})
    execution = asyncio.run(StepExecutor(step, context).execute())
    assert execution.tool_calls[0].response is not None
    assert execution.tool_calls[0].response.error == (
        "Unknown tool 'forecast'. Available tools: other."
    )


def test_parallel_results_never_erase_each_other() -> None:
    """Java pitfall: one snapshot slot shared by parallel tool calls."""
    attempts = 0

    @tool
    async def flaky(n: int) -> int:
        """Fail once, then double."""
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise TimeoutError("slow disk")
        await asyncio.sleep(0)
        return n * 2

    @tool
    async def steady(n: int) -> int:
        """Triple."""
        await asyncio.sleep(0)
        return n * 3

    model = ScriptedModel([[("flaky", {"n": 1}), ("steady", {"n": 1}), ("steady", {"n": 2})], "ok"])
    context = AgentContext(model=model, tools=[flaky, steady], config=FAST)
    step = DefaultStep("s", "x", tools={"flaky", "steady"})
    execution = asyncio.run(StepExecutor(step, context).execute())
    assert [c.response.content for c in execution.tool_calls if c.response] == ["2", "3", "6"]
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == ["2", "3", "6"]
    assert_tool_invariant(execution.messages)


def test_tool_timeout_counts_as_a_failure() -> None:
    @tool
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(5)
        return "late"

    config = dataclasses.replace(FAST, tool_call_timeout=0.01, max_tool_call_retries=1)
    call = execute(ToolCall(id="1", name="slow"), slow, config=config)
    assert call.response is not None
    # An async tool is cancelled at its timeout, so trying it again is safe.
    assert call.response.error == "Tool 'slow' did not finish within 0.01s."
    assert call.response.attempts == 2


def test_a_threaded_tool_that_timed_out_is_not_run_again() -> None:
    started = threading.Event()
    release = threading.Event()
    runs: list[int] = []

    @tool
    def blocking() -> str:
        """Blocks until released (a thread cannot be cancelled)."""
        runs.append(1)
        started.set()
        release.wait(0.5)  # asyncio.run waits for the thread when it closes
        return "late"

    config = dataclasses.replace(FAST, tool_call_timeout=0.05, max_tool_call_retries=2)
    try:
        call = execute(ToolCall(id="1", name="blocking"), blocking, config=config)
    finally:
        release.set()
    assert call.response is not None
    assert call.response.error == (
        "Tool 'blocking' did not finish within 0.05s; it may still be running, so it is not "
        "tried again."
    )
    assert (call.response.attempts, len(runs)) == (1, 1)
