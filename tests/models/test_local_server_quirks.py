"""What real local servers do that no error reports (found against llama.cpp), played by
`FakeOpenAIServer` quirks, and what minions does about each."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from minions import AgentContext, DefaultStep, OutputInstructions, StepExecution, StepExecutor, tool
from minions import events as ev
from minions.events import EventListener
from minions.models import OpenAIChatModel
from minions.testing import FakeOpenAIServer, FakeReply

from .conftest import FAST


class Sum(BaseModel):
    total: int


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def sum_step(**options: Any) -> DefaultStep:
    return DefaultStep("sum", "What is 2+3?", output=OutputInstructions(Sum), **options)


async def run(
    model: OpenAIChatModel,
    step: DefaultStep | None = None,
    *,
    listeners: Sequence[EventListener] = (),
) -> StepExecution:
    context = AgentContext(model=model, config=FAST, listeners=listeners)
    return await StepExecutor(step or sum_step(), context).execute()


async def test_a_reask_never_sends_two_user_messages_in_a_row() -> None:
    # Gemma's official template answers 400 to user/user; the note joins the goal instead.
    async with FakeOpenAIServer(
        ['{"total": "five"}', '{"total": 5}'], quirks={"strict_alternation"}
    ) as server:
        execution = await run(server.model(output_modes=("prompted_json",)))
        first, second = server.chat_requests

    assert execution.output == Sum(total=5), execution.error
    assert [m["role"] for m in second.messages] == ["system", "user"]
    assert second.messages[-1]["content"].startswith(first.messages[-1]["content"] + "\n\n")


async def test_a_shared_conversation_joins_consecutive_user_messages_on_the_wire() -> None:
    async with FakeOpenAIServer(["first", "second"], quirks={"strict_alternation"}) as server:
        context = AgentContext(model=server.model(), config=FAST)
        one = DefaultStep("one", "Say first.", memory="agent")
        two = DefaultStep("two", "Say second.", memory="agent")
        for step in (one, two):
            execution = await StepExecutor(step, context, conversation_id="shared").execute()
            assert execution.error is None
        last = server.chat_requests[-1]
    roles = [m["role"] for m in last.messages]
    assert roles == ["user", "assistant", "user"]


async def test_the_output_tool_alone_is_forced_with_required() -> None:
    # llama.cpp ignores a named tool_choice ("Wrong type supplied for parameter 'tool_choice'").
    async with FakeOpenAIServer(
        [FakeReply.structured(Sum(total=5))], quirks={"ignores_named_tool_choice"}
    ) as server:
        execution = await run(server.model(output_modes=("tool",)))
        (request,) = server.chat_requests

    assert request.tool_choice == "required"
    assert execution.output == Sum(total=5)
    assert execution.model_calls[0].output_mode == "tool"


async def test_a_server_that_ignores_tools_moves_down_the_ladder() -> None:
    # With a chat template without tool support, llama.cpp drops `tools` silently: the model
    # answers in prose. Two such answers demote the tool rung; since the endpoint cannot call
    # the step's tools either, native JSON (a grammar on llama.cpp) is asked next.
    events: list[ev.Event] = []
    async with FakeOpenAIServer(
        ["Five.", "The sum is five.", '{"total": 5}'], quirks={"ignores_tools"}
    ) as server:
        model = server.model()
        step = sum_step(tools={"add"})
        context = AgentContext(model=model, tools=[add], config=FAST, listeners=[events.append])
        execution = await StepExecutor(step, context).execute()
        requests = server.chat_requests

    assert execution.output == Sum(total=5), execution.error
    assert ["Sum" in r.tools for r in requests] == [True, True, False]  # the output tool
    assert model.rejected == {"tool", "tools"}  # the tool rung, and tools altogether
    assert [e.mode for e in events if isinstance(e, ev.OutputModeDemoted)] == ["tool"]
    assert execution.model_calls[-1].output_mode == "json_schema"
    assert requests[-1].response_format is not None


async def test_a_complete_json_object_before_a_length_cut_off_is_used() -> None:
    async with FakeOpenAIServer([FakeReply.json_then_cut_off({"total": 5})]) as server:
        execution = await run(server.model(output_modes=("prompted_json",)))

    assert execution.output == Sum(total=5), execution.error
    [call] = execution.model_calls
    assert call.response is not None
    assert call.response.finish_reason == "length"


async def test_a_cut_off_without_a_whole_object_is_still_reasked() -> None:
    async with FakeOpenAIServer([FakeReply.cut_off('{"total": '), '{"total": 5}']) as server:
        execution = await run(server.model(output_modes=("prompted_json",)))
    assert execution.output == Sum(total=5)
    assert "cut off" in (execution.model_calls[0].error or "")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_refused_connection_costs_no_tokens_and_no_unknown_usage() -> None:
    model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{_closed_port()}/v1", timeout=5)
    execution = await run(model, DefaultStep("s", "Hello."))

    assert execution.status.value == "failed"
    assert execution.usage.calls == 4  # the first try and three retries, none reached it
    assert execution.usage.unknown_calls == 0
    assert execution.usage.total_tokens == 0
    assert "connection failed" in (execution.error or "")


def test_an_unknown_quirk_is_named() -> None:
    with pytest.raises(ValueError, match="unknown quirks \\['ignores_everything'\\]"):
        FakeOpenAIServer(quirks={"ignores_everything"})  # type: ignore[arg-type]


async def test_a_prompt_too_long_for_the_context_says_what_to_do() -> None:
    llama = "the request exceeds the available context size, try increasing it"
    async with FakeOpenAIServer([FakeReply.failure(400, llama)]) as server:
        execution = await run(server.model(), DefaultStep("s", "Hello."))
    error = execution.error or ""
    assert error.startswith("fake:fake-model at http://127.0.0.1:")
    assert f"HTTP 400: {llama} (the prompt does not fit the model's context window" in error
    assert "Error:" not in error  # no class names for people to decode
