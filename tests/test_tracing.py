"""OpenTelemetry spans of runs: names, kinds, the parent tree, GenAI attributes, retries as
failed attempt spans, no content unless asked for, no secrets, no sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from agent_helpers import FAST, HANG_GUARD, Recorder, model_calls_started, step
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from minions import (
    AgentExecutor,
    AgentRecipe,
    AgentResult,
    DefaultStep,
    LoopStep,
    MissingExtraError,
    ModelError,
    OutputInstructions,
    RecipeStep,
    StepStatus,
    Tool,
    TransientModelError,
    tool,
)
from minions.models import OpenAIChatModel
from minions.testing import FakeOpenAIServer, FakeReply, ScriptedModel

CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SECRET_WORD = "hunter2-secret"


@pytest.fixture(autouse=True)
def _no_capture_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CAPTURE, raising=False)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def provider_for(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def flaky_weather() -> Tool:
    """A tool that raises on its first call and answers after."""
    calls = 0

    def weather(city: str) -> dict[str, Any]:
        """The weather in a city."""
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("weather service hiccup")
        return {"city": city, "sky": "clear"}

    return tool(weather)


def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term}: a small flying insect"


def scripted_recipe() -> AgentRecipe:
    """`fetch` asks for two tools at once (one fails once, then answers); then `left` and
    `right` run in parallel: `left`'s first model call fails (429) and is retried, `right`'s
    model fails for good."""
    fetch = DefaultStep(
        "fetch",
        "Find out about bees.",
        tools=["lookup", "weather"],
        model=ScriptedModel(
            [[("lookup", {"term": "bee"}), ("weather", {"city": "Oslo"})], "fetched"],
            name="openai:gpt-test",
        ),
    )
    left = DefaultStep(
        "left",
        "Summarise {{ fetch.output }}.",
        depends_on=["fetch"],
        model=ScriptedModel(
            [TransientModelError("rate limited", status_code=429), "left done"],
            name="openai:gpt-test",
        ),
    )
    right = DefaultStep(
        "right",
        "Criticise {{ fetch.output }}.",
        depends_on=["fetch"],
        model=ScriptedModel([ModelError("bad request", status_code=400)], name="ollama:tiny"),
    )
    return AgentRecipe(
        id="bees",
        steps=[fetch, left, right],
        tools=[tool(lookup), flaky_weather()],
        config=FAST,
    )


async def traced_run(
    exporter: InMemorySpanExporter, recipe: AgentRecipe, **options: Any
) -> tuple[AgentResult, list[ReadableSpan]]:
    executor = AgentExecutor(tracer_provider=provider_for(exporter), **options)
    result = await executor.execute(recipe)
    return result, list(exporter.get_finished_spans())


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def parent_of(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    for other in spans:
        if other.context is not None and other.context.span_id == span.parent.span_id:
            return other
    raise AssertionError(f"the parent of {span.name!r} was not exported")


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_a_run_is_a_tree_of_workflow_agent_chat_and_tool_spans(
    exporter: InMemorySpanExporter,
) -> None:
    result, spans = await traced_run(exporter, scripted_recipe())
    assert result.status is StepStatus.FAILED

    run = one(spans, "invoke_workflow bees")
    assert run.kind is SpanKind.INTERNAL
    assert parent_of(run, spans) is None
    assert attrs(run)["gen_ai.operation.name"] == "invoke_workflow"
    assert attrs(run)["minions.run.id"] == result.run_id
    assert run.status.status_code is StatusCode.ERROR
    # Run totals are minions' own, so backends do not count the calls' tokens twice.
    assert attrs(run)["minions.usage.calls"] == result.usage.calls == 5
    assert attrs(run)["minions.usage.input_tokens"] == result.usage.prompt_tokens
    assert not any(key.startswith("gen_ai.usage") for key in attrs(run))

    steps = {s.name: s for s in spans if s.name.startswith("invoke_agent ")}
    assert set(steps) == {"invoke_agent fetch", "invoke_agent left", "invoke_agent right"}
    for span in steps.values():
        # Parallel steps (left, right) are siblings: every step is a child of the run.
        assert parent_of(span, spans) is run
        assert span.kind is SpanKind.INTERNAL
        assert attrs(span)["gen_ai.operation.name"] == "invoke_agent"
        assert attrs(span)["minions.step.visit"] == 1
        assert attrs(span)["minions.step.kind"] == "agent"
    assert steps["invoke_agent fetch"].status.status_code is StatusCode.UNSET
    right = steps["invoke_agent right"]
    assert right.status.status_code is StatusCode.ERROR
    assert "bad request" in (right.status.description or "")

    chats = [s for s in spans if s.name.startswith("chat ")]
    assert sorted(s.name for s in chats) == ["chat gpt-test"] * 4 + ["chat tiny"]
    by_step: dict[str, list[ReadableSpan]] = {}
    for chat in chats:
        assert chat.kind is SpanKind.CLIENT
        parent = parent_of(chat, spans)
        assert parent is not None
        by_step.setdefault(parent.name, []).append(chat)
        assert attrs(chat)["gen_ai.operation.name"] == "chat"
        assert "gen_ai.output.type" not in attrs(chat)  # text: no output format asked for
    assert {k: len(v) for k, v in by_step.items()} == {
        "invoke_agent fetch": 2,
        "invoke_agent left": 2,
        "invoke_agent right": 1,
    }
    first = min(by_step["invoke_agent fetch"], key=lambda s: s.start_time or 0)
    assert attrs(first)["gen_ai.provider.name"] == "openai"
    assert attrs(first)["gen_ai.request.model"] == "gpt-test"
    assert attrs(first)["gen_ai.response.model"] == "openai:gpt-test"
    assert attrs(first)["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert attrs(first)["gen_ai.usage.input_tokens"] > 0
    assert attrs(first)["gen_ai.usage.output_tokens"] > 0

    # The 429 is visible: a failed attempt span with error.type, then the attempt that worked.
    failed, retried = sorted(by_step["invoke_agent left"], key=lambda s: s.start_time or 0)
    assert failed.status.status_code is StatusCode.ERROR
    assert attrs(failed)["error.type"] == "minions.errors.TransientModelError"
    assert attrs(failed)["minions.attempt"] == 1
    assert retried.status.status_code is StatusCode.UNSET
    assert attrs(retried)["minions.attempt"] == 2
    assert (failed.end_time or 0) <= (retried.start_time or 0)
    (tiny,) = by_step["invoke_agent right"]
    assert attrs(tiny)["gen_ai.provider.name"] == "ollama"
    assert attrs(tiny)["error.type"] == "minions.errors.ModelError"

    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert sorted(s.name for s in tools) == [
        "execute_tool lookup",
        "execute_tool weather",
        "execute_tool weather",
    ]
    for span in tools:
        assert span.kind is SpanKind.INTERNAL
        assert parent_of(span, spans) is steps["invoke_agent fetch"]
        assert attrs(span)["gen_ai.operation.name"] == "execute_tool"
        assert attrs(span)["gen_ai.tool.call.id"].startswith("call_")
    weather_failed, weather_ok = sorted(
        named(tools, "execute_tool weather"), key=lambda s: s.start_time or 0
    )
    assert attrs(weather_failed)["error.type"] == "ConnectionError"
    assert attrs(weather_failed)["minions.attempt"] == 1
    assert attrs(weather_ok)["minions.attempt"] == 2
    assert weather_ok.status.status_code is StatusCode.UNSET
    assert attrs(weather_failed)["gen_ai.tool.call.id"] == attrs(weather_ok)["gen_ai.tool.call.id"]


CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "gen_ai.tool.definitions",
}


def everything_written(spans: Sequence[ReadableSpan]) -> str:
    """Every name, attribute, status and event of the spans, as one text."""
    parts = []
    for span in spans:
        parts.append(span.name)
        parts.append(json.dumps(attrs(span), default=str))
        parts.append(span.status.description or "")
        parts.extend(json.dumps(dict(e.attributes or {}), default=str) for e in span.events)
    return "\n".join(parts)


async def test_no_message_content_by_default(exporter: InMemorySpanExporter) -> None:
    _, spans = await traced_run(exporter, scripted_recipe())
    assert spans
    for span in spans:
        assert not CONTENT_KEYS & set(attrs(span)), span.name
    written = everything_written(spans)
    assert "Find out about bees" not in written
    assert "small flying insect" not in written


async def test_content_is_written_when_the_environment_asks(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CAPTURE, "SPAN_ONLY")
    _, spans = await traced_run(exporter, scripted_recipe())
    fetch_chats = sorted(
        (
            s
            for s in spans
            if s.name == "chat gpt-test" and parent_of(s, spans) is one(spans, "invoke_agent fetch")
        ),
        key=lambda s: s.start_time or 0,
    )
    asked = json.loads(attrs(fetch_chats[0])["gen_ai.input.messages"])
    assert asked[0]["role"] == "user"
    assert asked[0]["parts"][0] == {"type": "text", "content": asked[0]["parts"][0]["content"]}
    assert "Find out about bees." in asked[0]["parts"][0]["content"]
    answered = json.loads(attrs(fetch_chats[0])["gen_ai.output.messages"])
    assert answered[0]["role"] == "assistant"
    assert answered[0]["finish_reason"] == "tool_calls"
    calls = [p for p in answered[0]["parts"] if p["type"] == "tool_call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("lookup", {"term": "bee"}),
        ("weather", {"city": "Oslo"}),
    ]
    # The second call sees the tools' results, in the conventions' shape.
    then = json.loads(attrs(fetch_chats[1])["gen_ai.input.messages"])
    responses = [p for m in then if m["role"] == "tool" for p in m["parts"]]
    assert {"type": "tool_call_response", "id": calls[0]["id"]} | {
        "response": "bee: a small flying insect"
    } in responses
    # The tools offered, in the conventions' shape.
    offered = json.loads(attrs(fetch_chats[0])["gen_ai.tool.definitions"])
    assert sorted(t["name"] for t in offered) == ["lookup", "weather"]
    assert all(t["type"] == "function" and t["parameters"]["type"] == "object" for t in offered)
    lookup_span = one(spans, "execute_tool lookup")
    assert json.loads(attrs(lookup_span)["gen_ai.tool.call.arguments"]) == {"term": "bee"}
    assert attrs(lookup_span)["gen_ai.tool.call.result"] == "bee: a small flying insect"


async def test_content_setting_wins_over_the_environment(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CAPTURE, "SPAN_ONLY")
    _, spans = await traced_run(exporter, scripted_recipe(), capture_message_content=False)
    assert not any(CONTENT_KEYS & set(attrs(s)) for s in spans)
    exporter.clear()
    monkeypatch.setenv(CAPTURE, "NO_CONTENT")
    _, spans = await traced_run(exporter, scripted_recipe(), capture_message_content=True)
    assert any("gen_ai.input.messages" in attrs(s) for s in spans)


async def test_loop_items_are_agent_spans_under_their_loop_step(
    exporter: InMemorySpanExporter,
) -> None:
    model = ScriptedModel(["one", "two"], name="openai:gpt-test")
    body = DefaultStep("each", "Say {{ loop.item }}.", model=model)
    recipe = AgentRecipe(id="looping", steps=[LoopStep(body, items=["a", "b"], parallel=2)])
    result, spans = await traced_run(exporter, recipe)
    assert result.status is StepStatus.COMPLETED, result.error
    steps = named(spans, "invoke_agent each")
    (outer,) = [s for s in steps if attrs(s)["minions.step.kind"] == "loop"]
    assert parent_of(outer, spans) is one(spans, "invoke_workflow looping")
    items = [s for s in steps if s is not outer]
    assert sorted(attrs(s)["minions.step.item"] for s in items) == [0, 1]
    assert all(parent_of(s, spans) is outer for s in items)
    assert all(parent_of(c, spans) in items for c in named(spans, "chat gpt-test"))


class Verdict(BaseModel):
    bees: bool
    why: str


async def test_no_secrets_on_spans_against_a_real_http_model(
    exporter: InMemorySpanExporter,
) -> None:
    """Content capture on, an API key, a password in the base URL and a token in a tool's
    arguments: none of them is written; the server's address and port are."""
    seen: list[str] = []

    def fetch_page(url: str) -> str:
        """Fetch a page."""
        seen.append(url)
        return "bees are insects"

    secret_url = f"https://reader:{SECRET_WORD}@example.test/page?token={SECRET_WORD}"
    replies = [
        FakeReply.rate_limit(0),
        FakeReply.calls(("fetch_page", {"url": secret_url})),
        FakeReply.structured(Verdict(bees=True, why="they are insects")),
    ]
    with FakeOpenAIServer(replies) as server:
        port = server.port
        base_url = server.url.replace("//", f"//user:{SECRET_WORD}@", 1)
        model = OpenAIChatModel(
            "fake-model", base_url=base_url, api_key=f"sk-{SECRET_WORD}", provider="openai"
        )
        step = DefaultStep(
            "judge",
            "Are bees insects? Read the page first.",
            tools=["fetch_page"],
            output=OutputInstructions(output_type=Verdict),
            model=model,
        )
        recipe = AgentRecipe(id="secrets", steps=[step], tools=[tool(fetch_page)], config=FAST)
        result, spans = await traced_run(exporter, recipe, capture_message_content=True)
        await model.aclose()
    assert result.status is StepStatus.COMPLETED, result.error
    assert seen == [secret_url]  # the tool got the real URL; spans get none of it
    written = everything_written(spans)
    assert SECRET_WORD not in written
    assert "gen_ai.input.messages" in written  # content was captured, without the secrets

    chats = sorted(named(spans, "chat fake-model"), key=lambda s: s.start_time or 0)
    assert len(chats) == 3
    for chat in chats:
        assert attrs(chat)["server.address"] == "127.0.0.1"
        assert attrs(chat)["server.port"] == port
        assert attrs(chat)["gen_ai.provider.name"] == "openai"
        assert attrs(chat)["gen_ai.output.type"] == "json"
    assert attrs(chats[0])["error.type"] == "minions.errors.TransientModelError"
    assert attrs(chats[2])["gen_ai.response.model"] == "fake-model"
    structured = result.executions[0].model_calls[-1].output_mode
    assert structured in ("json_schema", "tool")
    assert attrs(chats[2])["minions.output_mode"] == structured
    arguments = attrs(one(spans, "execute_tool fetch_page"))["gen_ai.tool.call.arguments"]
    assert json.loads(arguments) == {"url": "https://***@example.test/page?token=***"}


