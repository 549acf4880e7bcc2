"""`FakeOpenAIServer`: a real OpenAI-compatible HTTP server on 127.0.0.1, for tests.

It speaks ``/v1/chat/completions`` (JSON and SSE streaming) and ``/v1/models``, answers from a
script or a function of the request, records every request, and injects the faults real
endpoints produce: 429 with ``Retry-After``, 5xx, a hang past the client timeout, malformed
tool-argument JSON, a ``length`` cut-off, JSON wrapped in prose and fences, a 400 for a
parameter it does not support, missing usage, a stream closed before its finish reason, a
malformed stream chunk and a body cut off mid-way. Only the standard library is used.

::

    from minions.testing import FakeOpenAIServer, FakeReply

    with FakeOpenAIServer(["Hello!", FakeReply.rate_limit(retry_after=0.01)]) as server:
        model = server.model()  # an OpenAIChatModel pointed at the server
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, get_args

from minions._text import estimate_tokens
from minions.models._internal import serving_tests

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

    from minions.models import OpenAIChatModel

__all__ = ["FakeOpenAIServer", "FakeReply", "FakeRequest", "FakeScript"]

_AUTO: Final = "auto"
_UNSET: Final = object()
TEST_API_KEY: Final = "sk-fake-test-key"


Quirk = Literal["ignores_tools", "ignores_named_tool_choice", "strict_alternation"]
"""A behaviour of real local servers that `FakeOpenAIServer` can play (see its `quirks`)."""

Break = Literal["stream_closed", "malformed_chunk", "cut_body"]
"""How a `FakeReply` breaks the answer on the wire (see `FakeReply.stream_closed`,
`FakeReply.malformed_chunk` and `FakeReply.cut_body`)."""


@dataclass(frozen=True, kw_only=True)
class FakeRequest:
    """One request the server received."""

    method: str
    path: str
    body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Lower-cased header names. Left out of the repr: it holds the API key."""

    @property
    def model(self) -> str:
        """The model the request named."""
        return str(self.body.get("model", ""))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's messages, as sent."""
        return list(self.body.get("messages", []))

    @property
    def tools(self) -> list[str]:
        """Names of the tools offered."""
        return [tool["function"]["name"] for tool in self.body.get("tools", [])]

    @property
    def tool_choice(self) -> Any:
        """The request's ``tool_choice``, if any."""
        return self.body.get("tool_choice")

    @property
    def response_format(self) -> Any:
        """The request's ``response_format``, if any."""
        return self.body.get("response_format")

    @property
    def stream(self) -> bool:
        """Whether the request asked for a streamed answer."""
        return bool(self.body.get("stream"))

    @property
    def last_message(self) -> dict[str, Any]:
        """The request's last message (``{}`` when it has none)."""
        messages = self.messages
        return messages[-1] if messages else {}

    @property
    def forced_tool(self) -> str | None:
        """The tool `tool_choice` forces: the one it names, or the only tool offered when it
        is ``"required"``."""
        choice = self.tool_choice
        if isinstance(choice, Mapping):
            return str(choice.get("function", {}).get("name")) or None
        tools = self.tools
        if choice == "required" and len(tools) == 1:
            return tools[0]
        return None


