"""`OpenAIChatModel`: any endpoint that speaks the OpenAI chat-completions protocol.

OpenAI, Azure OpenAI, Ollama, vLLM, llama.cpp's server and LM Studio all do. The step loop is
the one retry boundary: the `openai` client is built with ``max_retries=0`` and errors are
translated into `TransientModelError` (retried by the step loop, honouring ``Retry-After``),
`ModelOutputError` (re-asked with a note) or `ModelError` (the step fails).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

import httpx2
import openai

from minions._log import info
from minions._messages import Message, ModelCallResponse, Prompt, Usage
from minions._text import Secret, redact_url
from minions._values import ModeDemotion
from minions.errors import (
    ModelError,
    ModelOutputError,
    OutputValidationError,
    TransientModelError,
)
from minions.models._base import Model, TokenCallback
from minions.models._blocking import check_request
from minions.models._openai_wire import (
    StreamAccumulator,
    message_of,
    server_message,
    split_settings,
    to_openai_messages,
    to_openai_tools,
    translate_error,
    usage_of,
)
from minions.models._structured import (
    LADDER,
    LADDER_WITH_TOOLS,
    NO_OUTPUT,
    CapabilityMemory,
    ModeIgnoredError,
    OutputMode,
    check_modes,
    read_output,
    shape_request,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

__all__ = ["OpenAIChatModel"]


OPENAI_BASE_URL: Final = "https://api.openai.com/v1"
NO_API_KEY: Final = "no-key"
"""What is sent as the key to local servers that need none (the client insists on one)."""

# The request parameters of each feature: a 400 whose `param` names one (or a part of one, as
# in ``tools[0].function``) refuses the feature; any other `param` is about the request.
_REJECTION_PARAMS: Final[Mapping[str, frozenset[str]]] = {
    "json_schema": frozenset({"response_format"}),
    "tool": frozenset({"tools", "tool_choice"}),
    "stream_options": frozenset({"stream_options"}),
}
# Words in a 400's message that show the server refuses a feature, for servers that name no
# `param` (Ollama's "does not support tools", vLLM's guided decoding errors).
_REJECTION_WORDS: Final[Mapping[str, tuple[str, ...]]] = {
    "json_schema": ("response_format", "json_schema", "json schema", "structured", "guided"),
    "tool": ("tool", "function"),
    "stream_options": ("stream_options", "include_usage"),
}
_REJECTION_STATUSES: Final = frozenset({400, 422, 501})


class _RungRejected(Exception):
    """Internal: the endpoint refused a rung of the ladder; `error` is the refusal."""

    def __init__(self, error: ModelError) -> None:
        super().__init__(str(error))
        self.error = error


def _rejects(error: BaseException, feature: str) -> bool:
    """Whether `error` refuses `feature` (a rung, or ``stream_options``) rather than the
    request: decided by the error's `param` when it names one, else by its message. The last
    rung, ``prompted_json``, asks for no feature a server could refuse."""
    if not isinstance(error, openai.APIStatusError):
        return False
    if error.status_code not in _REJECTION_STATUSES:
        return False
    param = error.param
    if isinstance(param, str) and param:
        root = param.split(".", 1)[0].split("[", 1)[0]
        return root in _REJECTION_PARAMS.get(feature, ())
    text = server_message(error).lower()
    return any(word in text for word in _REJECTION_WORDS.get(feature, ()))


def _ignored(error: Exception, completion: ChatCompletion, mode: OutputMode) -> bool:
    """Whether an unusable answer ignored its mode: `read_output` says so, or a forced output
    tool got an answer (cut off at the length limit, say) that calls no tool at all."""
    if isinstance(error, ModeIgnoredError):
        return True
    if mode != "tool" or not completion.choices:
        return False
    return not completion.choices[0].message.tool_calls


@dataclass(frozen=True, kw_only=True)
class _LoopClient:
    """The client of one event loop, and what closes it when the loop shuts down."""

    client: openai.AsyncOpenAI
    create: Callable[..., Awaitable[Any]]
    closer: AsyncGenerator[None] | None


async def _closed_with_loop(client: openai.AsyncOpenAI) -> AsyncGenerator[None]:
    """Waits at its `yield` until its event loop shuts down its async generators
    (`asyncio.run` does as it ends), then closes `client` in that loop, while it still runs:
    the only hook a loop offers for its end."""
    try:
        yield
    finally:
        await client.close()


class OpenAIChatModel(Model):
    """A chat model behind an OpenAI-compatible endpoint, on `openai.AsyncOpenAI`.

    Args:
        model: the model id the endpoint knows (``gpt-4o-mini``, ``llama3.2:3b``, ...).
        base_url: the endpoint, e.g. ``http://localhost:11434/v1``; defaults to
            ``OPENAI_BASE_URL``, else OpenAI's.
        api_key: defaults to ``OPENAI_API_KEY``; required for OpenAI's own endpoint, and
            replaced by a placeholder for other endpoints when missing. Never shown in reprs,
            errors or logs.
        client: an `openai.AsyncOpenAI` (or `AsyncAzureOpenAI`) to use instead of building
            one, or a function making one; a copy with ``max_retries=0`` is used. HTTP
            connections belong to the event loop that opened them: a function is called once
            for each event loop the model is used from, and the client it made is closed
            when that loop shuts down (as `asyncio.run` and `execute_sync` end), like a
            client built here. A client given as is serves the first event loop that uses
            it (a `ModelError` says so in another) and is yours to close.
        timeout: seconds the client waits for the endpoint (per read while streaming);
            ``None`` waits forever.
        stream: stream every answer over SSE, reporting each text delta as a `TokenDelta`
            event (only when somebody listens to events; otherwise a plain request is made).
            Without it, answers stream when the caller streams the step (`step.stream()`,
            `StepExecutor.stream()`, `AgentExecutor.stream()`).
        settings: request parameters for every call (``temperature``, ``max_tokens``,
            ``seed``...); a step's own settings win. Parameters the `openai` client does not
            know (``top_k``, ``min_p``... for vLLM or llama.cpp) are sent in the request body.
        output_modes: the structured-output ladder to climb down, a subsequence of
            ``("json_schema", "tool", "prompted_json")`` (the default, in that order).
        provider: the label in this model's `name` (``openai``, ``ollama``, ...).
        capabilities: what this endpoint was found to refuse and which mode worked, and how
            many ignored answers demote a mode; each model has its own `CapabilityMemory`
            unless given one (share one among models of the same endpoint).

    Raises:
        ModelError: no API key for OpenAI's endpoint, or a bad `output_modes`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | Callable[[], openai.AsyncOpenAI] | None = None,
        timeout: float | None = 600.0,
        stream: bool = False,
        settings: Mapping[str, Any] | None = None,
        output_modes: Sequence[OutputMode] | None = None,
        provider: str = "openai",
        capabilities: CapabilityMemory | None = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ModelError(f"model must be a non-empty model id, not {model!r}")
        self.model = model
        self.name = f"{provider}:{model}"
        self.timeout = timeout
        self.stream = stream
        self.settings: Mapping[str, Any] = dict(settings or {})
        self.capabilities = capabilities if capabilities is not None else CapabilityMemory()
        """What this model learned about its endpoint (see `CapabilityMemory`)."""
        try:
            self.output_modes = check_modes(LADDER if output_modes is None else output_modes)
        except ValueError as exc:
            raise ModelError(f"{self.name}: {exc}") from None
        self._factory: Callable[[], openai.AsyncOpenAI] | None
        if client is None:
            base_url = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_BASE_URL
            key = api_key or os.environ.get("OPENAI_API_KEY") or ""
            if not key:
                if base_url.rstrip("/") == OPENAI_BASE_URL:
                    raise ModelError(
                        f"{self.name} needs an API key: set OPENAI_API_KEY or pass api_key=..."
                    )
                key = NO_API_KEY

            def build() -> openai.AsyncOpenAI:
                return openai.AsyncOpenAI(
                    api_key=key, base_url=base_url, max_retries=0, timeout=timeout
                )

            self._factory = build
            first = build()
        else:
            # A function is called again for each new event loop; a client is used as it is.
            self._factory = None if isinstance(client, openai.AsyncOpenAI) else client
            first = client if isinstance(client, openai.AsyncOpenAI) else client()
            base_url = str(first.base_url)
        # As given when the client is built here (the client's copy drops a default port).
        self.base_url = base_url.rstrip("/")
        self._secret = Secret(first.api_key or "")  # never a plain attribute: vars() shows it
        self._key = (self.base_url, model)
        self._where = redact_url(f"{self.name} at {self.base_url}")
        self._first: openai.AsyncOpenAI | None = first if self._factory is not None else None
        """The client made with the model, for the first event loop that uses it."""
        self._given = first.with_options(max_retries=0) if self._factory is None else None
        """The client given as is (with no retries of its own), when it was."""
        self._owner: weakref.ref[asyncio.AbstractEventLoop] | None = None
        """The event loop a client given as is serves."""
        self._clients: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        """The client of each event loop the model serves (closed loops are dropped)."""

    async def _bound(self) -> _LoopClient:
        """The client whose connections belong to the running event loop.

        HTTP connections belong to the event loop that opened them: a model used from a new
        loop (`execute_sync` twice, another `asyncio.run`) gets a new client from its factory,
        closed when that loop shuts down (`asyncio.run` and `execute_sync` do that as they end),
        so nothing of it is left for a later loop to free.

        Raises:
            ModelError: the client was given as is and already serves another event loop, or
                real model requests are blocked (`minions.testing.block_real_models`).
        """
        check_request(self.name, self.base_url)  # every request and check comes this way
        loop = asyncio.get_running_loop()
        bound = self._clients.get(loop)
        if bound is not None:
            return bound
        for other in [other for other in self._clients if other.is_closed()]:
            del self._clients[other]
        if self._given is not None:
            if self._owner is None or self._owner() is loop:
                self._owner = weakref.ref(loop)
                return self._bind(loop, self._given, closer=None)
            raise ModelError(
                f"{self._where}: the openai client given as `client=` belongs to the event loop "
                "it was first used in (its connections do), and this is another one: pass a "
                "function making the client instead, called once per event loop: "
                "client=lambda: openai.AsyncOpenAI(...)"
            )
        assert self._factory is not None  # Either given as is, or made by a function.
        if self._first is not None:
            client, self._first = self._first, None
        else:
            client = self._factory()
        client = client.with_options(max_retries=0)
        closer = _closed_with_loop(client)
        await anext(closer)
        return self._bind(loop, client, closer=closer)

    def _bind(
        self,
        loop: asyncio.AbstractEventLoop,
        client: openai.AsyncOpenAI,
        *,
        closer: AsyncGenerator[None] | None,
    ) -> _LoopClient:
        bound = self._clients[loop] = _LoopClient(
            client=client,
            create=cast("Callable[..., Awaitable[Any]]", client.chat.completions.create),
            closer=closer,
        )
        return bound

    def __repr__(self) -> str:
        return f"OpenAIChatModel({self.model!r}, base_url={redact_url(self.base_url)!r})"

    async def aclose(self) -> None:
        """Close the HTTP connections of the running event loop's client (built here, made by
        the function given, or given as is); a later call opens new ones. The clients of
        other loops close as their loops end."""
        bound = self._clients.pop(asyncio.get_running_loop(), None)
        if bound is None:
            if self._first is not None:
                first, self._first = self._first, None
                await first.close()
            return
        if bound.closer is not None:
            await bound.closer.aclose()  # Closes the client, and nothing is left to close later.
        else:
            await bound.client.close()

    @property
    def endpoint(self) -> tuple[str, str]:
        """(base URL, model id)."""
        return self._key

    @property
    def output_mode(self) -> OutputMode | None:
        """The structured-output mode that last worked for this endpoint and model, if any."""
        return self.capabilities.worked(self._key)

    @property
    def rejected(self) -> frozenset[str]:
        """Features this endpoint and model refused so far (rungs, ``stream_options``)."""
        return self.capabilities.rejected(self._key)

    async def check(self) -> None:
        """Ask the endpoint for its models (``GET /models``, a few seconds at most).

        Raises:
            ModelError: the endpoint cannot be reached, or refuses the request, with its URL.
        """
        try:
            client = (await self._bound()).client
            await client.with_options(timeout=min(self.timeout or 10.0, 10.0)).models.list()
        except (openai.OpenAIError, httpx2.TransportError) as exc:
            error = translate_error(exc, where=self._where, timeout=None, redact=self._redact)
            raise ModelError(
                f"{error} (checked before the run started, so nothing ran; `minions run "
                "--no-preflight` skips this check)",
                status_code=error.status_code,
            ) from None

    # -- one call ------------------------------------------------------------------------------

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        """Answer `prompt`; with `prompt.output`, climb down the structured-output ladder.

        Raises:
            TransientModelError: timeout, connection error, 408/409/429 or 5xx.
            ModelOutputError: a cut-off, bad tool arguments or invalid output (re-ask).
            ModelError: any other refusal (400, 401, 403, 404, ...).
        """
        request = self._request(prompt)
        output = prompt.output
        if not (self.stream or prompt.stream):
            on_token = None  # streams by default, or when the caller streams the step
        if output is None:
            completion = await self._send(request, on_token)
            usage = usage_of(completion)
            return self._response(completion, message_of(completion, usage, None), usage)
        with_tools = "tools" in request
        memory = self.capabilities
        rungs = memory.ladder(self._key, self._ladder(with_tools))
        demoted: list[ModeDemotion] = []
        for mode in rungs:
            shaped = shape_request(request, output, mode, with_tools=with_tools)
            try:
                completion = await self._send(shaped, on_token, rung=mode)
            except _RungRejected as rejected:
                memory.reject(self._key, mode, detail=str(rejected.error)[:300])
                demoted.append(self._demoted(mode, f"the server refused it: {rejected.error}"))
                if mode == rungs[-1]:
                    rejected.error.demoted = tuple(demoted)
                    raise rejected.error from None
                continue
            usage = usage_of(completion)
            try:
                message = message_of(completion, usage, mode)
                value, produced = read_output(message, output, mode)
            except (ModelOutputError, OutputValidationError) as exc:
                error = (
                    exc
                    if isinstance(exc, ModelOutputError)
                    else ModelOutputError(str(exc), usage=usage, mode=mode)
                )
                # Forced with tools of the step's own offered too, a `tool` answered in
                # prose: the endpoint ignores tools altogether (llama.cpp without a tool
                # template).
                also = ("tools",) if mode == "tool" and "tools" in request else ()
                if _ignored(exc, completion, mode) and memory.ignored(self._key, mode, also=also):
                    reason = f"{memory.demote_after} answers in a row ignored it"
                    demoted.append(self._demoted(mode, reason))
                error.demoted = tuple(demoted)
                raise error from None
            response = self._response(completion, message, usage)
            if demoted:
                response = dataclasses.replace(response, demoted=tuple(demoted))
            if value is NO_OUTPUT:
                return response
            memory.record(self._key, produced)
            return dataclasses.replace(response, output=value, output_mode=produced)
        raise AssertionError("unreachable: the ladder is never empty")  # pragma: no cover

    def _demoted(self, mode: OutputMode, reason: str) -> ModeDemotion:
        base_url = redact_url(self.base_url)
        info("output mode demoted", model=self.name, base_url=base_url, mode=mode, reason=reason)
        return ModeDemotion(mode=mode, reason=reason, base_url=base_url)

    def _ladder(self, with_tools: bool) -> tuple[OutputMode, ...]:
        if not with_tools or self.capabilities.refuses(self._key, "tools"):
            # An endpoint that ignores tools cannot call the step's tools either: native JSON,
            # which would forbid tool calls, costs nothing there.
            return self.output_modes
        allowed = [mode for mode in self.output_modes if mode in LADDER_WITH_TOOLS]
        return tuple(allowed) or ("tool",)

    def _request(self, prompt: Prompt) -> dict[str, Any]:
        settings = {**self.settings, **prompt.settings}
        request = split_settings(settings) if settings else {}
        request["model"] = self.model
        request["messages"] = to_openai_messages(prompt.messages)
        if prompt.tools and prompt.tool_choice != "none":
            request["tools"] = to_openai_tools(prompt.tools)
            if prompt.tool_choice != "auto":
                request["tool_choice"] = prompt.tool_choice
        return request

    def _response(
        self, completion: ChatCompletion, message: Message, usage: Usage
    ) -> ModelCallResponse:
        choice = completion.choices[0]
        return ModelCallResponse(
            message=message,
            usage=usage,
            finish_reason=choice.finish_reason,
            model=completion.model or self.model,
            response_id=completion.id or None,
            raw=completion,
        )

    # -- the HTTP exchange ---------------------------------------------------------------------

    async def _send(
        self,
        request: dict[str, Any],
        on_token: TokenCallback | None,
        *,
        rung: OutputMode | None = None,
    ) -> ChatCompletion:
        try:
            if on_token is None:
                create = (await self._bound()).create
                completion: ChatCompletion = await create(**request)
                return completion
            return await self._stream(request, on_token)
        except (openai.OpenAIError, httpx2.TransportError, json.JSONDecodeError) as exc:
            error = translate_error(
                exc, where=self._where, timeout=self.timeout, redact=self._redact
            )
            if rung is not None and _rejects(exc, rung):
                raise _RungRejected(error) from None
            # `from None`: the client's exception may quote a server that echoed the key.
            raise error from None

    async def _stream(self, request: dict[str, Any], on_token: TokenCallback) -> ChatCompletion:
        kwargs = {**request, "stream": True}
        if "stream_options" not in self.capabilities.rejected(self._key):
            kwargs["stream_options"] = {"include_usage": True}
        create = (await self._bound()).create
        try:
            stream = await create(**kwargs)
        except openai.APIStatusError as exc:
            if "stream_options" not in kwargs or not _rejects(exc, "stream_options"):
                raise
            # Usage in streams is an extension some servers refuse: stream without it.
            self.capabilities.reject(self._key, "stream_options", detail=server_message(exc))
            del kwargs["stream_options"]
            stream = await create(**kwargs)
        accumulator = StreamAccumulator()
        try:
            async for chunk in stream:
                text = accumulator.add(chunk)
                if text:
                    on_token(text)
        except json.JSONDecodeError as exc:
            broken = TransientModelError(
                f"{self._where}: a streamed chunk is not valid JSON ({exc.msg}), after "
                f"{accumulator.received} of the answer: the answer is incomplete"
            )
            broken.usage = accumulator.usage()
            raise broken from None
        finally:
            await stream.close()
        if accumulator.finish_reason is None:
            # A server or proxy that closed the stream mid-answer ends it as cleanly as one
            # that is done: only the finish reason says the answer is whole.
            cut = TransientModelError(
                f"{self._where}: the stream ended before the answer's finish reason, after "
                f"{accumulator.received}: the answer is incomplete"
            )
            cut.usage = accumulator.usage()
            raise cut
        return accumulator.completion()

    def _redact(self, text: str) -> str:
        secret = self._secret.get()
        if len(secret) >= 6 and secret != NO_API_KEY:
            text = text.replace(secret, "[redacted]")
        return redact_url(text)
