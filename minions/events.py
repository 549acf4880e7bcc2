"""Typed events: one frozen record per thing that happens in a run.

Every event carries the run id, the step id (``None`` for run-level events), a per-run sequence
number and a timestamp. `Event` is the discriminated union of all of them, so a list of events
serializes to JSON and parses back with `event_to_json` / `event_from_json`.

Events reach, in order:

* listeners on the `AgentContext` (plain callables, called synchronously as events happen);
* structlog, when the application has configured structlog (the library never configures it,
  and stays silent when nobody did).
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = [
    "CompletionDecided",
    "Event",
    "EventEmitter",
    "EventListener",
    "ModelCallCompleted",
    "ModelCallFailed",
    "ModelCallStarted",
    "RetryScheduled",
    "RoutingDecided",
    "RunCompleted",
    "RunFailed",
    "RunStarted",
    "StepCompleted",
    "StepFailed",
    "StepSkipped",
    "StepStarted",
    "TokenDelta",
    "ToolCallCompleted",
    "ToolCallFailed",
    "ToolCallStarted",
    "UsageRecord",
    "event_from_json",
    "event_to_json",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class UsageRecord:
    """Token usage as carried by events (a plain, serializable copy of `Usage`)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    unknown_calls: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class _EventBase:
    run_id: str
    step_id: str | None = None
    seq: int = 0
    timestamp: float = 0.0


# -- run ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStarted(_EventBase):
    kind: Literal["run_started"] = "run_started"
    recipe_id: str = ""
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCompleted(_EventBase):
    kind: Literal["run_completed"] = "run_completed"
    output: Any = None
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFailed(_EventBase):
    kind: Literal["run_failed"] = "run_failed"
    error: str = ""
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0


# -- step --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StepStarted(_EventBase):
    kind: Literal["step_started"] = "step_started"
    visit: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCompleted(_EventBase):
    kind: Literal["step_completed"] = "step_completed"
    visit: int = 1
    output: Any = None
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFailed(_EventBase):
    kind: Literal["step_failed"] = "step_failed"
    visit: int = 1
    error: str = ""
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSkipped(_EventBase):
    kind: Literal["step_skipped"] = "step_skipped"
    reason: str = ""


# -- model and tool calls ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallStarted(_EventBase):
    kind: Literal["model_call_started"] = "model_call_started"
    turn: int = 1
    attempt: int = 1
    model: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallCompleted(_EventBase):
    kind: Literal["model_call_completed"] = "model_call_completed"
    turn: int = 1
    attempt: int = 1
    usage: UsageRecord = field(default_factory=UsageRecord)
    finish_reason: str | None = None
    output_mode: str | None = None
    tool_calls: tuple[str, ...] = ()
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallFailed(_EventBase):
    kind: Literal["model_call_failed"] = "model_call_failed"
    turn: int = 1
    attempt: int = 1
    error: str = ""
    usage: UsageRecord = field(default_factory=UsageRecord)
    output_mode: str | None = None
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenDelta(_EventBase):
    kind: Literal["token_delta"] = "token_delta"
    turn: int = 1
    text: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallStarted(_EventBase):
    kind: Literal["tool_call_started"] = "tool_call_started"
    call_id: str = ""
    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallCompleted(_EventBase):
    kind: Literal["tool_call_completed"] = "tool_call_completed"
    call_id: str = ""
    name: str = ""
    content: str = ""
    attempts: int = 1
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallFailed(_EventBase):
    kind: Literal["tool_call_failed"] = "tool_call_failed"
    call_id: str = ""
    name: str = ""
    error: str = ""
    attempts: int = 1
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryScheduled(_EventBase):
    """A model call or tool call will be tried again."""

    kind: Literal["retry_scheduled"] = "retry_scheduled"
    target: Literal["model", "output", "tool"] = "model"
    """`model`: transient error; `output`: invalid output re-asked; `tool`: a tool raised."""
    attempt: int = 1
    """The attempt that failed."""
    delay: float = 0.0
    reason: str = ""


# -- decisions ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CompletionDecided(_EventBase):
    kind: Literal["completion_decided"] = "completion_decided"
    link: str = ""
    decision: Literal["complete", "incomplete", "fail", "reask"] = "complete"
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingDecided(_EventBase):
    """Which outgoing transitions of a step were taken, by which selector, and why."""

    kind: Literal["routing_decided"] = "routing_decided"
    chosen: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    selector: str = ""
    reason: str = ""


Event = Union[  # noqa: UP007 - a Union reads better than a 17-line `|` chain here.
    RunStarted,
    RunCompleted,
    RunFailed,
    StepStarted,
    StepCompleted,
    StepFailed,
    StepSkipped,
    ModelCallStarted,
    ModelCallCompleted,
    ModelCallFailed,
    TokenDelta,
    ToolCallStarted,
    ToolCallCompleted,
    ToolCallFailed,
    RetryScheduled,
    CompletionDecided,
    RoutingDecided,
]
"""Any event (a union discriminated by the `kind` field)."""

EventListener = Callable[[Any], None]
"""A callable that receives every event of a run, synchronously, in sequence order."""

E = TypeVar("E", bound=_EventBase)


@cache
def _adapter() -> TypeAdapter[Any]:
    from pydantic import Discriminator, TypeAdapter

    return TypeAdapter(Annotated[Event, Discriminator("kind")])


def event_to_json(event: _EventBase) -> str:
    """Serialize an event to one line of JSON."""
    return _adapter().dump_json(event, fallback=repr).decode()


def event_from_json(data: str | bytes) -> Any:
    """Parse an event serialized by `event_to_json` back into its typed record."""
    return _adapter().validate_json(data)


def _structlog_logger() -> Any | None:
    # Only log when the application imported and configured structlog: unconfigured structlog
    # prints everything to stdout, which a library must not do to its users.
    structlog = sys.modules.get("structlog")
    if structlog is None or not structlog.is_configured():
        return None
    return structlog.get_logger("minions")


_QUIET = frozenset({"token_delta", "model_call_started", "tool_call_started"})


class EventEmitter:
    """Numbers events of one run and hands them to its listeners.

    Listeners are called in the order added; an exception in a listener is logged and does not
    stop the run or the other listeners.
    """

    def __init__(self, run_id: str, listeners: Iterable[EventListener] = ()) -> None:
        self.run_id = run_id
        self._listeners: list[EventListener] = list(listeners)
        self._seq = itertools.count(1)

    @property
    def listeners(self) -> Sequence[EventListener]:
        return tuple(self._listeners)

    def add_listener(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: EventListener) -> None:
        self._listeners.remove(listener)

    @property
    def active(self) -> bool:
        """Whether anybody receives events (so building them is worth it)."""
        return bool(self._listeners) or _structlog_logger() is not None

    def emit(self, cls: type[E], /, **fields: Any) -> E | None:
        """Create an event of type `cls` with the next sequence number and deliver it."""
        logger = _structlog_logger()
        if not self._listeners and logger is None:
            return None
        event = cls(run_id=self.run_id, seq=next(self._seq), timestamp=time.time(), **fields)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                # Through stdlib logging, whose last-resort handler shows it even when the
                # application configured nothing: a broken listener must not go unnoticed.
                logging.getLogger("minions").exception(
                    "event listener %r failed on %s",
                    listener,
                    event.kind,  # type: ignore[attr-defined]
                )
        if logger is not None:
            data = asdict(event)
            kind = data.pop("kind")
            if kind in _QUIET:
                logger.debug(kind, **data)
            else:
                logger.info(kind, **data)
        return event
