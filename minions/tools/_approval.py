"""A person's say before a tool runs: what a run asks (`ApprovalRequest`), what it gets back
(`ApprovalDecision`), and who answers (an `Approver`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ApprovalDecision", "ApprovalRequest", "Approver"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """A tool call that waits for a person's decision.

    Attributes:
        run_id: the run's id.
        step_id: the step that makes the call.
        visit: the step's visit (1, or more when a loop brings it back).
        item: the loop item's index; ``None`` outside loops.
        call_id: names the call in the run: ``step#visit[item]/id of the call``.
        tool: the tool's name.
        arguments: the validated arguments it would be called with.
    """

    run_id: str
    step_id: str
    visit: int
    item: int | None
    call_id: str
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecision:
    """A person's answer: `approved`, or not with a `reason` (given to the model as the call's
    result)."""

    approved: bool
    reason: str | None = None
    decided_by: str | None = None
    """Who decided: recorded in the `ApprovalResolved` event as its `actor`."""
    timed_out: bool = False
    """Nobody decided in time: the call was rejected by its approval timeout (`reason`
    says so), not by a person."""


Approver = Callable[[ApprovalRequest], Awaitable[ApprovalDecision]]
"""Answers approval requests (a prompt on a terminal, a durable wait for `minions runs
approve`, a test's function)."""
