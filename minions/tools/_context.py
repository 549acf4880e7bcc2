"""What a running tool may know about its call: `tool_context()`."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["ToolContext", "tool_context"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """The call a tool is running for.

    Attributes:
        run_id: the run's id.
        step_id: the step that made the call.
        scope: the step execution: ``step#visit`` (``step#visit[item]`` in a loop).
        call_id: the tool call's id.
        attempt: 1, then 2... when the call is tried again.
    """

    run_id: str
    step_id: str | None
    scope: str
    call_id: str
    attempt: int = 1

    @property
    def idempotency_key(self) -> str:
        """``run/step#visit[item]/call``: the same for every attempt of this call, and for
        the same call when a durable run runs an unfinished step again after a crash. A tool
        with side effects can use it to do them once."""
        return f"{self.run_id}/{self.scope}/{self.call_id}"


_CURRENT: ContextVar[ToolContext | None] = ContextVar("minions_tool_context", default=None)


def tool_context() -> ToolContext | None:
    """The call the current tool runs for (``None`` outside a tool call). Works in async tools
    and in tools running in threads."""
    return _CURRENT.get()


def enter(context: ToolContext) -> object:
    return _CURRENT.set(context)


def leave(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]
