"""The typed surface against a real llama.cpp server (`make test-live`): a typed step with a
tool taking a `ToolContext`, streamed by the caller from a model that does not stream by
default, and a stream abandoned midway."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import assert_type

import pytest
from pydantic import BaseModel, Field

from minions import DefaultStep, StepExecution, StepStatus, ToolContext, tool
from minions import events as ev

from .conftest import LiveServer
from .test_llama_cpp import model_of

pytestmark = pytest.mark.live


class City(BaseModel):
    name: str = Field(description="The city's name.")
    country: str = Field(description="The country it is in.")


@dataclass
class Deps:
    known: dict[str, str]


calls: list[str] = []


@tool
def country_of(ctx: ToolContext[Deps], city: str) -> str:
    """The country a city is in.

    Args:
        city: the city's name.
    """
    calls.append(city)
    return ctx.deps.known.get(city, "unknown")


async def test_a_typed_step_with_a_tool_streams_because_the_caller_streams(
    smollm2: LiveServer,
) -> None:
    model = model_of(smollm2)
    assert model.stream is False  # the model's default: no streaming
    step = DefaultStep(
        "city",
        goal="Which city is the Eiffel Tower in, and in which country?",
        system="You answer with facts.",
        tools=[country_of],
        output=City,
    )
    events: list[ev.Event] = []
    async with step.stream(model=model, deps=Deps({"Paris": "France"})) as stream:
        async for event in stream:
            events.append(event)
    execution = stream.execution
    assert_type(execution, StepExecution[City])
    assert execution.status is StepStatus.COMPLETED, execution.error
    city = execution.result()
    assert isinstance(city, City)
    deltas = [e for e in events if isinstance(e, ev.TokenDelta)]
    assert len(deltas) > 1  # streamed over SSE, delta by delta
    answered = [e for e in events if isinstance(e, ev.ModelCallCompleted)]
    last = answered[-1]
    final = "".join(d.text for d in deltas if (d.turn, d.attempt) == (last.turn, last.attempt))
    assert final.strip()  # the final answer's text came as deltas
    # The model may or may not call the tool (tiny models rarely do); when it did, the tool
    # had the run's deps.
    for call in execution.tool_calls:
        assert call.result in ("France", "unknown"), call
    assert execution.usage.unknown_calls == 0


async def test_a_stream_abandoned_midway_stops_the_request(smollm2: LiveServer) -> None:
    model = model_of(smollm2, max_tokens=400)
    step = DefaultStep("story", goal="Tell a long story about a lighthouse keeper.")
    before = asyncio.all_tasks()
    async with step.stream(model=model) as stream:
        async for _ in stream.text():
            break
    assert stream.execution.status is StepStatus.FAILED
    assert stream.execution.error == "step 'story' was cancelled"
    assert asyncio.all_tasks() == before
    # The server is free again: a whole answer comes back.
    again = await DefaultStep("hi", goal="Reply with one word: hello.").run(
        model=model_of(smollm2, max_tokens=128)
    )
    assert again.status is StepStatus.COMPLETED, again.error


def named(city: City) -> City:
    """A rule on the validated output: a city has a name (re-asks otherwise)."""
    if not city.name.strip():
        raise ValueError("name must not be empty")
    return city


async def test_text_deltas_of_a_typed_step_arrive_one_by_one_and_make_its_output(
    smollm2: LiveServer,
) -> None:
    model = model_of(smollm2, max_tokens=128)  # streams only because the caller does
    step = DefaultStep(
        "city",
        goal="Which city is the Eiffel Tower in, and in which country?",
        system="You answer with facts.",
        output=City,
        validators=[named],
    )
    seen: list[ev.Event] = []
    texts: list[str] = []
    async with step.stream(model=model, listeners=[seen.append]) as stream:
        async for text in stream.text():
            texts.append(text)
    execution = stream.execution
    assert_type(execution, StepExecution[City])
    city = execution.result()
    assert_type(city, City)
    assert city.name.strip()
    assert len(texts) > 3  # token by token over SSE, not one whole answer
    deltas = [e for e in seen if isinstance(e, ev.TokenDelta)]
    assert [d.text for d in deltas] == texts
    last = execution.model_calls[-1]
    final = "".join(d.text for d in deltas if (d.turn, d.attempt) == (last.turn, last.attempt))
    assert City.model_validate_json(final) == city  # the deltas are the typed output's JSON
