"""One step of a run, every call of it: what ``GET /runs/{id}/steps/{step}`` answers and
`minions runs step` prints, read once here. The one fold of the step's stored events
(`minions._fold`, with details) tells its model calls (each attempt), tool calls, retries and
completion decisions; the store adds its finished visits, outputs and approvals. A step is
named as everywhere else: ``each`` (the step, its loop items with it) or ``each[2]`` (one
item, `ItemId`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from minions import events as ev
from minions._fold import (
    Decision,
    Execution,
    ModelCall,
    Retry,
    RunStates,
    ToolCall,
    WaitKind,
)
from minions._item import ItemId
from minions.errors import UnknownStepError
from minions.runs._approvals import ApprovalRecord
from minions.runs._checkpoints import StepRecord

if TYPE_CHECKING:
    from collections.abc import Sequence

    from minions.runs._runs import RunRecord
    from minions.runs._snapshot import RecipeNode

__all__ = ["StepDetail"]


@dataclass(frozen=True, kw_only=True)
class StepDetail:
    """One step (or loop item) of a run.

    Attributes:
        kind: the step's kind in the run's recipe (``None``: not in it, or a loop item).
        status: its latest visit's (``pending``: it never started).
        executions: its finished visits as stored, in order (a loop item: itself).
        usage: its latest visit's tokens (``None`` until it ends).
        waited: seconds its latest visit waited (for its endpoint's limits, for approvals)
            rather than worked (``None`` until it ends).
        waiting: what it waits for now (``None``: nothing).
        model_calls: every attempt of every model call, in order, its loop items' too.
    """

    run_id: str
    step_id: str
    kind: str | None
    status: str
    executions: list[StepRecord]
    started_at: float | None
    finished_at: float | None
    skipped: str | None
    error: str | None
    usage: ev.UsageRecord | None
    waited: float | None
    waiting: WaitKind | None
    model_calls: list[ModelCall]
    tool_calls: list[ToolCall]
    retries: list[Retry]
    decisions: list[Decision]
    approvals: list[ApprovalRecord]


def step_detail(
    record: RunRecord, step_id: str, events: list[ev.Event], graph: Sequence[RecipeNode]
) -> StepDetail:
    """The step `step_id` (``each`` or ``each[2]``) of the run `record`, from the step's
    stored `events` and the steps of the run's recipe (`recipe_graph`).

    Raises:
        UnknownStepError: the run has no such step (or item): none in its recipe, none stored
            and no event of it.
    """
    run_id = record.run_id
    kinds = {node.id: node.kind for node in graph}
    stored = _stored(record.steps, step_id)
    if step_id not in kinds and not stored and not events:
        raise UnknownStepError(run_id, step_id, sorted(kinds))
    states = RunStates.of(events, stored, details=True)
    latest = states.latest(step_id) or Execution(step_id=step_id, step=step_id, item=None, visit=1)
    mine = [e for e in states.executions if step_id in (e.step, e.step_id)]
    details = [e.details for e in mine if e.details is not None]
    return StepDetail(
        run_id=run_id,
        step_id=step_id,
        kind=kinds.get(step_id),
        status=latest.status,
        executions=stored,
        started_at=latest.started_at,
        finished_at=latest.finished_at,
        skipped=latest.skipped,
        error=latest.error,
        usage=latest.usage,
        waited=latest.waited if latest.ended else None,
        waiting=states.waits_for(latest),
        # Each in the order it happened, the loop items' together.
        model_calls=sorted((c for d in details for c in d.model_calls), key=_seq),
        tool_calls=sorted((c for d in details for c in d.tool_calls), key=_seq),
        retries=sorted((r for e in mine for r in e.retries), key=_seq),
        decisions=sorted((c for d in details for c in d.decisions), key=_seq),
        approvals=[a for a in record.approvals if a.step_id == step_id],
    )


def _stored(steps: tuple[StepRecord, ...], step_id: str) -> list[StepRecord]:
    """The stored visits of a step, or of a loop item (kept with its step's)."""
    name = ItemId.parse(step_id)
    if name.item is None:
        return [s for s in steps if s.step_id == step_id]
    return [
        i for s in steps if s.step_id == name.step for i in s.loop_items if i.step_id == step_id
    ]


def _seq(told: ModelCall | ToolCall | Retry | Decision) -> int:
    return told.seq
