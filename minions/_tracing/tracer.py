"""`RunTracer`: the OpenTelemetry spans of runs, written where the work happens.

A run is an ``invoke_workflow {recipe}`` span; each step execution an ``invoke_agent {step}``
child; each model call attempt a ``chat {model}`` CLIENT span and each tool call attempt an
``execute_tool {tool}`` span under their step. Spans are made current while their work runs,
so spans the application makes inside a tool (or an instrumented HTTP client inside a model)
nest under them, and steps that run in parallel are siblings under the run.

A durable run's execution may end before the run does: it parks while a call waits for a
person, or its worker drains and hands it back. The work that cancels did not fail: its spans
end without an error, saying why (``minions.cut_short``), and the execution that goes on later
says so on its own spans (``minions.run.resumed``, ``minions.step.resumed_at``).

Only the ``opentelemetry-api`` package is used, imported when a tracer is built: the library
never configures a provider or an exporter, and nothing is traced unless a `TracerProvider` is
given. Message content is written only when asked for (`capture_content`, or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY``), and URL credentials are
hidden from everything written.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

from minions._messages import Message, ModelCallResponse, Prompt, ToolCall, ToolSpec
from minions._text import redact_url
from minions._tracing import semconv as sc
from minions._values import Usage
from minions._version import __version__
from minions.errors import MissingExtraError
from minions.models import Model

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Tracer, TracerProvider

    from minions._emitter import CutShort, EventEmitter

__all__: list[str] = []

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The conventions' switch for content: ``SPAN_ONLY`` (or ``SPAN_AND_EVENT``) writes it on
spans; anything else, or nothing, writes none."""

