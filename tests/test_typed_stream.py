"""Streaming asked for by the caller: `step.stream()`, `StepExecutor.stream()` and
`AgentExecutor.stream()` make the model stream whatever its default; deltas of a retried
attempt are marked; a model that does not stream is said once; a stream abandoned midway
cancels its step and leaves nothing running."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import warnings
import weakref
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    Message,
    Model,
    ModelCallResponse,
    Prompt,
    StepExecutor,
    StepStatus,
    StreamingWarning,
    Usage,
    tool,
)
from minions.events import Event, TokenDelta
from minions.models import TokenCallback
from minions.testing import FakeOpenAIServer, ScriptedModel


class Advice(BaseModel):
    approve: bool


class Whole(Model):
    """A model of a user's own that never streams: it ignores `on_token`."""

    name = "whole"

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        return ModelCallResponse(
            message=Message.assistant("one whole answer"), usage=Usage.of_call(3, 3)
        )


class Stalls(Model):
    """Says a few words, then waits forever (until cancelled)."""

    name = "stalls"

    def __init__(self) -> None:
        self.cancelled = False

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        assert on_token is not None
        on_token("Hel")
        on_token("lo")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("not reached")


async def test_a_step_streams_its_text_and_ends_typed() -> None:
    step = DefaultStep("advise", goal="Approve it?", output=Advice)
    async with step.stream(model=ScriptedModel(['{"approve": true}'])) as stream:
        texts = [text async for text in stream.text()]
    assert "".join(texts) == '{"approve": true}'
    assert stream.execution.status is StepStatus.COMPLETED
    assert stream.execution.result() == Advice(approve=True)


async def test_the_stream_yields_the_steps_events_in_order() -> None:
    step = DefaultStep("s", goal="Hi.")
    async with step.stream(model=ScriptedModel(["a b"])) as stream:
        kinds = [event.kind async for event in stream]
    assert kinds == [
        "step_started",
        "model_call_started",
        "token_delta",
        "token_delta",
        "model_call_completed",
        "completion_decided",
        "step_completed",
    ]


async def test_streaming_is_asked_of_a_model_whose_default_is_not_to_stream() -> None:
    async with FakeOpenAIServer(["Bees pollinate flowers.", "Plain."]) as server:
        model = server.model()
        assert model.stream is False
        step = DefaultStep("s", goal="Bees?")
        async with step.stream(model=model) as stream:
            texts = [text async for text in stream.text()]
        assert "".join(texts) == "Bees pollinate flowers."
        assert len(texts) > 1
        assert server.requests[0].body.get("stream") is True
        # Running without streaming makes a plain request.
        execution = await step.run(model=model)
        assert execution.output == "Plain."
        assert "stream" not in server.requests[1].body


async def test_a_fallback_model_streams_from_the_model_that_answers() -> None:
    from minions import ExecutionConfig
    from minions.models import FallbackModel
    from minions.testing import FakeReply

    config = ExecutionConfig(max_model_retries=1, retry_initial_delay=0.01)
    down = FakeOpenAIServer([FakeReply.server_error(503)] * 2)
    async with down, FakeOpenAIServer(["Hello from the second."]) as up:
        step = DefaultStep("s", goal="Hi.", config=config)
        async with step.stream(model=FallbackModel(down.model("a"), up.model("b"))) as stream:
            texts = [text async for text in stream.text()]
        assert len(texts) > 1
        assert "".join(texts) == "Hello from the second."
        assert stream.execution.result() == "Hello from the second."
        assert [call.model for call in stream.execution.model_calls] == ["fake:a"] * 2 + ["fake:b"]
        assert up.requests[0].body.get("stream") is True
        assert down.requests[0].body.get("stream") is True


async def test_an_agent_run_streamed_asks_its_models_to_stream() -> None:
    async with FakeOpenAIServer(["One two three."]) as server:
        recipe = AgentRecipe(id="r", steps=[DefaultStep("s", goal="Count.")])
        stream = AgentExecutor(model=server.model()).stream(recipe)
        deltas = [e.text async for e in stream if isinstance(e, TokenDelta)]
        assert "".join(deltas) == "One two three."
        assert server.requests[0].body.get("stream") is True