async def test_an_instrumented_run_without_an_exporter_opens_no_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The library builds no exporter: even with the OTLP variables set, spans of a run go
    nowhere the application did not send them."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv(CAPTURE, "SPAN_ONLY")
    opened: list[str] = []

    def no_network(*args: Any, **kwargs: Any) -> Any:
        # Recorded, not only raised: an exporter's thread would swallow the exception.
        opened.append(repr(args))
        raise OSError("no network in this test")

    for name in ("connect", "connect_ex", "sendto", "sendmsg"):
        monkeypatch.setattr(socket.socket, name, no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    provider = TracerProvider()
    executor = AgentExecutor(tracer_provider=provider)
    result = await executor.execute(scripted_recipe())
    provider.shutdown()  # whatever was to be sent has been by now
    assert opened == []
    statuses = {e.step_id: e.status for e in result.executions}
    assert statuses == {
        "fetch": StepStatus.COMPLETED,
        "left": StepStatus.COMPLETED,
        "right": StepStatus.FAILED,
    }


async def test_spans_made_inside_a_tool_nest_under_its_execute_tool_span(
    exporter: InMemorySpanExporter,
) -> None:
    provider = provider_for(exporter)
    tracer = provider.get_tracer("the-application")

    def measure(n: int) -> int:
        """Measure something, tracing it."""
        with tracer.start_as_current_span("measuring"):
            return n + 1

    step = DefaultStep(
        "count",
        "Count.",
        tools=["measure"],
        model=ScriptedModel([[("measure", {"n": 1})], "2"], name="openai:gpt-test"),
    )
    recipe = AgentRecipe(id="nesting", steps=[step], tools=[tool(measure)])
    result = await AgentExecutor(tracer_provider=provider).execute(recipe)
    assert result.status is StepStatus.COMPLETED
    spans = list(exporter.get_finished_spans())
    assert parent_of(one(spans, "measuring"), spans) is one(spans, "execute_tool measure")


async def test_a_recipe_step_runs_its_recipe_as_a_workflow_inside_the_step(
    exporter: InMemorySpanExporter,
) -> None:
    inner = AgentRecipe(
        id="inner",
        steps=[DefaultStep("think", "Think.", model=ScriptedModel(["ok"], name="openai:m"))],
    )
    recipe = AgentRecipe(id="outer", steps=[RecipeStep("nested", inner)])
    result, spans = await traced_run(exporter, recipe)
    assert result.status is StepStatus.COMPLETED, result.error
    outer_step = one(spans, "invoke_agent nested")
    assert attrs(outer_step)["minions.step.kind"] == "recipe"
    inner_run = one(spans, "invoke_workflow inner")
    assert parent_of(inner_run, spans) is outer_step
    assert parent_of(one(spans, "invoke_agent think"), spans) is inner_run
    assert parent_of(outer_step, spans) is one(spans, "invoke_workflow outer")


def test_tracing_without_the_opentelemetry_api_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'minions\[otel\]'"):
        AgentExecutor(tracer_provider=TracerProvider())


def test_runs_without_a_tracer_provider_never_import_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from minions import AgentExecutor, AgentRecipe, DefaultStep\n"
        "from minions.testing import ScriptedModel\n"
        "step = DefaultStep('a', 'Do a.', model=ScriptedModel(['done']))\n"
        "result = AgentExecutor().execute_sync(AgentRecipe(id='r', steps=[step]))\n"
        "assert result.output == 'done', result.error\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_a_call_refused_before_the_tool_ran_is_one_failed_span(
    exporter: InMemorySpanExporter,
) -> None:
    step = DefaultStep(
        "ask",
        "Ask.",
        tools=["lookup"],
        model=ScriptedModel(
            [[("lookup", {"wrong": 1}), ("nope", {})], "gave up"], name="openai:gpt-test"
        ),
    )
    recipe = AgentRecipe(id="refusals", steps=[step], tools=[tool(lookup)])
    result, spans = await traced_run(exporter, recipe)
    assert result.status is StepStatus.COMPLETED, result.error
    step_span = one(spans, "invoke_agent ask")
    for name in ("execute_tool lookup", "execute_tool nope"):
        refused = one(spans, name)
        assert refused.status.status_code is StatusCode.ERROR
        assert attrs(refused)["error.type"] == "minions.errors.ToolError"
        assert attrs(refused)["minions.attempt"] == 1
        assert parent_of(refused, spans) is step_span


async def test_a_cancelled_run_ends_every_span_it_started(exporter: InMemorySpanExporter) -> None:
    recorder = Recorder()
    never = asyncio.Event()
    stuck = step("stuck", gate=never)
    recipe = AgentRecipe(id="cancelled", steps=[stuck])
    executor = AgentExecutor(tracer_provider=provider_for(exporter))
    task = asyncio.create_task(executor.execute(recipe, listeners=[recorder]))
    await asyncio.wait_for(recorder.until(model_calls_started(1)), HANG_GUARD)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    spans = list(exporter.get_finished_spans())
    assert sorted(s.name for s in spans) == [
        "chat stuck",
        "invoke_agent stuck",
        "invoke_workflow cancelled",
    ]
    for span in spans:
        assert span.status.status_code is StatusCode.ERROR
    assert attrs(one(spans, "chat stuck"))["error.type"] == "cancelled"
    step_span = one(spans, "invoke_agent stuck")
    assert attrs(step_span)["error.type"] == "cancelled"
    assert step_span.status.description == "step 'stuck' was cancelled"
