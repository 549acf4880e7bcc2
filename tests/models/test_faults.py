"""Every fault `FakeOpenAIServer` injects, through the real `openai` client and the step loop:
each ends in success with a conversation free of failed attempts, or in a clear failure once
the retries are spent; usage is summed over attempts; the API key never leaks."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import structlog
from pydantic import BaseModel

from minions import (
    AgentContext,
    DefaultStep,
    MessageBundle,
    OutputInstructions,
    StepExecution,
    StepExecutor,
    StepStatus,
    Usage,
    tool,
)
from minions.events import RetryScheduled, event_to_json
from minions.models import infer_model
from minions.testing import FakeOpenAIServer, FakeReply

from .conftest import FAST


class Sum(BaseModel):
    total: int


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def make_step(structured: bool) -> DefaultStep:
    return DefaultStep(
        "sum",
        MessageBundle(system="You add numbers.", goal="What is 2+3?"),
        tools={"add"},
        output=OutputInstructions(Sum) if structured else None,
    )


GOOD_TEXT = FakeReply.text("5")
GOOD_OUTPUT = FakeReply.calls(("Sum", {"total": 5}))

# (fault, structured step?, what the step loop does about it)
FAULTS: dict[str, tuple[FakeReply, bool, str]] = {
    "429 with Retry-After": (FakeReply.rate_limit(retry_after=0.01), False, "retry"),
    "429 with retry-after-ms": (FakeReply.rate_limit(None, retry_after_ms=20), False, "retry"),
    "500": (FakeReply.server_error(), False, "retry"),
    "503": (FakeReply.server_error(503, "overloaded"), False, "retry"),
    "hang past the client timeout": (FakeReply.hang(5.0), False, "retry"),
    "malformed tool-argument JSON": (FakeReply.calls(("add", '{"a": 2, "b": ')), False, "reask"),
    "length cut-off": (FakeReply.cut_off(), False, "reask"),
    "length cut-off (structured)": (FakeReply.cut_off(), True, "reask"),
    "malformed output-tool JSON": (FakeReply.calls(("Sum", '{"total": 5')), True, "reask"),
    "output failing its schema": (FakeReply.calls(("Sum", {"total": "five"})), True, "reask"),
}


async def run_with_fault(fault: FakeReply, structured: bool) -> tuple[StepExecution, Any]:
    good = GOOD_OUTPUT if structured else GOOD_TEXT
    events: list[Any] = []
    async with FakeOpenAIServer([fault, good]) as server:
        context = AgentContext(
            model=server.model(timeout=0.3, output_modes=("tool",)),
            tools=[add],
            config=FAST,
            listeners=[events.append],
        )
        execution = await StepExecutor(make_step(structured), context).execute()
        return execution, (server.chat_requests, events)


@pytest.mark.parametrize("name", list(FAULTS))
async def test_each_fault_ends_in_success_without_traces(name: str) -> None:
    fault, structured, handling = FAULTS[name]
    execution, (requests, events) = await run_with_fault(fault, structured)

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert execution.output == (Sum(total=5) if structured else "5")
    assert len(requests) == 2
    assert len(execution.model_calls) == 2
    assert execution.model_calls[0].error is not None
    roles = [m.role for m in execution.messages]
    retries = [e for e in events if isinstance(e, RetryScheduled)]
    assert [r.target for r in retries] == ["model" if handling == "retry" else "output"]
    if handling == "retry":
        # Transactional: the retried request is the same prompt, nothing of the failure.
        assert requests[1].messages == requests[0].messages
        expected = ["system", "user", "assistant"]
    else:
        # Re-ask: the prompt plus one short note, joined to the goal so that no two messages
        # of one role follow each other on the wire; the failed answer is gone.
        first, again = requests[0].messages, requests[1].messages
        assert again[:-1] == first[:-1]
        assert [m["role"] for m in again] == [m["role"] for m in first] == ["system", "user"]
        goal, note = again[-1]["content"].split("\n\n", 1)
        assert goal == first[-1]["content"]
        assert len(note) < 300
        expected = ["system", "user", "user", "assistant"]  # in memory: the note is its own
    if structured:
        expected.append("tool")  # The output tool call gets its "Received." result.
    assert roles == expected


async def test_retry_after_hints_set_the_delay() -> None:
    for fault, delay in [
        (FakeReply.rate_limit(retry_after=0.01), 0.01),
        (FakeReply.rate_limit(retry_after=5, retry_after_ms=30), 0.03),
        (FakeReply.rate_limit(retry_after=60), FAST.retry_max_delay),  # Capped by the config.
    ]:
        _, (_, events) = await run_with_fault(fault, False)
        (retry,) = [e for e in events if isinstance(e, RetryScheduled)]
        assert retry.delay == pytest.approx(delay)
        assert "HTTP 429" in retry.reason


async def test_json_in_prose_and_missing_usage_are_not_faults() -> None:
    async with FakeOpenAIServer(
        [FakeReply.json_in_prose({"total": 5}).without_usage()], reject={"tool_choice"}
    ) as server:
        context = AgentContext(model=server.model(), tools=[add], config=FAST)
        execution = await StepExecutor(make_step(True), context).execute()
    assert execution.output == Sum(total=5)
    assert execution.model_calls[0].output_mode == "prompted_json"
    assert execution.usage == Usage(calls=1, unknown_calls=1)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (FakeReply.rate_limit(retry_after=0.01), "model call failed after 3 attempts"),
        (FakeReply.server_error(502, "bad gateway"), "HTTP 502: bad gateway"),
        (FakeReply.hang(5.0), "no answer within the client timeout of 0.3s"),
        (FakeReply.cut_off(), "invalid output after 3 attempts"),
        (FakeReply.calls(("add", "{")), "were not valid JSON"),
    ],
)
async def test_faults_fail_clearly_once_retries_are_spent(fault: FakeReply, expected: str) -> None:
    config = dataclasses.replace(FAST, max_model_retries=2, max_output_retries=2)
    async with FakeOpenAIServer([fault] * 3) as server:
        context = AgentContext(model=server.model(timeout=0.3), tools=[add], config=config)
        execution = await StepExecutor(make_step(False), context).execute()
        assert len(server.chat_requests) == 3
    assert execution.status is StepStatus.FAILED
    assert execution.error is not None
    assert expected in execution.error
    assert len(execution.model_calls) == 3
    # No failed attempt left anything in the conversation.
    assert [m.role for m in execution.messages] in (["system", "user"], ["system", "user", "user"])


async def test_usage_is_summed_over_attempts() -> None:
    async with FakeOpenAIServer(
        [
            FakeReply.cut_off().with_usage(40, 100),
            FakeReply.server_error(),
            FakeReply.calls(("Sum", {"total": "x"})).with_usage(45, 9),
            FakeReply.calls(("Sum", {"total": 5})).with_usage(50, 8),
        ]
    ) as server:
        context = AgentContext(model=server.model(output_modes=("tool",)), tools=[add], config=FAST)
        execution = await StepExecutor(make_step(True), context).execute()

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert [c.usage.total_tokens for c in execution.model_calls] == [140, 0, 54, 58]
    # Every attempt counts, the failed ones too; the 500 cost a call but no tokens.
    assert execution.usage == Usage(prompt_tokens=135, completion_tokens=117, calls=4)
    assert context.usage == execution.usage


async def test_api_key_never_appears_in_logs_events_errors_or_reprs(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    key = "sk-secret-4f1c9a77e2b84d0c"

    def echo_key(received: Any) -> Any:
        # A careless server quotes the credentials it got back in its errors.
        auth = received.headers.get("authorization", "")
        if len(server.chat_requests) == 1:
            return FakeReply.rate_limit(retry_after=0.01)
        if len(server.chat_requests) == 2:
            return FakeReply.failure(500, f"upstream rejected {auth}")
        return FakeReply.failure(401, f"Incorrect API key provided: {auth}")

    events: list[Any] = []
    caplog.set_level(logging.DEBUG)
    # capture_logs leaves structlog "configured": put it back as it was for the other tests.
    if not structlog.is_configured():
        request.addfinalizer(structlog.reset_defaults)
    with structlog.testing.capture_logs() as structlog_lines:
        async with FakeOpenAIServer(echo_key) as server:
            monkeypatch.setenv("OPENAI_API_KEY", key)
            monkeypatch.setenv("MINIONS_MODEL", f"openai-compatible:fake-model@{server.url}")
            context = AgentContext(config=FAST, tools=[add], listeners=[events.append])
            execution = await StepExecutor(make_step(False), context).execute()
            sent = server.chat_requests[0].headers["authorization"]
            openai_model = infer_model(f"openai:gpt-4o-mini@{server.url}")

    assert sent == f"Bearer {key}"  # The key did reach the server...
    assert execution.status is StepStatus.FAILED
    captured = "\n".join(
        [
            caplog.text,
            "\n".join(str(line) for line in structlog_lines),
            "\n".join(event_to_json(e) for e in events),
            repr(context),
            repr(context.model),
            repr(openai_model),
            repr(server.chat_requests),
            str(execution),
            execution.error or "",
            "\n".join(c.error or "" for c in execution.model_calls),
        ]
    )
    assert "HTTP 401" in captured
    assert "[redacted]" in captured
    assert key not in captured  # ...and nowhere else.
    assert structlog_lines


# Broken answers on the wire, streamed and not (issue 25): a stream that ends with no finish
# reason, a chunk or body that is not JSON, a connection dropped mid-body. Each is a half
# answer, never the whole one: retried like a connection error, from the same prompt.
BROKEN: dict[str, FakeReply] = {
    "stream closed without a finish reason": FakeReply.stream_closed("Mock response from x: "),
    "malformed chunk": FakeReply.malformed_chunk(),
    "body cut mid-way": FakeReply.cut_body(),
}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
@pytest.mark.parametrize("name", list(BROKEN))
async def test_a_broken_answer_is_retried_from_the_same_prompt(name: str, stream: bool) -> None:
    events: list[Any] = []
    async with FakeOpenAIServer([BROKEN[name], GOOD_TEXT]) as server:
        context = AgentContext(
            model=server.model(stream=stream), tools=[add], config=FAST, listeners=[events.append]
        )
        execution = await StepExecutor(make_step(False), context).execute()
        requests = server.chat_requests

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert execution.output == "5"
    assert [r.stream for r in requests] == [stream, stream]
    assert requests[1].messages == requests[0].messages
    (retry,) = [e for e in events if isinstance(e, RetryScheduled)]
    assert retry.target == "model"
    failed, answered = execution.model_calls
    assert failed.error is not None
    assert answered.response is not None
    assert answered.response.finish_reason == "stop"
    # The broken attempt is counted, its tokens unknown (no usage came before the break).
    assert failed.usage == Usage(calls=1, unknown_calls=1)
    assert execution.usage.calls == 2
    assert [m.role for m in execution.messages] == ["system", "user", "assistant"]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (FakeReply.stream_closed(), "the stream ended before the answer's finish reason"),
        (FakeReply.malformed_chunk(), "a streamed chunk is not valid JSON"),
        (FakeReply.cut_body(), "the connection closed before the answer was complete"),
    ],
)
async def test_a_broken_stream_fails_clearly_once_retries_are_spent(
    fault: FakeReply, expected: str
) -> None:
    config = dataclasses.replace(FAST, max_model_retries=1)
    async with FakeOpenAIServer([fault] * 2) as server:
        context = AgentContext(
            model=server.model(stream=True), tools=[add], config=config, listeners=[lambda e: None]
        )
        execution = await StepExecutor(make_step(False), context).execute()
    assert execution.status is StepStatus.FAILED
    assert expected in (execution.error or ""), execution.error
    assert len(execution.model_calls) == 2


async def test_a_body_that_is_not_json_fails_clearly() -> None:
    config = dataclasses.replace(FAST, max_model_retries=0)
    async with FakeOpenAIServer([FakeReply.malformed_chunk()]) as server:
        context = AgentContext(model=server.model(), tools=[add], config=config)
        execution = await StepExecutor(make_step(False), context).execute()
    assert execution.status is StepStatus.FAILED
    assert "the answer's body is not valid JSON" in (execution.error or ""), execution.error