async def test_step_executor_streams_one_step_of_a_shared_context() -> None:
    context = AgentContext(model=ScriptedModel(["first", "second"]))
    other: list[Event] = []
    context.events.subscribe(other.append)
    await StepExecutor(DefaultStep("a", goal="A."), context).execute()
    async with StepExecutor(DefaultStep("b", goal="B."), context).stream() as stream:
        events = [event async for event in stream]
    assert {e.step_id for e in events} == {"b"}
    assert stream.execution.output == "second"
    assert context.events.listeners == (other.append,)  # the stream's listener is gone


async def test_a_loop_steps_stream_has_its_items_events_and_no_other_steps() -> None:
    from minions import LoopStep
    from minions.testing import FunctionModel

    context = AgentContext(model=FunctionModel(lambda prompt: "ok"))
    loop = LoopStep(DefaultStep("each", goal="Say {{ loop.item }}."), ["x", "y"])
    # Another step runs meanwhile, its id starting with the loop's (not its items').
    other = StepExecutor(DefaultStep("each_more", goal="More."), context).execute()
    async with StepExecutor(loop, context).stream() as stream:
        events, _ = await asyncio.gather(_read(stream), other)
    assert {e.step_id for e in events} == {"each", "each[0]", "each[1]"}
    assert stream.execution.output == ["ok", "ok"]


async def _read(stream: AsyncIterable[Event]) -> list[Event]:
    return [event async for event in stream]


async def test_deltas_of_a_retried_attempt_are_marked_with_their_attempt() -> None:
    def positive(advice: Advice) -> Advice:
        if not advice.approve:
            raise ValueError("approve it")
        return advice

    step = DefaultStep("s", goal="x", output=Advice, validators=[positive])
    model = ScriptedModel(['{"approve": false}', '{"approve": true}'])
    async with step.stream(model=model) as stream:
        deltas = [e async for e in stream if isinstance(e, TokenDelta)]
    by_attempt: dict[tuple[int, int], str] = {}
    for delta in deltas:
        by_attempt[delta.turn, delta.attempt] = (
            by_attempt.get((delta.turn, delta.attempt), "") + delta.text
        )
    assert by_attempt == {(1, 1): '{"approve": false}', (1, 2): '{"approve": true}'}


