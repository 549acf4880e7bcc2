"""The record of one step's execution."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, cast

from minions._generic import OutputT
from minions._messages import Message, ModelCall, ModelCallResponse, ToolCall, Usage
from minions._values import preview, tokens_text
from minions.errors import StepFailed

if TYPE_CHECKING:
    from minions._config import ExecutionConfig
    from minions._step.step import Step

__all__ = ["DecisionRecord", "StepExecution", "StepStatus"]


class StepStatus(enum.Enum):
    """Where a step is: pending, in progress, or ended (completed, failed or skipped)."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"

    @property
    def terminal(self) -> bool:
        """Whether the status is an end: completed, failed or skipped."""
        return self in (StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord:
    """A completion decision as it was taken: by which link, of which kind, and why."""

    link: str
    kind: Literal["complete", "incomplete", "fail", "reask"]
    reason: str
    turn: int


@dataclass(kw_only=True, eq=False, repr=False)
class StepExecution(Generic[OutputT]):
    """Everything that happened while one step ran.

    Generic in the step's output: running a `DefaultStep[Expense]` gives a
    `StepExecution[Expense]`, whose `output` is an ``Expense | None`` and whose `result()` is
    an ``Expense``. The step loop fills it in; once `status` is terminal, treat it as
    read-only.
    """

    step_id: str
    status: StepStatus = StepStatus.PENDING
    output: OutputT | None = None
    """The step's output once it completed (the validated structured output, or the text
    answer); a failed step may keep a partial one."""
    error: str | None = None
    """Why the step failed or was skipped."""
    next_step: str | None = None
    """The step's own suggestion for what runs next (from its completion output)."""
    visit: int = 1
    """1 the first time a step runs in a run, 2 when a loop brings it back, ..."""
    model_calls: list[ModelCall] = field(default_factory=list)
    """Every model call attempt, retries and re-asks included."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Every tool call that ran, with its `response`, in the model's order."""
    decisions: list[DecisionRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    """Tokens of every model call attempt of the step."""
    turns: int = 0
    """Model calls that produced an answer the step used (retries not counted)."""
    items: list[StepExecution[Any]] = field(default_factory=list)
    """For a loop step: the execution of each item, in item order."""
    conversation_id: str = ""
    messages: tuple[Message, ...] = field(default=(), repr=False)
    """The step's conversation as it ended."""
    started_at: float | None = None
    finished_at: float | None = None
    waited: float = 0.0
    """Seconds of its `duration` spent waiting rather than working: its model calls for their
    endpoint's limits, its tool calls for a person's approval (see `work`)."""
    step: Step | None = field(default=None, repr=False)
    config: ExecutionConfig | None = field(default=None, repr=False)

    def result(self) -> OutputT:
        """The step's output, when it completed.

        Raises:
            StepFailed: the step failed, was skipped or has not ended; its `reason` is the
                step's `error`.
        """
        if self.status is StepStatus.COMPLETED:
            return cast(OutputT, self.output)
        if self.status.terminal:
            reason = self.error or "no reason was recorded"
        else:
            reason = "it has not ended yet"
        raise StepFailed(self.step_id, self.status.value, reason)

    @property
    def ok(self) -> bool:
        """Whether the step completed."""
        return self.status is StepStatus.COMPLETED

    @property
    def duration(self) -> float | None:
        """Seconds from start to end; ``None`` until it has ended."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    @property
    def work(self) -> float | None:
        """Seconds of its `duration` spent working: the duration less what it `waited`."""
        duration = self.duration
        return None if duration is None else max(0.0, duration - self.waited)

    @property
    def last_response(self) -> ModelCallResponse | None:
        """The newest model answer (of a successful attempt)."""
        for call in reversed(self.model_calls):
            if call.response is not None:
                return call.response
        return None

    @property
    def retries(self) -> int:
        """Model call attempts beyond the first of each turn."""
        return sum(1 for call in self.model_calls if call.attempt > 1)

    def to_data(self) -> dict[str, Any]:
        """The execution as JSON data: what a durable run stores of a finished step (its
        status, output, usage, routing suggestion, timings, items), enough to restore it in
        place of running the step again (`from_data`). Calls and messages are not kept: the
        event log has them."""
        from minions._text import jsonable

        calls = self.model_calls
        return {
            "step_id": self.step_id,
            "status": self.status.value,
            "output": jsonable(self.output),
            "error": self.error,
            "next_step": self.next_step,
            "visit": self.visit,
            "usage": dataclasses.asdict(self.usage),
            "turns": self.turns,
            "attempts": max(1, sum(1 for call in calls if call.attempt == 1)) if calls else 1,
            "model_calls": len(calls),
            "tool_calls": len(self.tool_calls),
            "items": [item.to_data() for item in self.items],
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "waited": self.waited,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> StepExecution[Any]:
        """An execution stored by `to_data`."""
        return cls(
            step_id=data["step_id"],
            status=StepStatus(data["status"]),
            output=data.get("output"),
            error=data.get("error"),
            next_step=data.get("next_step"),
            visit=data.get("visit", 1),
            usage=Usage(**data.get("usage", {})),
            turns=data.get("turns", 0),
            items=[cls.from_data(item) for item in data.get("items", [])],
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            waited=data.get("waited", 0.0),
        )

    def absorb(self, parts: Iterable[StepExecution[Any]]) -> None:
        """Count the model calls, tool calls, turns and usage of inner executions (a loop's
        items, a sub-recipe's steps) in this one."""
        for part in parts:
            self.model_calls.extend(part.model_calls)
            self.tool_calls.extend(part.tool_calls)
            self.usage = self.usage + part.usage
            self.turns += part.turns

    def __repr__(self) -> str:
        # Short, in the calls' style: the fields hold every detail (calls, prompts, messages).
        parts = [f"step={self.step_id!r}", f"status={self.status.value!r}"]
        if self.visit != 1:
            parts.append(f"visit={self.visit}")
        if self.status is StepStatus.COMPLETED or self.output is not None:
            parts.append(f"output={preview(self.output)}")
        if self.error is not None:
            parts.append(f"error={preview(self.error)}")
        if self.usage.calls:
            parts += [f"model_calls={self.usage.calls}", f"tokens={tokens_text(self.usage)}"]
        if self.tool_calls:
            parts.append(f"tool_calls={len(self.tool_calls)}")
        if self.items:
            parts.append(f"items={len(self.items)}")
        duration = self.duration
        if duration is not None:
            parts.append(f"duration='{duration:.2f}s'")
        return f"StepExecution({', '.join(parts)})"