@dataclass(frozen=True, kw_only=True)
class FakeReply:
    """One scripted answer, or a fault. Build them with the class methods.

    In a script, a plain string is `text`, a list of ``(name, arguments)`` pairs is
    `tool_calls`, and a pydantic model instance is `output`.
    """

    content: str | None = None
    tool_calls: tuple[tuple[str, str | Mapping[str, Any]], ...] = ()
    output: Any = _UNSET
    prose: bool = False
    finish_reason: str | None = None
    usage: tuple[int, int] | Literal["auto"] | None = _AUTO
    status: int = 200
    error: str = ""
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    body: Mapping[str, Any] | None = None
    broken: Break | None = None

    @classmethod
    def text(cls, content: str, *, finish_reason: str = "stop") -> FakeReply:
        """A text answer."""
        return cls(content=content, finish_reason=finish_reason)

    @classmethod
    def calls(cls, *calls: tuple[str, str | Mapping[str, Any]]) -> FakeReply:
        """Tool calls, in one answer. Arguments given as a string are sent as they are, so
        ``("add", '{"a": 1,')`` is a call with malformed argument JSON."""
        return cls(tool_calls=tuple(calls))

    @classmethod
    def structured(cls, value: Any, *, prose: bool = False) -> FakeReply:
        """Structured output, in the shape the request asks for: JSON content under
        ``response_format``, a call to the tool ``tool_choice`` forces (or to the offered tool
        named like `value`'s class), else JSON text, wrapped in prose and a fence if `prose`."""
        return cls(output=value, prose=prose)

    @classmethod
    def json_in_prose(cls, value: Any) -> FakeReply:
        """JSON in a ```json fence between sentences, as small models like to answer."""
        return cls(content=_in_prose(_dump(value)))

    @classmethod
    def cut_off(cls, content: str = '{"partial": "answ') -> FakeReply:
        """An answer cut off at the length limit (``finish_reason="length"``)."""
        return cls(content=content, finish_reason="length")

    @classmethod
    def json_then_cut_off(cls, value: Any, more: str = " I hope this helps! Let me") -> FakeReply:
        """A complete JSON object, then more talk cut off at the length limit (what small
        models do)."""
        return cls(content=_dump(value) + more, finish_reason="length")

    @classmethod
    def rate_limit(
        cls, retry_after: float | None = 1.0, *, retry_after_ms: float | None = None
    ) -> FakeReply:
        """HTTP 429 with ``Retry-After`` (seconds) and/or ``retry-after-ms``."""
        headers = {}
        if retry_after is not None:
            headers["Retry-After"] = _number(retry_after)
        if retry_after_ms is not None:
            headers["retry-after-ms"] = _number(retry_after_ms)
        return cls.failure(429, "Rate limit reached, slow down.", headers=headers)

    @classmethod
    def server_error(
        cls, status: int = 500, message: str = "The server had an error."
    ) -> FakeReply:
        """HTTP 5xx."""
        return cls.failure(status, message)

    @classmethod
    def failure(
        cls,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> FakeReply:
        """Any HTTP error, with an OpenAI-style error body."""
        return cls(status=status, error=message, param=param, headers=dict(headers or {}))

    @classmethod
    def hang(cls, seconds: float = 30.0) -> FakeReply:
        """No answer for `seconds` (cut short when the server stops): past a client's
        timeout, it is a timeout."""
        return cls(content="(too late)", delay=seconds)

    @classmethod
    def stream_closed(cls, content: str = "Mock response: ") -> FakeReply:
        """A stream that ends, cleanly, after some of `content` and before any chunk with a
        finish reason (a server or proxy that closed it mid-answer). Asked for without
        streaming, the body is cut off mid-way instead."""
        return cls(content=content, broken="stream_closed")

    @classmethod
    def malformed_chunk(cls, content: str = "Sunny in Paris.") -> FakeReply:
        """A stream whose chunk after the first words of `content` is not JSON. Asked for
        without streaming, a whole response whose body is not JSON."""
        return cls(content=content, broken="malformed_chunk")

    @classmethod
    def cut_body(cls, content: str = "Sunny in Paris.") -> FakeReply:
        """An answer whose connection drops mid-body: the headers promise more bytes (a
        ``Content-Length``, or a chunked stream) than are sent before the socket closes."""
        return cls(content=content, broken="cut_body")

    @classmethod
    def raw(cls, body: Mapping[str, Any], *, status: int = 200) -> FakeReply:
        """This exact JSON body."""
        return cls(body=body, status=status)

    def without_usage(self) -> FakeReply:
        """The same answer with no ``usage`` in it."""
        return dataclasses.replace(self, usage=None)

    def with_usage(self, prompt_tokens: int, completion_tokens: int) -> FakeReply:
        """The same answer, reporting this usage."""
        return dataclasses.replace(self, usage=(prompt_tokens, completion_tokens))


FakeScript: TypeAlias = Any
"""One script entry: text (`str`), a list of ``(name, arguments)`` pairs (tool calls), a
`FakeReply`, or a pydantic model instance (structured output)."""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _dump(value: Any) -> str:
    dump = getattr(value, "model_dump_json", None)
    if callable(dump):
        return str(dump())
    return json.dumps(value)


def _in_prose(text: str) -> str:
    return f"Sure! Here is the result:\n\n```json\n{text}\n```\n\nLet me know if you need more."


def as_reply(entry: Any) -> FakeReply:
    """A script entry as a `FakeReply`."""
    if isinstance(entry, FakeReply):
        return entry
    if isinstance(entry, str):
        return FakeReply.text(entry)
    if isinstance(entry, list | tuple) and all(
        isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)
        for pair in entry
    ):
        return FakeReply.calls(*(tuple(pair) for pair in entry))
    if hasattr(entry, "model_dump_json"):
        return FakeReply.structured(entry)
    raise TypeError(
        f"a FakeOpenAIServer reply must be a str, a list of (tool name, arguments) pairs, a "
        f"FakeReply or a pydantic model instance, not {type(entry).__name__}: {entry!r}"
    )


