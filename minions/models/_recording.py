"""Record a real run's model replies, and replay them offline.

A reply is keyed by the prompt's `scope` (which step execution asked: ``step#visit``, plus
``[index]`` for a loop item) and by its number within that scope. Calls of one step execution
happen one after another, so the keys are the same however parallel steps interleave: a
recording replays correctly regardless of timing.

    recording = Recording()
    model = RecordingModel(real_model, recording)     # run the recipe with it, then
    recording.save("run.recording.json")
    ...
    model = ReplayModel(Recording.load("run.recording.json"))   # offline, same replies
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from minions._messages import Message, ModelCallResponse, Prompt, ToolCall, Usage
from minions._text import jsonable
from minions.errors import (
    ModelError,
    ModelOutputError,
    RecordingError,
    TransientModelError,
)
from minions.models._base import Model, TokenCallback

__all__ = ["Recording", "RecordingModel", "ReplayMissError", "ReplayModel"]

FORMAT = "minions.recording/1"


class ReplayMissError(ModelError):
    """A replayed run asked for a reply that was not recorded."""


def _digest(prompt: Prompt) -> str:
    text = "\n".join(f"{m.role}:{m.content}" for m in prompt.messages)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _scope(prompt: Prompt) -> str:
    return prompt.scope or prompt.step_id or "_"


@dataclass
class Recording:
    """Model replies by key (``scope/n``), loadable from and savable to a JSON file.

    ``n`` counts the calls of a step execution (its scope) across every `RecordingModel`
    recording into this recording, so the attempts of a `FallbackModel`'s models are numbered
    in the order they were made, as a replay asks for them.
    """

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    _keys: _Keys = field(default_factory=lambda: _Keys(), init=False, repr=False, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        """Read a recording file.

        Raises:
            RecordingError: the file is missing, is not a minions recording, or an entry is
                malformed (named by its key).
        """
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RecordingError(f"recording {str(file)!r} does not exist") from None
        except UnicodeDecodeError as exc:
            raise RecordingError(
                f"recording {str(file)!r} is not UTF-8 text (byte {exc.start} cannot be read)"
            ) from None
        except json.JSONDecodeError as exc:
            raise RecordingError(f"recording {str(file)!r} is not valid JSON: {exc}") from None
        except RecursionError:
            raise RecordingError(f"recording {str(file)!r} nests too deeply") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise RecordingError(f"{str(file)!r} is not a minions recording (format {FORMAT})")
        calls, meta = data.get("calls", {}), data.get("meta", {})
        if not isinstance(calls, dict) or not isinstance(meta, dict):
            raise RecordingError(
                f"recording {str(file)!r}: 'calls' and 'meta' must be JSON objects"
            )
        for key, entry in calls.items():
            problem = _entry_problem(entry)
            if problem:
                raise RecordingError(f"recording {str(file)!r}, call {key!r}: {problem}")
        return cls(entries=dict(calls), meta=dict(meta))

    def save(self, path: str | Path) -> None:
        """Write the recording to `path` as JSON, its calls in order of their scope."""
        ordered = dict(sorted(self.entries.items(), key=lambda item: _sort_key(item[0])))
        data = {"format": FORMAT, "meta": self.meta, "calls": ordered}
        Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", "utf-8")

    def __len__(self) -> int:
        return len(self.entries)


def _entry_problem(entry: Any) -> str:
    """What is wrong with one recorded call, or ``""``."""
    if not isinstance(entry, dict):
        return "must be a JSON object"
    response, error = entry.get("response"), entry.get("error")
    if isinstance(error, dict):
        return ""
    if not isinstance(response, dict):
        return "needs a 'response' (or an 'error') object"
    calls = response.get("tool_calls", [])
    if not isinstance(calls, list) or not all(
        isinstance(c, dict)
        and isinstance(c.get("id"), str)
        and isinstance(c.get("name"), str)
        and isinstance(c.get("arguments"), dict)
        for c in calls
    ):
        return "'tool_calls' must be a list of objects with an id, a name and arguments"
    usage = response.get("usage")
    if usage is not None and not (
        isinstance(usage, dict)
        and set(usage) <= {"prompt_tokens", "completion_tokens", "calls", "unknown_calls"}
        and all(isinstance(v, int) for v in usage.values())
    ):
        return "'usage' must map token counts to integers"
    if not isinstance(response.get("content", ""), str):
        return "'content' must be text"
    return ""


def _sort_key(key: str) -> tuple[str, int]:
    scope, _, number = key.rpartition("/")
    return scope, int(number) if number.isdigit() else 0


class _Keys:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def next(self, prompt: Prompt) -> str:
        scope = _scope(prompt)
        self._counts[scope] += 1
        return f"{scope}/{self._counts[scope]}"


def encode_response(response: ModelCallResponse) -> dict[str, Any]:
    """A model's answer as JSON data, as a recording keeps it (and a parked call's state)."""
    message = response.message
    encoded = {
        "content": message.content,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in message.tool_calls
        ],
        "usage": asdict(response.usage),
        "finish_reason": response.finish_reason,
        "model": response.model,
        "output": jsonable(response.output),
        "output_mode": response.output_mode,
    }
    if response.response_id is not None:  # Only where the provider gave one.
        encoded["response_id"] = response.response_id
    return encoded


def _encode_error(error: BaseException) -> dict[str, Any]:
    usage = getattr(error, "usage", None)
    encoded = {
        "type": type(error).__name__,
        "message": error.note if isinstance(error, ModelOutputError) else str(error),
        "status_code": getattr(error, "status_code", None),
        "retry_after": getattr(error, "retry_after", None),
        "usage": asdict(usage) if isinstance(usage, Usage) else None,
    }
    if isinstance(error, ModelOutputError) and error.reason != error.note:
        encoded["reason"] = error.reason
    return encoded


class RecordingModel(Model):
    """Wraps a model and records every reply (and every error) it gives."""

    def __init__(self, model: Model, recording: Recording | None = None) -> None:
        self.model = model
        self.name = model.name
        self.recording = recording if recording is not None else Recording()

    @property
    def endpoint(self) -> tuple[str, str] | None:
        return self.model.endpoint

    async def check(self) -> None:
        await self.model.check()

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        key = self.recording._keys.next(prompt)
        entry: dict[str, Any] = {"step": prompt.step_id, "prompt": _digest(prompt)}
        try:
            response = await self.model.call(prompt, on_token=on_token)
        except Exception as exc:
            self.recording.entries[key] = {**entry, "error": _encode_error(exc)}
            raise
        self.recording.entries[key] = {**entry, "response": encode_response(response)}
        return response


class ReplayModel(Model):
    """Answers from a `Recording`, by the same keys it was recorded with.

    A request with no recorded reply raises `ReplayMissError` naming the step and the call.
    `changed_prompts` lists the keys whose prompt differs from the recorded one (a recipe or
    input changed since recording), which is often worth a look but not an error.
    """

    def __init__(self, recording: Recording | str | Path, *, name: str = "replay") -> None:
        self.recording = (
            recording if isinstance(recording, Recording) else Recording.load(recording)
        )
        self.name = name
        self._keys = _Keys()
        self.changed_prompts: list[str] = []

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        key = self._keys.next(prompt)
        entry = self.recording.entries.get(key)
        if entry is None:
            scope, _, number = key.rpartition("/")
            raise ReplayMissError(
                f"the recording has no reply for model call {number} of step "
                f"{prompt.step_id!r} (scope {scope!r}); record the run again"
            )
        if entry.get("prompt") not in (None, _digest(prompt)):
            self.changed_prompts.append(key)
        if "error" in entry:
            raise _decode_error(entry["error"])
        response = decode_response(entry["response"], prompt)
        if on_token is not None and response.text:
            on_token(response.text)
        return response


def _usage(data: Mapping[str, Any] | None) -> Usage:
    return Usage(**data) if data else Usage()


def decode_response(data: Mapping[str, Any], prompt: Prompt) -> ModelCallResponse:
    """An answer `encode_response` kept, to `prompt` (its structured output validated again
    against the prompt's `output`)."""
    calls = tuple(
        ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"])
        for c in data.get("tool_calls", [])
    )
    output = data.get("output")
    if output is not None and prompt.output is not None:
        output = prompt.output.validate_python(output)
    return ModelCallResponse(
        message=Message.assistant(data.get("content", ""), calls),
        usage=_usage(data.get("usage")),
        finish_reason=data.get("finish_reason"),
        model=data.get("model"),
        response_id=data.get("response_id"),
        output=output,
        output_mode=data.get("output_mode"),
    )


def _decode_error(data: Mapping[str, Any]) -> Exception:
    kind, message = data.get("type"), str(data.get("message", ""))
    status, usage = data.get("status_code"), data.get("usage")
    if kind == "ModelOutputError":
        reason = data.get("reason")
        return ModelOutputError(
            message,
            reason=reason if isinstance(reason, str) else None,
            usage=_usage(usage) if usage else None,
        )
    if kind == "TransientModelError":
        return TransientModelError(message, status_code=status, retry_after=data.get("retry_after"))
    if kind == "TimeoutError":
        return TimeoutError(message)
    if kind in ("ConnectionError", "ConnectionResetError", "ConnectionRefusedError"):
        return ConnectionError(message)
    return ModelError(message, status_code=status)