async def test_a_model_that_cannot_stream_gives_its_answer_as_one_delta_and_a_warning() -> None:
    model = Whole()
    with pytest.warns(StreamingWarning, match="model 'whole' cannot stream"):
        async with DefaultStep("s", goal="x").stream(model=model) as stream:
            texts = [text async for text in stream.text()]
    assert texts == ["one whole answer"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model: no second warning
        async with DefaultStep("s", goal="x").stream(model=model) as stream:
            assert [text async for text in stream.text()] == ["one whole answer"]


async def test_a_listener_on_a_call_that_does_not_stream_is_warned_once() -> None:
    events: list[Event] = []
    async with FakeOpenAIServer(["one", "two"]) as server:
        model = server.model()
        step = DefaultStep("s", goal="x")
        with pytest.warns(
            StreamingWarning,
            match="answered without streaming, so this run's listeners get no TokenDelta",
        ):
            await step.run(model=model, listeners=[events.append])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await step.run(model=model, listeners=[events.append])
    assert not [e for e in events if isinstance(e, TokenDelta)]


async def test_a_stream_abandoned_midway_cancels_the_step_and_leaves_nothing_running() -> None:
    model = Stalls()
    stopped: list[str] = []

    @tool
    async def never() -> str:
        """Never called."""
        stopped.append("called")
        return ""

    step = DefaultStep("s", goal="Greet.", tools=[never])
    before = asyncio.all_tasks()
    async with step.stream(model=model) as stream:
        async for text in stream.text():
            assert text == "Hel"
            break
    execution = stream.execution
    assert execution.status is StepStatus.FAILED
    assert execution.error == "step 's' was cancelled"
    assert model.cancelled
    assert asyncio.all_tasks() == before
    assert stream._emitter.listeners == ()
    assert stopped == []


async def test_leaving_the_block_early_without_reading_cancels_too() -> None:
    model = Stalls()
    async with DefaultStep("s", goal="x").stream(model=model) as stream:
        async for event in stream:
            if event.kind == "token_delta":
                break
    assert model.cancelled
    assert stream.execution.status is StepStatus.FAILED


async def test_an_error_in_the_block_cancels_the_step_and_propagates() -> None:
    model = Stalls()

    async def fail_while_reading() -> None:
        async with DefaultStep("s", goal="x").stream(model=model) as stream:
            async for _ in stream.text():
                raise KeyError("mine")

    with pytest.raises(KeyError):
        await fail_while_reading()
    assert model.cancelled


def test_a_stream_of_an_agent_executor_used_as_before_still_reads_events() -> None:
    recipe = AgentRecipe(id="r", steps=[DefaultStep("s", goal="x", model=ScriptedModel(["ok"]))])

    async def main() -> list[Any]:
        return [e.kind async for e in AgentExecutor().stream(recipe)]

    assert asyncio.run(main())[-1] == "run_completed"


async def test_an_sse_route_stops_its_step_when_the_client_goes() -> None:
    """The pattern of docs/in-your-app.md under Starlette's disconnect handling (the ASGI
    spec uvicorn's HTTP servers declare): the client leaves after the first delta."""
    from collections.abc import MutableMapping

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    model = Stalls()
    step = DefaultStep("s", goal="x")
    app = FastAPI()

    @app.get("/stream")
    async def stream_route() -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            async with step.stream(model=model) as stream:
                async for text in stream.text():
                    yield f"data: {text}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    requested = False
    got_text = asyncio.Event()
    bodies: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await got_text.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            bodies.append(message["body"])
            got_text.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/stream",
        "raw_path": b"/stream",
        "query_string": b"",
        "root_path": "",
        "headers": [],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    before = asyncio.all_tasks()
    await app(scope, receive, send)
    assert bodies[0] == b"data: Hel\n\n"
    assert model.cancelled
    assert asyncio.all_tasks() == before


async def test_a_durable_runs_listeners_are_not_warned() -> None:
    class Stored:
        """What a durable run's context carries (its loop items' checkpoints)."""

        parks = False

        async def before_call(self) -> None:
            return None

    events: list[Event] = []
    async with FakeOpenAIServer(["one"]) as server:
        context = AgentContext(model=server.model(), listeners=[events.append])
        context.checkpoints = Stored()  # type: ignore[assignment]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            execution = await StepExecutor(DefaultStep("s", goal="x"), context).execute()
    assert execution.output == "one"


async def test_a_worker_streaming_a_model_that_cannot_is_not_warned() -> None:
    """A worker streams every call of its own accord: a model that cannot stream gives its
    answer as one delta, and nobody asked for more."""

    class Stored:
        parks = False

        async def before_call(self) -> None:
            return None

    events: list[Event] = []
    context = AgentContext(model=Whole(), listeners=[events.append])
    context.checkpoints = Stored()  # type: ignore[assignment]
    context.streaming = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        execution = await StepExecutor(DefaultStep("s", goal="x"), context).execute()
    assert execution.output == "one whole answer"
    assert [e.text for e in events if isinstance(e, TokenDelta)] == ["one whole answer"]


def test_the_command_line_does_not_warn_about_its_own_listeners(tmp_path: Path) -> None:
    with FakeOpenAIServer(["Hello."]) as server:
        (tmp_path / "hi.yaml").write_text("id: hi\nsteps:\n  - {id: hi, goal: Say hello.}\n")
        done = subprocess.run(
            [sys.executable, "-m", "minions", "run", "hi.yaml", "--model",
             f"openai-compatible:fake-model@{server.url}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "StreamingWarning" not in done.stderr


async def test_the_once_per_model_warning_forgets_a_dropped_model() -> None:
    """Once per model, not once per memory address: the models warned of are held weakly, so
    a model that later takes the address of one warned and dropped is warned all the same
    (the suite once lost that warning to a model of an earlier test, keyed by `id`)."""
    from minions._step import model_call

    async with FakeOpenAIServer(["one"]) as server:
        model = server.model()
        with pytest.warns(StreamingWarning):
            await DefaultStep("s", goal="x").run(model=model, listeners=[lambda e: None])
        assert model in model_call._WARNED
        gc.collect()  # models of earlier tests that are garbage already leave the set now
        warned = len(model_call._WARNED)
        dropped = weakref.ref(model)
        del model
        gc.collect()
    assert dropped() is None
    assert len(model_call._WARNED) == warned - 1