class FakeOpenAIServer:
    """A local OpenAI-compatible server answering from a script or a function.

    Args:
        replies: the script, one entry per chat-completion request (see `FakeScript`), or a
            function of the `FakeRequest` returning an entry (called in the server's thread).
        models: the model ids ``/v1/models`` lists.
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get a 401.
        reject: request parameters the server refuses with a 400 naming them, every time
            (``{"response_format"}`` plays a server without native structured output).
        quirks: what real local servers do that no error reports: ``"ignores_tools"`` (drops
            ``tools`` and ``tool_choice``, as llama.cpp does with a chat template that has no
            tool support), ``"ignores_named_tool_choice"`` (a ``tool_choice`` naming a function
            is treated as ``"auto"``; ``"required"`` is honoured) and ``"strict_alternation"``
            (a 400 for two messages of one role in a row, as Gemma's, Mistral's and Llama 2's
            chat templates answer).
        delay: seconds every answer takes (latency, for benchmarks).
        gate: when given, chat requests are held until it is set (released when the server
            stops): a test sees how many arrive at once (`in_flight`) before letting them go.

    Start it with ``with`` or ``async with`` (or `start` / `stop`); it listens on a free port
    of 127.0.0.1, at `url`. Every request is in `requests`, in order. A script that runs out
    answers 400 with a message saying so.
    """

    def __init__(
        self,
        replies: Iterable[FakeScript] | Callable[[FakeRequest], FakeScript] = (),
        *,
        models: Sequence[str] = ("fake-model",),
        api_key: str | None = None,
        reject: Iterable[str] = (),
        quirks: Iterable[Quirk] = (),
        delay: float = 0.0,
        gate: threading.Event | None = None,
    ) -> None:
        self._function = replies if callable(replies) else None
        self._script: list[FakeScript] = [] if callable(replies) else list(replies)
        self._next = 0
        self.models = tuple(models)
        self.api_key = api_key
        self.reject = frozenset(reject)
        self.quirks = frozenset(quirks)
        unknown = self.quirks - set(get_args(Quirk))
        if unknown:
            raise ValueError(f"unknown quirks {sorted(unknown)}; known: {get_args(Quirk)}")
        self.delay = delay
        self.gate = gate
        self.requests: list[FakeRequest] = []
        """Every request received, in order."""
        self.in_flight = 0
        """Chat requests received and not yet answered."""
        self.max_in_flight = 0
        """The most chat requests ever in flight at once."""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the server listens on (127.0.0.1)."""
        if self._httpd is None:
            raise RuntimeError("FakeOpenAIServer is not started: use `with` or call start()")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to give a client, ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        """Listen on a free port and answer in a background thread."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"FakeOpenAIServer:{self.port}",
            daemon=True,
        )
        self._thread.start()
        serving_tests(self.url, True)  # not a real model: `block_real_models` lets it answer
        return self

    def stop(self) -> None:
        """Stop answering; requests still hanging are released."""
        if self._httpd is None:
            return
        serving_tests(self.url, False)
        httpd, self._httpd = self._httpd, None
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    def __repr__(self) -> str:
        where = self.url if self._httpd is not None else "stopped"
        return f"FakeOpenAIServer({where}, {len(self.requests)} requests)"

    # -- script --------------------------------------------------------------------------------

    def add(self, *replies: FakeScript) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        """Script entries not used yet."""
        return len(self._script) - self._next

    @property
    def chat_requests(self) -> list[FakeRequest]:
        """The chat-completion requests received, in order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def model(self, model: str | None = None, **options: Any) -> OpenAIChatModel:
        """An `OpenAIChatModel` for this server (`options` go to it; a short timeout and a
        test API key by default)."""
        from minions.models import OpenAIChatModel

        options.setdefault("api_key", self.api_key or TEST_API_KEY)
        options.setdefault("timeout", 10.0)
        options.setdefault("provider", "fake")
        return OpenAIChatModel(model or self.models[0], base_url=self.url, **options)

    def _authorized(self, request: FakeRequest) -> bool:
        if self.api_key is None:
            return True
        headers = request.headers
        # Azure clients send the key in `api-key`, the others as a bearer token.
        return self.api_key in (headers.get("api-key"), headers.get("authorization", "")[7:])

    def _as_seen(self, request: FakeRequest) -> FakeRequest:
        """The request as a server with these quirks reads it."""
        body = dict(request.body)
        if "ignores_tools" in self.quirks:
            body.pop("tools", None)
            body.pop("tool_choice", None)
        if "ignores_named_tool_choice" in self.quirks and isinstance(
            body.get("tool_choice"), Mapping
        ):
            body["tool_choice"] = "auto"
        return dataclasses.replace(request, body=body) if body != request.body else request

    def _reply_for(self, request: FakeRequest) -> FakeReply:
        if "strict_alternation" in self.quirks:
            roles = [m.get("role") for m in request.messages]
            for before, after in itertools.pairwise(roles):
                if before == after and before != "tool":
                    return FakeReply.failure(
                        400,
                        "Conversation roles must alternate user/assistant/user/assistant/...",
                    )
        for name in sorted(self.reject):
            if name in request.body:
                return FakeReply.failure(
                    400, f"Unsupported parameter: '{name}' is not supported.", param=name
                )
        if self._function is not None:
            return as_reply(self._function(request))
        with self._lock:
            index = self._next
            if index >= len(self._script):
                return FakeReply.failure(
                    400,
                    f"FakeOpenAIServer has no reply left: its script holds {len(self._script)} "
                    f"replies and this is chat request {index + 1}",
                )
            self._next += 1
            entry = self._script[index]
        return as_reply(entry)

    # -- answers -------------------------------------------------------------------------------

    def _answer(self, reply: FakeReply, request: FakeRequest) -> dict[str, Any]:
        """The completion body for `reply` (status 200)."""
        if reply.body is not None:
            return dict(reply.body)
        content, calls = reply.content, list(reply.tool_calls)
        if reply.output is not _UNSET:
            content, calls = self._shape_output(reply, request)
        tool_calls = [
            {
                "id": f"call_{next(self._ids)}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            for name, arguments in calls
        ]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
        body: dict[str, Any] = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model or self.models[0],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        usage = self._usage(reply, request, content, tool_calls)
        if usage is not None:
            body["usage"] = usage
        return body

    def _shape_output(
        self, reply: FakeReply, request: FakeRequest
    ) -> tuple[str | None, list[tuple[str, str | Mapping[str, Any]]]]:
        text = _dump(reply.output)
        fmt = request.response_format
        if isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object"):
            return text, []
        tool = request.forced_tool
        if tool is None and type(reply.output).__name__ in request.tools:
            tool = type(reply.output).__name__
        if tool is not None:
            return None, [(tool, text)]
        return (_in_prose(text) if reply.prose else text), []

    @staticmethod
    def _usage(
        reply: FakeReply,
        request: FakeRequest,
        content: str | None,
        tool_calls: list[dict[str, Any]],
    ) -> dict[str, int] | None:
        if reply.usage is None:
            return None
        if reply.usage == _AUTO:
            prompt = sum(4 + estimate_tokens(str(m.get("content") or "")) for m in request.messages)
            completion = estimate_tokens(
                (content or "") + "".join(c["function"]["arguments"] for c in tool_calls)
            )
        else:
            prompt, completion = reply.usage
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _chunks(self, body: dict[str, Any], request: FakeRequest) -> Iterator[dict[str, Any]]:
        """A completion body as the SSE chunks a streaming server sends."""
        choice = body["choices"][0]
        message = choice["message"]
        base = {
            "id": body["id"],
            "object": "chat.completion.chunk",
            "created": body["created"],
            "model": body["model"],
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(message.get("content") or ""):
            yield chunk({"content": piece})
        for index, call in enumerate(message.get("tool_calls", [])):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            for part in (arguments[:half], arguments[half:]):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
        yield chunk({}, choice["finish_reason"])
        options = request.body.get("stream_options") or {}
        if options.get("include_usage") and "usage" in body:
            yield {**base, "choices": [], "usage": body["usage"]}


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == len(words) - 1 else w + " " for i, w in enumerate(words) if w or i == 0]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeOpenAIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that drops a kept-alive connection (its event loop ended, it timed out) is
        # normal in tests: say nothing. Anything else is a bug worth a traceback on stderr.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits
    # for the client's delayed ACK, ~40 ms per answer on Linux.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a test server has nothing to say on stderr."""

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            self._send_json(400, _error_body("The request body is not valid JSON.", None))
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        request = FakeRequest(
            method=self.command,
            path=path,
            body=body if isinstance(body, dict) else {},
            headers={k.lower(): v for k, v in self.headers.items()},
        )
        with fake._lock:
            fake.requests.append(request)
        try:
            if not fake._authorized(request):
                self._send_json(401, _error_body("Incorrect API key provided.", None))
            elif path.endswith("/models") and self.command == "GET":
                data = [
                    {"id": m, "object": "model", "created": 0, "owned_by": "minions"}
                    for m in fake.models
                ]
                self._send_json(200, {"object": "list", "data": data})
            elif path.endswith("/chat/completions") and self.command == "POST":
                self._chat(fake, request)
            else:
                self._send_json(404, _error_body(f"Unknown path {self.command} {path}.", None))
        except (BrokenPipeError, ConnectionResetError):
            pass  # The client gave up (a timeout): nobody is left to answer.

    def _chat(self, fake: FakeOpenAIServer, request: FakeRequest) -> None:
        with fake._lock:
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            self._answer_chat(fake, request)
        finally:
            with fake._lock:
                fake.in_flight -= 1

    def _answer_chat(self, fake: FakeOpenAIServer, request: FakeRequest) -> None:
        gate = fake.gate
        while gate is not None and not gate.wait(0.02):
            if fake._stopping.is_set():
                self.close_connection = True
                return
        try:
            reply = fake._reply_for(request)
        except Exception as exc:  # A reply function raised: say so, as a server error.
            reply = FakeReply.failure(500, f"reply function failed: {type(exc).__name__}: {exc}")
        delay = reply.delay or fake.delay
        if delay and fake._stopping.wait(delay):
            self.close_connection = True
            return
        if reply.status >= 400:
            self._send_json(reply.status, _error_body(reply.error, reply.param), reply.headers)
            return
        body = fake._answer(reply, fake._as_seen(request))
        if reply.broken is not None:
            self._broken(reply.broken, body, fake._chunks(body, request), stream=request.stream)
            return
        if not request.stream:
            self._send_json(reply.status, body, reply.headers)
            return
        self._start_stream()
        for chunk in fake._chunks(body, request):
            self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._end_stream()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def _end_stream(self, *, done: bool = True) -> None:
        if done:
            self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _broken(
        self, broken: Break, body: dict[str, Any], chunks: Iterator[dict[str, Any]], *, stream: bool
    ) -> None:
        """`body` broken as `broken` says; the connection closes after it."""
        self.close_connection = True
        data = json.dumps(body).encode()
        if not stream:
            if broken == "malformed_chunk":  # Whole as HTTP, but not JSON.
                data = data[: len(data) // 2]
                self._send_bytes(200, data, len(data))
            else:  # Fewer bytes than the Content-Length promises, then the socket closes.
                self._send_bytes(200, data[: len(data) // 2], len(data))
            return
        self._start_stream()
        # The role chunk and the first content delta go out whole, so that a client has
        # started an answer (and shown a token) when the stream breaks.
        for chunk in itertools.islice(chunks, 2):
            self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        if broken == "stream_closed":
            self._end_stream(done=False)
        elif broken == "malformed_chunk":
            self._write_chunk(b'data: {"id": "chatcmpl-broken", "choices": [{"delta": {"cont\n\n')
            self._end_stream()
        else:  # A chunk announced longer than what is sent, and no end of the stream.
            piece = b'data: {"id": "chatcmpl-broken", "choices": ['
            self.wfile.write(f"{len(piece) * 2:x}\r\n".encode() + piece)
            self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_json(
        self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self._send_bytes(status, data, len(data), headers)

    def _send_bytes(
        self,
        status: int,
        data: bytes,
        length: int,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def _error_body(message: str, param: str | None) -> dict[str, Any]:
    code = "unsupported_parameter" if param else None
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
