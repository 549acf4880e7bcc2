"""`OpenAIChatModel` through the step loop, with the real `openai` client over HTTP to
`FakeOpenAIServer`: messages, parallel tool calls, tool results, usage, finish reasons,
streaming, settings and refusals."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import warnings
from typing import Any

import openai
import pytest
from agent_helpers import numbered

from minions import (
    AgentContext,
    DefaultStep,
    Message,
    MessageBundle,
    ModelError,
    Prompt,
    StepExecutor,
    StepStatus,
    TransientModelError,
    tool,
)
from minions.events import (
    ModelCallCompleted,
    ModelCallFailed,
    ModelCallStarted,
    RetryScheduled,
    StepCompleted,
    TokenDelta,
    ToolCallCompleted,
)
from minions.models import OpenAIChatModel
from minions.testing import FakeOpenAIServer, FakeReply

from .conftest import FAST


@tool
def get_weather(city: str) -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "sky": "clear", "celsius": 21}


@tool
def get_time(tz: str) -> dict[str, str]:
    """The time in a time zone."""
    return {"tz": tz, "time": "12:00"}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [get_weather, get_time, add]


def travel_step(**options: Any) -> DefaultStep:
    return DefaultStep(
        "travel",
        MessageBundle(system="You plan trips.", goal="Weather and time in Paris, and 2+3."),
        tools={"get_weather", "get_time", "add"},
        **options,
    )


async def test_multi_turn_tool_loop_with_parallel_tool_calls() -> None:
    async with FakeOpenAIServer(
        [
            [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})],
            [("add", {"a": 2, "b": 3})],
            "Sunny, noon, and 5.",
        ]
    ) as server:
        context = AgentContext(model=server.model(), tools=TOOLS, config=FAST)
        execution = await StepExecutor(travel_step(), context).execute()

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert execution.output == "Sunny, noon, and 5."
    assert [c.name for c in execution.tool_calls] == ["get_weather", "get_time", "add"]
    assert [c.response.result for c in execution.tool_calls if c.response][2] == 5

    first, second, third = server.chat_requests
    assert first.tools == ["add", "get_time", "get_weather"]
    assert [m["role"] for m in first.messages] == ["system", "user"]
    # The second request carries the parallel calls and one result per call id, in order.
    assistant, result_1, result_2 = second.messages[2:]
    ids = [call["id"] for call in assistant["tool_calls"]]
    assert [call["function"]["name"] for call in assistant["tool_calls"]] == [
        "get_weather",
        "get_time",
    ]
    assert [result_1["tool_call_id"], result_2["tool_call_id"]] == ids
    assert '"sky": "clear"' in result_1["content"] or '"sky":"clear"' in result_1["content"]
    assert result_2["role"] == "tool"
    assert [m["role"] for m in third.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    assert third.messages[-1]["content"] == "5"
    assert execution.usage.calls == 3
    assert execution.usage.complete
    assert execution.usage.prompt_tokens > 0
    assert execution.usage.completion_tokens > 0


async def test_usage_is_reported_per_call_and_summed() -> None:
    async with FakeOpenAIServer(
        [
            FakeReply.calls(("add", {"a": 1, "b": 1})).with_usage(100, 7),
            FakeReply.text("2").with_usage(120, 1),
        ]
    ) as server:
        context = AgentContext(model=server.model(), tools=TOOLS, config=FAST)
        execution = await StepExecutor(DefaultStep("s", "1+1", tools={"add"}), context).execute()

    assert [c.usage.total_tokens for c in execution.model_calls] == [107, 121]
    assert (execution.usage.prompt_tokens, execution.usage.completion_tokens) == (220, 8)
    assert context.usage == execution.usage


async def test_missing_usage_is_unknown_not_zero() -> None:
    async with FakeOpenAIServer(
        [FakeReply.calls(("add", {"a": 1, "b": 1})).without_usage(), "2"]
    ) as server:
        context = AgentContext(model=server.model(), tools=TOOLS, config=FAST)
        execution = await StepExecutor(DefaultStep("s", "1+1", tools={"add"}), context).execute()

    assert execution.status is StepStatus.COMPLETED
    assert execution.model_calls[0].usage.unknown_calls == 1
    assert execution.usage.calls == 2
    assert execution.usage.unknown_calls == 1
    assert not execution.usage.complete


async def test_finish_reason_and_model_are_recorded() -> None:
    async with FakeOpenAIServer(["hello"], models=("tiny-1",)) as server:
        response = await server.model().call(Prompt(messages=(Message.user("hi"),)))
    assert response.finish_reason == "stop"
    assert response.model == "tiny-1"
    assert response.text == "hello"
    assert response.output is None
    assert response.output_mode is None


async def test_streaming_emits_token_deltas_in_order() -> None:
    events: list[Any] = []
    async with FakeOpenAIServer(["Sunny in Paris today."]) as server:
        context = AgentContext(
            model=server.model(stream=True), config=FAST, listeners=[events.append]
        )
        execution = await StepExecutor(DefaultStep("s", "Weather?"), context).execute()
        request = server.chat_requests[0]

    assert request.stream
    assert request.body["stream_options"] == {"include_usage": True}
    assert execution.output == "Sunny in Paris today."
    kinds = [type(e) for e in events if isinstance(e, ModelCallStarted | TokenDelta)]
    assert kinds[0] is ModelCallStarted
    deltas = [e for e in events if isinstance(e, TokenDelta)]
    assert [d.text for d in deltas] == ["Sunny ", "in ", "Paris ", "today."]
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs)
    started = next(i for i, e in enumerate(events) if isinstance(e, ModelCallStarted))
    completed = next(i for i, e in enumerate(events) if isinstance(e, ModelCallCompleted))
    assert all(started < events.index(d) < completed for d in deltas)
    assert isinstance(events[-1], StepCompleted)
    # Usage came in the stream's last chunk.
    assert execution.usage.complete
    assert execution.usage.completion_tokens > 0


async def test_streaming_over_retries_keeps_events_in_order() -> None:
    events: list[Any] = []
    async with FakeOpenAIServer(
        [FakeReply.rate_limit(retry_after=0.01), FakeReply.cut_off("Sunny in"), "Sunny in Paris."]
    ) as server:
        context = AgentContext(
            model=server.model(stream=True), config=FAST, listeners=[events.append]
        )
        execution = await StepExecutor(DefaultStep("s", "Weather?"), context).execute()

    assert execution.output == "Sunny in Paris."

    def describe(event: Any) -> str:
        if isinstance(event, TokenDelta):
            return f"delta {event.text!r}"
        if isinstance(event, RetryScheduled):
            return f"retry {event.target}"
        if isinstance(event, ModelCallStarted | ModelCallFailed | ModelCallCompleted):
            return f"{event.kind} {event.attempt}"
        return str(event.kind)

    # A 429 before any token, then a stream cut off at the length limit (its deltas were
    # already shown, then the failure), a re-ask, and the whole answer.
    assert [describe(e) for e in events] == [
        "step_started",
        "model_call_started 1",
        "model_call_failed 1",
        "retry model",
        "model_call_started 2",
        "delta 'Sunny '",
        "delta 'in'",
        "model_call_failed 2",
        "completion_decided",  # the re-ask, a decision like a link's
        "retry output",
        "model_call_started 3",
        "delta 'Sunny '",
        "delta 'in '",
        "delta 'Paris.'",
        "model_call_completed 3",
        "completion_decided",
        "step_completed",
    ]
    # Numbered in order without a gap; a token delta carries the number of the event before
    # it (it is never stored).
    assert numbered(events)
    # The cut-off attempt left nothing in the conversation but the re-ask note.
    assert [m.role for m in execution.messages] == ["user", "user", "assistant"]


async def test_streamed_tool_calls_are_joined() -> None:
    events: list[Any] = []
    async with FakeOpenAIServer(
        [[("get_weather", {"city": "Paris"}), ("add", {"a": 20, "b": 22})], "Done."]
    ) as server:
        context = AgentContext(
            model=server.model(stream=True), tools=TOOLS, config=FAST, listeners=[events.append]
        )
        execution = await StepExecutor(travel_step(), context).execute()

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert [c.arguments for c in execution.tool_calls] == [{"city": "Paris"}, {"a": 20, "b": 22}]
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [e.content for e in completed][1] == "42"
    assert [e.text for e in events if isinstance(e, TokenDelta)] == ["Done."]


async def test_streaming_without_stream_usage_support_falls_back() -> None:
    async with FakeOpenAIServer(["one", "two"], reject={"stream_options"}) as server:
        model = server.model(stream=True)
        context = AgentContext(model=model, config=FAST, listeners=[lambda e: None])
        first = await StepExecutor(DefaultStep("a", "go"), context).execute()
        second = await StepExecutor(DefaultStep("b", "go"), context).execute()
        requests = server.chat_requests

    assert (first.output, second.output) == ("one", "two")
    # Refused once, remembered: the second step streams without asking for usage.
    assert ["stream_options" in r.body for r in requests] == [True, False, False]
    assert "stream_options" in model.rejected
    assert not first.usage.complete  # A stream without usage is honest about it.


async def test_no_listener_means_no_streaming() -> None:
    async with FakeOpenAIServer(["plain"]) as server:
        context = AgentContext(model=server.model(stream=True), config=FAST)
        execution = await StepExecutor(DefaultStep("s", "go"), context).execute()
        assert not server.chat_requests[0].stream
    assert execution.output == "plain"


async def test_settings_pass_through_and_unknown_ones_go_in_the_body() -> None:
    async with FakeOpenAIServer(["ok", "ok"]) as server:
        model = server.model(settings={"temperature": 0.1, "num_ctx": 8192})
        await model.call(Prompt(messages=(Message.user("hi"),), settings={"seed": 7}))
        await model.call(Prompt(messages=(Message.user("hi"),), settings={"temperature": 0.9}))
        first, second = server.chat_requests
    assert first.body["temperature"] == 0.1
    assert first.body["seed"] == 7
    assert first.body["num_ctx"] == 8192
    assert second.body["temperature"] == 0.9


async def test_tool_choice_none_sends_no_tools() -> None:
    async with FakeOpenAIServer(["ok", "ok"]) as server:
        model = server.model()
        spec = add.spec
        await model.call(Prompt(messages=(Message.user("hi"),), tools=(spec,), tool_choice="none"))
        await model.call(
            Prompt(messages=(Message.user("hi"),), tools=(spec,), tool_choice="required")
        )
        first, second = server.chat_requests
    assert "tools" not in first.body
    assert second.tools == ["add"]
    assert second.tool_choice == "required"


async def test_tool_calls_without_ids_get_ids() -> None:
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "add", "arguments": "{}"}},
                        {"type": "function", "function": {"name": "add", "arguments": "{}"}},
                    ],
                },
            }
        ],
    }
    async with FakeOpenAIServer([FakeReply.raw(body)]) as server:
        response = await server.model().call(Prompt(messages=(Message.user("hi"),)))
    ids = [call.id for call in response.tool_calls]
    assert all(ids)
    assert len(set(ids)) == 2
    assert response.usage.unknown_calls == 1


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (400, "This model's maximum context length is 8192 tokens.", "maximum context length"),
        (403, "You are not allowed to use this model.", "not allowed"),
        (404, "The model `nope` does not exist.", "ollama pull"),
        (422, "messages: field required", "field required"),
    ],
)
async def test_client_errors_fail_the_step_without_retry(
    status: int, message: str, expected: str
) -> None:
    async with FakeOpenAIServer([FakeReply.failure(status, message), "never"]) as server:
        context = AgentContext(model=server.model(), config=FAST)
        execution = await StepExecutor(DefaultStep("s", "go"), context).execute()
        assert len(server.chat_requests) == 1

    assert execution.status is StepStatus.FAILED
    assert execution.error is not None
    assert f"HTTP {status}" in execution.error
    assert expected in execution.error
    assert len(execution.model_calls) == 1


async def test_401_hints_at_the_key_without_showing_it() -> None:
    key = "sk-live-0123456789abcdef"
    async with FakeOpenAIServer(api_key="sk-the-right-one") as server:
        context = AgentContext(model=server.model(api_key=key), config=FAST)
        execution = await StepExecutor(DefaultStep("s", "go"), context).execute()
    assert execution.status is StepStatus.FAILED
    assert execution.error is not None
    assert "HTTP 401" in execution.error
    assert "OPENAI_API_KEY" in execution.error
    assert key not in execution.error
    assert len(execution.model_calls) == 1


async def test_connection_refused_is_retried_then_fails_clearly() -> None:
    server = FakeOpenAIServer().start()
    model = server.model(timeout=2.0)
    server.stop()  # Nothing listens on that port any more.
    context = AgentContext(model=model, config=dataclasses.replace(FAST, max_model_retries=2))
    execution = await StepExecutor(DefaultStep("s", "go"), context).execute()
    assert execution.status is StepStatus.FAILED
    assert execution.error is not None
    assert "after 3 attempts" in execution.error
    assert "connection failed" in execution.error
    assert len(execution.model_calls) == 3


def test_one_model_serves_one_event_loop_after_another() -> None:
    # Each `execute_sync` runs its own event loop; pooled connections of the last one are dead.
    with FakeOpenAIServer(["one", "two", "three"]) as server:
        model = server.model()
        outputs = [
            StepExecutor(DefaultStep("s", "go"), AgentContext(model=model)).execute_sync().output
            for _ in range(3)
        ]
        assert len(server.chat_requests) == 3
    assert outputs == ["one", "two", "three"]


def test_each_event_loop_gets_its_own_client_closed_with_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 25: a client left open by an ended loop was freed while the next loop ran, and its
    # cleanup task failed there with "Event loop is closed" (a traceback nobody asked for).
    # What earlier tests left for the collector (an unclosed socket in a cycle, a loop's
    # task) is freed before this test watches, not blamed on it.
    gc.collect()
    caplog.set_level(logging.ERROR, logger="asyncio")
    caplog.clear()
    prompt = Prompt(messages=(Message.user("go"),))

    async def ask(model: OpenAIChatModel) -> str:
        response = await model.call(prompt)
        gc.collect()  # What an earlier loop left behind is freed while this one runs...
        await asyncio.sleep(0)  # ...and whatever that scheduled gets its turn.
        return response.text

    with (
        FakeOpenAIServer(["one", "two", "three", "four"]) as server,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always", ResourceWarning)
        model = server.model()
        answers = [asyncio.run(ask(model)), asyncio.run(ask(model))]
        step = StepExecutor(DefaultStep("s", "go"), AgentContext(model=model))
        answers += [step.execute_sync().result(), asyncio.run(ask(model))]
        gc.collect()

    assert answers == ["one", "two", "three", "four"]
    assert [r.getMessage() for r in caplog.records] == []
    # Every loop's connections were closed with it: none is found open when freed.
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_client_given_as_is_serves_one_event_loop_and_says_so() -> None:
    prompt = Prompt(messages=(Message.user("go"),))
    with FakeOpenAIServer(["one", "two"]) as server:
        own = openai.AsyncOpenAI(base_url=server.url, api_key="sk-test")
        model = OpenAIChatModel("fake-model", client=own)
        assert asyncio.run(model.call(prompt)).text == "one"
        with pytest.raises(ModelError) as raised:
            asyncio.run(model.call(prompt))
        assert len(server.chat_requests) == 1
    assert "client=lambda: openai.AsyncOpenAI(" in str(raised.value)
    assert not isinstance(raised.value, TransientModelError)


def test_construction_needs_a_key_for_openai_only() -> None:
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")
    local = OpenAIChatModel("llama3.2:3b", base_url="http://localhost:11434/v1/")
    assert local.base_url == "http://localhost:11434/v1"
    assert repr(local) == "OpenAIChatModel('llama3.2:3b', base_url='http://localhost:11434/v1')"


def test_bad_output_modes_are_named() -> None:
    with pytest.raises(ModelError, match=r"unknown output mode 'xml'.*json_schema"):
        OpenAIChatModel("m", base_url="http://localhost:1/v1", output_modes=["xml"])  # type: ignore[list-item]


@pytest.mark.parametrize("client", ["built", "given", "function"])
async def test_the_client_never_retries_on_its_own(client: str) -> None:
    # One retry boundary: with the step loop's retries off, a 500 is one request, not three;
    # also with a client of the user's own, built with the client's default of 2 retries.
    config = dataclasses.replace(FAST, max_model_retries=0)
    async with FakeOpenAIServer([FakeReply.server_error(), "ok"]) as server:
        own = openai.AsyncOpenAI(base_url=server.url, api_key="sk-test")
        assert own.max_retries == 2
        model = {
            "built": server.model(),
            "given": OpenAIChatModel("fake-model", client=own),
            "function": OpenAIChatModel("fake-model", client=lambda: own),
        }[client]
        context = AgentContext(model=model, config=config)
        execution = await StepExecutor(DefaultStep("s", "go"), context).execute()
        assert len(server.chat_requests) == 1
    assert execution.status is StepStatus.FAILED
    assert "HTTP 500" in (execution.error or "")


def test_the_api_key_is_in_no_plain_attribute_repr_or_traceback() -> None:
    import traceback

    from minions._text import Secret

    sentinel = "sk-SENTINEL-0123456789"
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1", api_key=sentinel)
    assert sentinel not in repr(model)
    assert sentinel not in repr(vars(model))
    assert sentinel not in str(vars(model))
    plain = [v for v in vars(model).values() if isinstance(v, str | bytes | list | dict | tuple)]
    assert all(sentinel not in repr(v) for v in plain)
    secret = vars(model)["_secret"]
    assert isinstance(secret, Secret)
    assert repr(secret) == str(secret) == "Secret('**********')"
    assert secret.get() == sentinel

    # A traceback printing the locals of a frame that holds the model (not the key itself).
    def failing(model: OpenAIChatModel) -> None:
        client = vars(model)["_first"]
        raise RuntimeError(f"failed with {model!r} and {client!r}")

    with pytest.raises(RuntimeError) as raised:
        failing(model)
    assert raised.tb is not None
    inner = traceback.walk_tb(raised.tb.tb_next)  # not this test's own frame
    shown = "".join(traceback.StackSummary.extract(inner, capture_locals=True).format())
    shown += str(raised.value)
    assert "failing" in shown
    assert sentinel not in shown
