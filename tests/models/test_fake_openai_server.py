"""`FakeOpenAIServer` on its own: a real HTTP server, from sync and async code, with the real
`openai` client."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from minions import AgentContext, DefaultStep, StepExecutor, StepStatus
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

from .conftest import FAST


class Answer(BaseModel):
    value: int


def client(server: FakeOpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="sk-test", max_retries=0, timeout=2.0)


def ask(server: FakeOpenAIServer, **options: Any) -> Any:
    return client(server).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], **options
    )


def test_sync_use_with_the_sync_client_and_models_endpoint() -> None:
    with FakeOpenAIServer(["Hello!"], models=("a", "b")) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.port > 0
        completion = ask(server)
        models = client(server).models.list()
        requests = list(server.requests)
    assert completion.choices[0].message.content == "Hello!"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0
    assert [m.id for m in models.data] == ["a", "b"]
    assert [(r.method, r.path) for r in requests] == [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
    ]
    assert requests[0].messages == [{"role": "user", "content": "hi"}]


def test_sync_step_execution() -> None:
    with FakeOpenAIServer(["done"]) as server:
        execution = StepExecutor(
            DefaultStep("s", "go"), AgentContext(model=server.model(), config=FAST)
        ).execute_sync()
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "done"


async def test_async_use_and_two_servers_at_once() -> None:
    async with FakeOpenAIServer(["one"]) as first, FakeOpenAIServer(["two"]) as second:
        assert first.port != second.port
        client_1 = openai.AsyncOpenAI(base_url=first.url, api_key="k", max_retries=0)
        client_2 = openai.AsyncOpenAI(base_url=second.url, api_key="k", max_retries=0)
        messages: Any = [{"role": "user", "content": "hi"}]
        one = await client_1.chat.completions.create(model="m", messages=messages)
        two = await client_2.chat.completions.create(model="m", messages=messages)
    assert (one.choices[0].message.content, two.choices[0].message.content) == ("one", "two")


def test_replies_from_a_function_of_the_request() -> None:
    def reply(request: FakeRequest) -> Any:
        return f"you said {request.last_message['content']} to {request.model}"

    with FakeOpenAIServer(reply) as server:
        completion = ask(server)
    assert completion.choices[0].message.content == "you said hi to fake-model"


def test_tool_calls_and_malformed_arguments_are_sent_as_given() -> None:
    with FakeOpenAIServer([[("add", {"a": 1}), ("add", '{"a": 1,')]]) as server:
        completion = ask(server)
    calls = completion.choices[0].message.tool_calls or []
    assert completion.choices[0].finish_reason == "tool_calls"
    assert [c.function.arguments for c in calls] == ['{"a": 1}', '{"a": 1,']
    assert len({c.id for c in calls}) == 2


def test_structured_reply_takes_the_shape_the_request_asks_for() -> None:
    value = Answer(value=7)
    with FakeOpenAIServer([value, value, value, FakeReply.structured(value, prose=True)]) as server:
        native = ask(server, response_format={"type": "json_object"})
        forced = ask(
            server,
            tools=[{"type": "function", "function": {"name": "Answer", "parameters": {}}}],
            tool_choice={"type": "function", "function": {"name": "Answer"}},
        )
        offered = ask(
            server,
            tools=[{"type": "function", "function": {"name": "Answer", "parameters": {}}}],
        )
        prose = ask(server)
    assert native.choices[0].message.content == '{"value":7}'
    for completion in (forced, offered):
        (call,) = completion.choices[0].message.tool_calls or []
        assert call.function.name == "Answer"
    assert '```json\n{"value":7}\n```' in (prose.choices[0].message.content or "")


def test_sse_streaming() -> None:
    with FakeOpenAIServer(["a b c", [("add", {"a": 1})]]) as server:
        text_chunks = list(ask(server, stream=True, stream_options={"include_usage": True}))
        tool_chunks = list(ask(server, stream=True))
    pieces = [c.choices[0].delta.content for c in text_chunks if c.choices]
    assert "".join(p or "" for p in pieces) == "a b c"
    assert text_chunks[-1].usage is not None  # The usage chunk comes last, with no choices.
    assert text_chunks[-2].choices[0].finish_reason == "stop"
    arguments = "".join(
        (call.function.arguments or "")
        for chunk in tool_chunks
        for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
        if call.function is not None
    )
    assert json.loads(arguments) == {"a": 1}
    assert all(c.usage is None for c in tool_chunks)  # Not asked for.


@pytest.mark.parametrize(
    ("reply", "error", "status"),
    [
        (FakeReply.rate_limit(retry_after=2), openai.RateLimitError, 429),
        (FakeReply.server_error(), openai.InternalServerError, 500),
        (FakeReply.failure(400, "bad", param="response_format"), openai.BadRequestError, 400),
    ],
)
def test_http_faults(reply: FakeReply, error: type[openai.APIStatusError], status: int) -> None:
    with FakeOpenAIServer([reply]) as server, pytest.raises(error) as raised:
        ask(server)
    assert raised.value.status_code == status
    if status == 429:
        assert raised.value.response.headers["retry-after"] == "2"
    if status == 400:
        assert raised.value.param == "response_format"


def test_hang_times_out_the_client_and_stop_releases_it() -> None:
    before = set(threading.enumerate())
    with FakeOpenAIServer([FakeReply.hang(30.0)]) as server:
        slow = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=0.2)
        with pytest.raises(openai.APITimeoutError):
            slow.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        # The server's thread, and the handler still hanging on the request.
        serving = set(threading.enumerate()) - before
        port = server.port
    assert len(serving) == 2
    # Leaving the block stopped the server, hanging handler included: well before its 30 s.
    for thread in serving:
        thread.join(timeout=5)
    assert not any(thread.is_alive() for thread in serving)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_cut_off_missing_usage_and_raw_bodies() -> None:
    raw = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
    with FakeOpenAIServer(
        [FakeReply.cut_off("half"), FakeReply.text("x").without_usage(), FakeReply.raw(raw)]
    ) as server:
        cut, bare, exact = ask(server), ask(server), ask(server)
    assert (cut.choices[0].finish_reason, cut.choices[0].message.content) == ("length", "half")
    assert bare.usage is None
    assert exact.choices == []


def test_reject_api_key_and_exhausted_script() -> None:
    with FakeOpenAIServer(["ok"], api_key="sk-right", reject={"response_format"}) as server:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url, api_key="sk-wrong", max_retries=0).models.list()
        right = openai.OpenAI(base_url=server.url, api_key="sk-right", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="'response_format' is not supported"):
            right.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "x"}],
                response_format={"type": "json_object"},
            )
        assert server.remaining == 1
        right.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match=r"no reply left.*chat request 2"):
            right.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        server.add("more")
        more = right.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert more.choices[0].message.content == "more"


def test_unknown_path_and_bad_script_entries() -> None:
    with FakeOpenAIServer([{"not": "a reply"}]) as server:
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(f"{server.url}/embeddings")
        assert raised.value.code == 404
        with pytest.raises(openai.InternalServerError, match="must be a str"):
            ask(server)


def test_request_repr_hides_headers() -> None:
    with FakeOpenAIServer(["ok"]) as server:
        ask(server)
        assert "sk-test" not in repr(server.requests)
        assert server.requests[0].headers["authorization"] == "Bearer sk-test"
    assert "stopped" in repr(server)