_SETTINGS = (
    ("temperature", sc.REQUEST_TEMPERATURE),
    ("top_p", sc.REQUEST_TOP_P),
    ("max_tokens", sc.REQUEST_MAX_TOKENS),
    ("max_completion_tokens", sc.REQUEST_MAX_TOKENS),
    ("seed", sc.REQUEST_SEED),
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


class _TracedRun:
    """The run whose spans are being written: its id, and its events' emitter (which knows
    when the run's execution was cut short)."""

    __slots__ = ("events", "run_id")

    def __init__(self, run_id: str, events: EventEmitter | None) -> None:
        self.run_id = run_id
        self.events = events


_RUN: ContextVar[_TracedRun | None] = ContextVar("minions_trace_run", default=None)
"""The run whose spans are being written (its steps, model and tool calls run in tasks that
inherit it): every span carries its id as ``gen_ai.conversation.id``."""


def _operation(operation: str) -> dict[str, str]:
    """The attributes every span of `operation` starts with: the conventions' operation, its
    OpenInference kind, and the run it belongs to."""
    attributes = {
        sc.OPERATION_NAME: operation,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_KINDS[operation],
    }
    run = _RUN.get()
    if run is not None:
        attributes[sc.CONVERSATION_ID] = run.run_id
    return attributes


def _cut_short(cancelled: bool) -> CutShort | None:
    """Why the run's execution ended before the run did (it parked, or was handed back), when
    the work of a span was `cancelled`: that cancel cut it short, it did not fail."""
    run = _RUN.get() if cancelled else None
    if run is None or run.events is None:
        return None
    return run.events.cut_short


def capture_from_environment() -> bool:
    """Whether the environment asks for message content on spans."""
    value = os.environ.get(CAPTURE_ENV, "").strip().upper()
    return value in ("SPAN_ONLY", "SPAN_AND_EVENT", "TRUE")


def error_type(error: BaseException) -> str:
    """A low-cardinality name for what went wrong (the conventions' ``error.type``)."""
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if isinstance(error, TimeoutError):
        return "timeout"
    kind = type(error)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _fail(span: Span, kind: str, description: str) -> None:
    span.set_attribute(sc.ERROR_TYPE, kind)
    span.set_status(_api.error, hide_credentials(redact_url(description))[:1000])


def _usage(usage: Usage, input_key: str, output_key: str) -> dict[str, int]:
    if usage.unknown_calls:
        return {}  # The server did not say: no count beats a wrong zero.
    return {input_key: usage.prompt_tokens, output_key: usage.completion_tokens}


# `redact_url`'s patterns, stopping at quotes and backslashes too: content is often JSON, and
# hiding a credential must not eat the quote that ends its string.
_USERINFO = re.compile(r"(?<=//)[^/@\s\"'\\]*@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:[a-z0-9_.-]*(?:key|token|secret|password|passwd|pwd|sig|signature|auth)"
    r"[a-z0-9_.-]*)=)[^&#\s\"'\\]*"
)


def hide_credentials(text: str) -> str:
    """`text` with the credentials of URLs in it hidden (``user:pass@`` and secret-looking
    query values), leaving the JSON around them intact."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub("***@", text))


def _json(value: Any) -> str:
    return hide_credentials(json.dumps(value, ensure_ascii=False, default=str))


class ModelDescription:
    """What the conventions want to know about a model: provider, model id and server."""

    __slots__ = ("attributes", "model", "request_model")

    def __init__(self, model: Model) -> None:
        self.model = model  # held, so the cache key (its id) is not reused
        provider, _, request_model = model.name.partition(":")
        if not request_model:
            provider, request_model = "_OTHER", model.name
        self.request_model = request_model
        attributes: dict[str, str | int] = {
            sc.PROVIDER_NAME: provider,
            sc.REQUEST_MODEL: request_model,
        }
        base_url = _base_url(model)
        if base_url:
            # `hostname` and `port` never hold the URL's user and password.
            parts = urlsplit(base_url)
            if parts.hostname:
                attributes[sc.SERVER_ADDRESS] = parts.hostname
                try:
                    port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
                except ValueError:
                    port = None
                if port:
                    attributes[sc.SERVER_PORT] = port
        self.attributes = attributes


def _base_url(model: Model) -> str | None:
    """The server of a model, looking through wrappers (recording, replay...)."""
    current: object = model
    for _ in range(8):
        base_url = getattr(current, "base_url", None)
        if isinstance(base_url, str):
            return base_url
        inner = getattr(current, "model", None)
        if not isinstance(inner, Model):
            return None
        current = inner
    return None


class _SpanScope:
    """A started span, current from ``with`` until its end; an exception leaving the block
    marks it failed (`error.type`), unless it is the cancel of a run's execution cut short
    (``minions.cut_short``). A class, not a generator: this runs for every call."""

    __slots__ = ("_token", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._token: Token[Context] | None = None

    def __enter__(self) -> Self:
        self._token = _api.attach(_api.set_span_in_context(self.span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if error is not None:
                self._failed(error)
        finally:
            if self._token is not None:
                _api.detach(self._token)
            self.span.end()

    def _failed(self, error: BaseException) -> None:
        cut = _cut_short(isinstance(error, asyncio.CancelledError))
        if cut is not None:
            self.span.set_attribute(sc.MINIONS_CUT_SHORT, cut)
            return
        _fail(self.span, error_type(error), str(error) or error_type(error))


class ChatSpan(_SpanScope):
    """The span of one model call attempt, told about the answer."""

    __slots__ = ("_capture",)

    def __init__(self, span: Span, capture: bool) -> None:
        super().__init__(span)
        self._capture = capture

    def answered(self, response: ModelCallResponse) -> None:
        if not self.span.is_recording():
            return  # sampled out, or a no-op provider: nothing would be kept
        attributes: dict[str, Any] = _usage(
            response.usage, sc.USAGE_INPUT_TOKENS, sc.USAGE_OUTPUT_TOKENS
        )
        if response.model:
            attributes[sc.RESPONSE_MODEL] = response.model
        if response.response_id:
            attributes[sc.RESPONSE_ID] = response.response_id
        if response.finish_reason:
            attributes[sc.RESPONSE_FINISH_REASONS] = (response.finish_reason,)
        if response.output_mode:
            attributes[sc.MINIONS_OUTPUT_MODE] = response.output_mode
        if self._capture:
            message = _message(response.message)
            message["finish_reason"] = response.finish_reason or "stop"
            attributes[sc.OUTPUT_MESSAGES] = _json([message])
        self.span.set_attributes(attributes)

    def _failed(self, error: BaseException) -> None:
        usage = getattr(error, "usage", None)
        if isinstance(usage, Usage):
            self.span.set_attributes(_usage(usage, sc.USAGE_INPUT_TOKENS, sc.USAGE_OUTPUT_TOKENS))
        mode = getattr(error, "mode", None)
        if isinstance(mode, str):
            self.span.set_attribute(sc.MINIONS_OUTPUT_MODE, mode)
        super()._failed(error)


class StepSpan(_SpanScope):
    """The span of one step execution, told how it ended."""

    __slots__ = ()

    def _failed(self, error: BaseException) -> None:
        return  # `finished` said how the step ended (a cancelled step included)

    def finished(self, *, failed: bool, error: str | None, error_kind: str | None) -> None:
        # A step's tokens are its chat spans'; only the run has totals (`minions.usage.*`).
        if not failed:
            return
        cut = _cut_short(error_kind == "cancelled")
        if cut is not None:
            self.span.set_attribute(sc.MINIONS_CUT_SHORT, cut)
            return
        _fail(self.span, error_kind or "step_failed", error or "the step failed")


class ToolSpan(_SpanScope):
    """The span of one tool call attempt."""

    __slots__ = ("_capture",)

    def __init__(self, span: Span, capture: bool) -> None:
        super().__init__(span)
        self._capture = capture

    def result(self, content: str) -> None:
        """The result the model sees (written only when content is captured)."""
        if self._capture:
            self.span.set_attribute(sc.TOOL_CALL_RESULT, hide_credentials(content))


class _Api:
    """The few `opentelemetry` functions used on every span, imported once."""

    def __init__(self) -> None:
        try:
            from opentelemetry import context, trace
        except ImportError:
            raise MissingExtraError(
                "tracing needs the OpenTelemetry API: pip install 'minions[otel]'"
            ) from None
        self.attach = context.attach
        self.detach = context.detach
        self.set_span_in_context = trace.set_span_in_context
        self.kinds = trace.SpanKind
        self.error = trace.StatusCode.ERROR


_api: _Api


def _load() -> _Api:
    """Import the API (again: the import is cached by Python, and a missing package is
    reported each time a tracer is made)."""
    global _api
    _api = _Api()
    return _api


class RunTracer:
    """Writes the spans of runs to a `TracerProvider` (see the module's docstring).

    Args:
        provider: where spans go; the application configures it (processors, exporters).
        capture_content: write messages, tool arguments and results on spans (off by
            default, as the conventions say). ``None``: as
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says (``SPAN_ONLY``).

    Raises:
        MissingExtraError: ``opentelemetry-api`` is not installed.
    """

    def __init__(self, provider: TracerProvider, *, capture_content: bool | None = None) -> None:
        api = _load()
        self.provider = provider
        self.capture_content = (
            capture_from_environment() if capture_content is None else capture_content
        )
        self._tracer: Tracer = provider.get_tracer("minions", __version__)
        self._internal = api.kinds.INTERNAL
        self._client = api.kinds.CLIENT
        self._models: dict[int, ModelDescription] = {}

    def _start(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Span:
        return self._tracer.start_span(
            name,
            kind=kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )

    # -- runs and steps ------------------------------------------------------------------------

    @contextmanager
    def run(
        self,
        recipe_id: str,
        run_id: str,
        *,
        events: EventEmitter | None = None,
        attempt: int | None = None,
        resumed: bool = False,
    ) -> Iterator[Span]:
        """The run's span, current while the body runs (steps started inside inherit it, and
        the run id as every span's ``gen_ai.conversation.id``).

        Args:
            events: the run's emitter: once it is silenced (a durable run's execution cut
                short), the work cancelled in the run ends without an error.
            attempt: which attempt of a durable run this execution is.
            resumed: this execution goes on from the run's stored work.
        """
        traced = _RUN.set(_TracedRun(run_id, events))
        try:
            attributes: dict[str, Any] = {
                **_operation(sc.OPERATION_INVOKE_WORKFLOW),
                sc.WORKFLOW_NAME: recipe_id,
                sc.AGENT_NAME: recipe_id,
                sc.MINIONS_RECIPE_ID: recipe_id,
                sc.MINIONS_RUN_ID: run_id,
            }
            if attempt is not None:
                attributes[sc.MINIONS_RUN_ATTEMPT] = attempt
            if resumed:
                attributes[sc.MINIONS_RUN_RESUMED] = True
            span = self._start(
                f"{sc.OPERATION_INVOKE_WORKFLOW} {recipe_id}", self._internal, attributes
            )
            with _SpanScope(span):
                yield span
        finally:
            _RUN.reset(traced)

    def run_finished(self, span: Span, *, error: str | None, usage: Usage) -> None:
        span.set_attributes(
            {
                sc.MINIONS_USAGE_CALLS: usage.calls,
                **_usage(usage, sc.MINIONS_USAGE_INPUT_TOKENS, sc.MINIONS_USAGE_OUTPUT_TOKENS),
            }
        )
        if error is not None:
            _fail(span, "run_failed", error)

    def step(
        self,
        step_id: str,
        *,
        kind: str,
        visit: int,
        item: int | None,
        resumed_at: str | None = None,
        restarted: str | None = None,
    ) -> StepSpan:
        """One step execution's span, current inside ``with``; `resumed_at` is the call a
        durable run's step goes on at (it waited there when its run parked), `restarted` why
        such a step starts again from its start instead."""
        attributes: dict[str, Any] = {
            **_operation(sc.OPERATION_INVOKE_AGENT),
            sc.AGENT_NAME: step_id,
            sc.MINIONS_STEP_KIND: kind,
            sc.MINIONS_STEP_VISIT: visit,
        }
        if item is not None:
            attributes[sc.MINIONS_STEP_ITEM] = item
        if resumed_at is not None:
            attributes[sc.MINIONS_STEP_RESUMED_AT] = resumed_at
        if restarted is not None:
            attributes[sc.MINIONS_STEP_RESTARTED] = hide_credentials(restarted)[:1000]
        return StepSpan(
            self._start(f"{sc.OPERATION_INVOKE_AGENT} {step_id}", self._internal, attributes)
        )

    # -- model and tool calls ------------------------------------------------------------------

    def _describe(self, model: Model) -> ModelDescription:
        found = self._models.get(id(model))
        if found is None or found.model is not model:
            found = self._models[id(model)] = ModelDescription(model)
        return found

    def chat(self, model: Model, prompt: Prompt, *, attempt: int) -> ChatSpan:
        """One model call attempt's CLIENT span, current inside ``with``."""
        described = self._describe(model)
        attributes: dict[str, Any] = {
            **_operation(sc.OPERATION_CHAT),
            **described.attributes,
            sc.MINIONS_ATTEMPT: attempt,
        }
        if prompt.output is not None:
            # Only when the request asks for an output format, as the conventions say.
            attributes[sc.OUTPUT_TYPE] = "json"
        if prompt.settings:
            for setting, key in _SETTINGS:
                value = prompt.settings.get(setting)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    attributes[key] = value
        if self.capture_content:
            attributes.update(_prompt_content(prompt.messages))
            if prompt.tools and prompt.tool_choice != "none":
                attributes[sc.TOOL_DEFINITIONS] = _tool_definitions(prompt.tools)
        span = self._start(
            f"{sc.OPERATION_CHAT} {described.request_model}", self._client, attributes
        )
        return ChatSpan(span, self.capture_content)

    def tool(
        self, call: ToolCall, *, attempt: int, origin: tuple[str, str] | None = None
    ) -> ToolSpan:
        """One tool call attempt's span, current inside ``with``; `origin` is the MCP server
        and its own name of the tool, for a tool of an MCP server."""
        attributes = self._tool_attributes(call, attempt)
        if origin is not None:
            attributes[sc.MCP_METHOD_NAME] = sc.MCP_TOOLS_CALL
            attributes[sc.MINIONS_MCP_SERVER], attributes[sc.MINIONS_MCP_TOOL] = origin
        span = self._start(f"{sc.OPERATION_EXECUTE_TOOL} {call.name}", self._internal, attributes)
        return ToolSpan(span, self.capture_content)

    def tool_refused(self, call: ToolCall, *, error: BaseException, started_ns: int) -> None:
        """A call that failed before the tool ran (unknown tool, invalid arguments, refused
        approval): one failed span over that time."""
        span = self._tracer.start_span(
            f"{sc.OPERATION_EXECUTE_TOOL} {call.name}",
            kind=self._internal,
            attributes=self._tool_attributes(call, 1),
            start_time=started_ns,
            record_exception=False,
            set_status_on_exception=False,
        )
        _fail(span, error_type(error), str(error) or error_type(error))
        span.end()

    def _tool_attributes(self, call: ToolCall, attempt: int) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            **_operation(sc.OPERATION_EXECUTE_TOOL),
            sc.TOOL_NAME: call.name,
            sc.TOOL_CALL_ID: call.id,
            sc.TOOL_TYPE: "function",
            sc.MINIONS_ATTEMPT: attempt,
        }
        if self.capture_content:
            attributes[sc.TOOL_CALL_ARGUMENTS] = _json(dict(call.arguments))
        return attributes


# -- content, in the conventions' JSON shape ---------------------------------------------------


def _message(message: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        )
    elif message.content:
        parts.append({"type": "text", "content": message.content})
    parts.extend(
        {"type": "tool_call", "id": c.id, "name": c.name, "arguments": dict(c.arguments)}
        for c in message.tool_calls
    )
    return {"role": message.role, "parts": parts}


def _prompt_content(messages: Sequence[Message]) -> Mapping[str, str]:
    system = [{"type": "text", "content": m.content} for m in messages if m.role == "system"]
    found = {sc.INPUT_MESSAGES: _json([_message(m) for m in messages if m.role != "system"])}
    if system:
        found[sc.SYSTEM_INSTRUCTIONS] = _json(system)
    return found


def _tool_definitions(tools: Sequence[ToolSpec]) -> str:
    """The tools offered to the model, in the conventions' shape (as the request sends them)."""
    return _json(
        [
            {
                "type": "function",
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            }
            for spec in tools
        ]
    )
