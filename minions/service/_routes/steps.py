"""``/runs/{run_id}/steps/{step_id}``: one step of a run, told by its stored events."""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam

from minions.events import (
    ApprovalRequested,
    ApprovalResolved,
    CompletionDecided,
    Event,
    ModelCallCompleted,
    ModelCallFailed,
    ModelCallStarted,
    ModelCallWaiting,
    RetryScheduled,
    StepCompleted,
    StepFailed,
    StepSkipped,
    StepStarted,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
)
from minions.runs import StepRecord
from minions.service._deps import Runs
from minions.service._errors import ERRORS, Refused
from minions.service._models import (
    ApprovalOut,
    DecisionOut,
    MessageOut,
    ModelCallOut,
    RetryOut,
    StepDetail,
    StepOut,
    ToolCallOut,
)
from minions.service._routes.runs import RunId, graph

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

ITEM = re.compile(r"\[([0-9]+)\]$")


@router.get("/runs/{run_id}/steps/{step_id}", response_model=StepDetail)
async def step(
    run_id: RunId,
    step_id: Annotated[str, PathParam(description="The step's id.", max_length=200)],
    runs: Runs,
) -> StepDetail:
    """A step of the run: its finished visits, and from the run's stored events its model
    calls (each attempt), tool calls with their arguments and results, retries with their
    reasons, completion decisions and approvals."""
    record = await runs.get(run_id)
    events = await runs.step_events(run_id, step_id)
    nodes = {n.id: n for n in graph(await runs.recipe_yaml(run_id))}
    executions = [s for s in record.steps if s.step_id == step_id]
    if step_id not in nodes and not executions and not events:
        raise Refused(404, f"run {run_id} has no step {step_id!r}", "unknown_step")
    detail = _told(run_id, step_id, events)
    detail.kind = nodes[step_id].kind if step_id in nodes else None
    detail.executions = [_step_out(s) for s in executions]
    detail.approvals = [
        ApprovalOut(**dataclasses.asdict(a)) for a in record.approvals if a.step_id == step_id
    ]
    if executions:  # the stored record has the last word (events of a retried run repeat)
        last = executions[-1]
        detail.status, detail.error, detail.usage = last.status, last.error, last.usage
        detail.started_at = last.started_at or detail.started_at
        detail.finished_at = last.finished_at or detail.finished_at
    return detail


def _step_out(record: StepRecord) -> StepOut:
    return StepOut(**dataclasses.asdict(record))


def _told(run_id: str, step_id: str, events: list[Event]) -> StepDetail:
    """The step as its events tell it, in order (a later visit overwrites the status)."""
    detail = StepDetail(run_id=run_id, step_id=step_id, status="pending")
    visit = 1
    # Calls are told apart by the step's start they belong to: a run resumed after the step
    # failed starts it again, and its calls (same turns, same call ids) again too.
    starts = 0
    models: dict[tuple[int, int | None, int, int], ModelCallOut] = {}
    tools: dict[tuple[int, int | None, str], ToolCallOut] = {}
    for event in events:
        found = ITEM.search(event.step_id or "")
        item = int(found.group(1)) if found and event.step_id != step_id else None
        at = event.timestamp
        match event:
            case StepStarted() if item is None:
                visit = event.visit
                starts += 1
                detail.status, detail.error, detail.skipped = "running", None, None
                detail.started_at, detail.finished_at = at, None
                detail.waited, detail.waiting = None, None
            case StepCompleted() | StepFailed() if item is None:
                detail.status = "completed" if isinstance(event, StepCompleted) else "failed"
                detail.error = event.error if isinstance(event, StepFailed) else None
                detail.finished_at = at
                detail.usage = dataclasses.asdict(event.usage)
                detail.waited, detail.waiting = event.waited, None
            case ModelCallWaiting():
                detail.waiting = "endpoint"
            case StepSkipped() if item is None:
                detail.status, detail.skipped = "skipped", event.reason
            case ApprovalRequested():
                detail.waiting = "approval"
                if item is None:
                    detail.status = "waiting"
            case ApprovalResolved():
                detail.waiting = None
            case ModelCallStarted():
                detail.waiting = None
                models[(starts, item, event.turn, event.attempt)] = ModelCallOut(
                    item=item,
                    visit=visit,
                    turn=event.turn,
                    attempt=event.attempt,
                    model=event.model,
                    started_at=at,
                    messages=[MessageOut(role=m.role, text=m.text) for m in event.messages],
                    messages_omitted=event.messages_omitted,
                )
            case ModelCallCompleted() | ModelCallFailed():
                call = models.get((starts, item, event.turn, event.attempt))
                if call is None:
                    continue
                call.finished_at = at
                call.usage = dataclasses.asdict(event.usage)
                call.output_mode = event.output_mode
                if isinstance(event, ModelCallCompleted):
                    call.finish_reason = event.finish_reason
                    call.tool_calls = list(event.tool_calls)
                    call.answer = event.answer
                else:
                    call.error = event.error
            case ToolCallStarted():
                key = (starts, item, event.call_id)
                if key in tools:
                    tools[key].attempts = event.attempt
                else:
                    tools[key] = ToolCallOut(
                        item=item,
                        visit=visit,
                        call_id=event.call_id,
                        name=event.name,
                        arguments=dict(event.arguments),
                        attempts=event.attempt,
                        started_at=at,
                    )
            case ToolCallCompleted() | ToolCallFailed():
                tool = tools.get((starts, item, event.call_id))
                if tool is None:
                    continue
                tool.finished_at = at
                tool.attempts = event.attempt
                if isinstance(event, ToolCallCompleted):
                    tool.result, tool.error = event.content, None
                else:
                    tool.error = event.error
            case RetryScheduled():
                when = {"item": item, "visit": visit, "at": at}
                retry = {"target": event.target, "attempt": event.attempt, "delay": event.delay}
                detail.retries.append(RetryOut(**when, **retry, reason=event.reason))
            case CompletionDecided():
                when = {"item": item, "visit": visit, "at": at}
                decided = {"link": event.link, "decision": event.decision}
                detail.decisions.append(DecisionOut(**when, **decided, reason=event.reason))
            case _:
                pass
    detail.model_calls = list(models.values())
    detail.tool_calls = list(tools.values())
    return detail
