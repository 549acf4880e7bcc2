"""The OpenAI chat-completions wire format: minions values to request dicts and back, streamed
chunks to one completion, and `openai` errors to minions errors."""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from minions._messages import Message, OutputMode, ToolCall, ToolSpec, Usage
from minions.errors import ModelError, ModelOutputError, TransientModelError

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

__all__ = []

LENGTH_NOTE = (
    "Your reply was cut off at the length limit before it was complete. Answer again, more briefly."
)


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages in the OpenAI chat shape, with no two messages of one role (system, user,
    plain assistant) in a row: such a message joins the one before it."""
    result: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            result.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
            )
        elif message.tool_calls:
            result.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {
                                "name": call.name,
                                "arguments": json.dumps(dict(call.arguments), default=str),
                            },
                        }
                        for call in message.tool_calls
                    ],
                }
            )
        elif result and result[-1]["role"] == message.role and "tool_calls" not in result[-1]:
            # Many chat templates (Gemma's, Mistral's, Llama 2's) refuse two messages of one
            # role in a row: a re-ask's note, or a shared conversation's next goal, joins the
            # message before it.
            previous = result[-1]
            result[-1] = {**previous, "content": f"{previous['content']}\n\n{message.content}"}
        else:
            result.append({"role": message.role, "content": message.content})
    return result


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as OpenAI function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            },
        }
        for spec in tools
    ]


@cache
def _create_parameters() -> frozenset[str]:
    import inspect

    from openai.resources.chat.completions import AsyncCompletions

    return frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}


def split_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` as `create()` keyword arguments: parameters the client knows pass as they
    are, the rest (``top_k``, ``min_p``, ...) go in ``extra_body`` for the server."""
    known = _create_parameters()
    unknown = {key: value for key, value in settings.items() if key not in known}
    if not unknown:
        return settings
    result = {key: value for key, value in settings.items() if key in known}
    result["extra_body"] = {**settings.get("extra_body", {}), **unknown}
    return result


def _starts_with_json_object(text: str) -> bool:
    stripped = text.lstrip()
    if not stripped.startswith("{"):
        return False
    try:
        json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return False
    return True


def usage_of(completion: ChatCompletion) -> Usage:
    """The completion's usage; unknown (never zero) when the server did not report it."""
    usage = completion.usage
    if usage is None:
        return Usage.of_call(None, None)
    return Usage.of_call(usage.prompt_tokens, usage.completion_tokens)


def message_of(completion: ChatCompletion, usage: Usage, mode: OutputMode | None) -> Message:
    """The assistant message of the completion's first choice.

    Raises:
        ModelOutputError: no choice, a ``length`` cut-off (unless structured output was asked
            for and the answer starts with a whole JSON object), or tool arguments that are not
            a JSON object; with `usage` and `mode`, so the re-ask is counted and attributed.
    """
    if not completion.choices:
        raise ModelOutputError(
            "Your reply was empty. Answer the task.",
            reason="the reply was empty",
            usage=usage,
            mode=mode,
        )
    choice = completion.choices[0]
    if choice.finish_reason == "length" and not (
        mode is not None and _starts_with_json_object(choice.message.content or "")
    ):
        # A structured answer that starts with a whole JSON object is read (and validated)
        # although the model went on talking until the limit; small models often do.
        raise ModelOutputError(
            LENGTH_NOTE,
            reason="the reply was cut off at the length limit (max_tokens)",
            usage=usage,
            mode=mode,
        )
    reply = choice.message
    calls = []
    for raw in reply.tool_calls or ():
        function = getattr(raw, "function", None)
        if function is None:  # A custom (non-function) tool call: nothing minions offered.
            continue
        try:
            calls.append(
                ToolCall.parse(
                    # Some local servers send no call ids; the memory invariant needs them.
                    id=raw.id or f"call_{uuid.uuid4().hex[:12]}",
                    name=function.name,
                    arguments=function.arguments,
                )
            )
        except ModelOutputError as exc:
            raise ModelOutputError(exc.note, reason=exc.reason, usage=usage, mode=mode) from None
    return Message.assistant(reply.content or "", calls)


@dataclass
class _CallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAccumulator:
    """Joins streamed chunks into one `ChatCompletion`, in time linear in its length."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _CallParts] = {}
        self._finish_reason: str | None = None
        self._usage: Any = None
        self._id = ""
        self._model = ""

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk; return its text delta (empty when it has none)."""
        self._id = self._id or chunk.id
        self._model = self._model or chunk.model
        if chunk.usage is not None:
            self._usage = chunk.usage
        if not chunk.choices:
            return ""
        choice = chunk.choices[0]
        if choice.finish_reason:
            self._finish_reason = choice.finish_reason
        delta = choice.delta
        for position, call in enumerate(delta.tool_calls or ()):
            # Servers that send whole calls in one chunk may leave the index out.
            index = call.index if call.index is not None else len(self._calls) + position
            parts = self._calls.setdefault(index, _CallParts())
            parts.id = parts.id or call.id or ""
            if call.function is not None:
                parts.name = parts.name or call.function.name or ""
                if call.function.arguments:
                    parts.arguments.append(call.function.arguments)
        text = delta.content or ""
        if text:
            self._text.append(text)
        return text

    @property
    def finish_reason(self) -> str | None:
        """The finish reason of the answer; `None` until a chunk gave it (the answer is
        complete only with one)."""
        return self._finish_reason

    @property
    def received(self) -> str:
        """What came so far, in words: ``"12 characters and 1 tool call"``."""
        characters = sum(len(text) for text in self._text)
        calls = len(self._calls)
        said = f"{characters} character{'s' * (characters != 1)}"
        if calls:
            said += f" and {calls} tool call{'s' * (calls != 1)}"
        return said

    def usage(self) -> Usage:
        """The usage the stream reported so far; unknown when it reported none."""
        if self._usage is None:
            return Usage.of_call(None, None)
        return Usage.of_call(self._usage.prompt_tokens, self._usage.completion_tokens)

    def completion(self) -> ChatCompletion:
        from openai.types.chat import ChatCompletion

        calls = [
            {
                "id": parts.id,
                "type": "function",
                "function": {"name": parts.name, "arguments": "".join(parts.arguments)},
            }
            for _, parts in sorted(self._calls.items())
        ]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
        if calls:
            message["tool_calls"] = calls
        # `construct` keeps whatever finish reason a local server invents, without validation.
        return ChatCompletion.construct(
            id=self._id,
            object="chat.completion",
            created=int(time.time()),
            model=self._model,
            choices=[{"index": 0, "finish_reason": self._finish_reason, "message": message}],
            usage=self._usage.to_dict() if self._usage is not None else None,
        )


def retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date):
    never negative (a date in the past is 0), ``None`` when neither says a finite number
    (``inf``, ``NaN``, garbage, a date no calendar has)."""
    if headers is None:
        return None
    millis = _seconds(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(str(value)[:200])
        return max(when.timestamp() - time.time(), 0.0)
    except (TypeError, ValueError, OverflowError, IndexError, OSError):
        return None


def _seconds(value: Any) -> float | None:
    """A header's finite, non-negative number (a negative one is 0), or ``None``."""
    text = None if value is None else str(value).strip()
    if not text or len(text) > 100:  # no number of seconds is that long
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return max(number, 0.0) if math.isfinite(number) else None


def server_message(error: Any) -> str:
    """What the server said, from an `openai.APIStatusError`'s body, on one line (a chat
    template's multi-line Jinja error included)."""
    body = getattr(error, "body", None)
    text = str(getattr(error, "message", "") or error)
    if isinstance(body, dict):
        message = body.get("message") or body.get("detail") or body.get("error")
        if message:
            text = message if isinstance(message, str) else json.dumps(message, default=str)
    elif isinstance(body, str) and body.strip():
        text = body
    lines = [line.strip() for line in text.splitlines()]
    return " ".join(line for line in lines if line.strip("-=. ")).strip()[:500]


_CONTEXT_FULL: Final = re.compile(
    r"context (length|size|window)|maximum context|too many tokens|exceeds the available", re.I
)
"""How servers say a prompt is too long (OpenAI, vLLM, llama.cpp, Ollama)."""


def _never_sent(error: BaseException) -> bool:
    """Whether the request never reached the server (the connection itself failed)."""
    import httpx2

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, httpx2.ConnectError | httpx2.ConnectTimeout):
            return True
        seen = seen.__cause__
    return False


def translate_error(
    error: BaseException, *, where: str, timeout: float | None, redact: Callable[[str], str]
) -> ModelError:
    """A minions error for an `openai` (or transport) error: transient for timeouts,
    connection errors, 408/409/429 and 5xx; final for the rest. Messages go through
    `redact`, so a server echoing the API key does not spread it."""
    import httpx2
    import openai

    if isinstance(error, json.JSONDecodeError):
        # The `openai` client lets a body that is not JSON escape as it is: cut off by a
        # proxy, or garbled. A half answer, like a dropped connection.
        return TransientModelError(
            f"{where}: the answer's body is not valid JSON ({error.msg} at position "
            f"{error.pos}): it was cut off or garbled"
        )
    never_sent = _never_sent(error)
    if isinstance(error, openai.APITimeoutError | httpx2.TimeoutException) and not never_sent:
        limit = f" within the client timeout of {timeout}s" if timeout else ""
        return TransientModelError(f"{where}: no answer{limit}")
    if isinstance(error, openai.APIConnectionError | httpx2.TransportError):
        cause = error.__cause__ or error
        detail = redact(str(cause) or type(cause).__name__)
        if isinstance(error, httpx2.RemoteProtocolError) or isinstance(
            cause, httpx2.RemoteProtocolError
        ):
            # The server answered, then the connection dropped before the end of the body.
            return TransientModelError(
                f"{where}: the connection closed before the answer was complete ({detail})"
            )
        failed = TransientModelError(f"{where}: connection failed ({detail}); is the server up?")
        if never_sent:
            failed.usage = Usage(calls=1)  # Nothing reached the server: it cost nothing.
        return failed
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        message = redact(server_message(error))
        text = f"{where}: HTTP {status}: {message}"
        if status in (408, 409, 429) or status >= 500:
            return TransientModelError(
                text, status_code=status, retry_after=retry_after(error.response.headers)
            )
        if status == 401:
            text += (
                " (check the API key: pass api_key=... or set OPENAI_API_KEY; "
                "the key itself is never shown)"
            )
        elif status == 404:
            text += " (check the model name and the base URL; on Ollama, `ollama pull` it)"
        elif _CONTEXT_FULL.search(message):
            text += (
                " (the prompt does not fit the model's context window: give the step less "
                "input, keep memory='step', or start the server with a larger context)"
            )
        return ModelError(text, status_code=status)
    return ModelError(f"{where}: {type(error).__name__}: {redact(str(error))}")
