"""``/runs/{run_id}/steps``: a run's steps as the one fold of its stored events tells them
(`minions._fold`), and ``/runs/{run_id}/steps/{step_id}``: one step, its every call."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam

from minions._fold import Decision, Execution, ModelCall, Retry, RunStates, ToolCall
from minions.runs import RunRecord, RunStore
from minions.service._access import Reader
from minions.service._deps import Runs
from minions.service._errors import ERRORS, Refused
from minions.service._models import (
    ApprovalOut,
    DecisionOut,
    ModelCallOut,
    RetryOut,
    StepDetail,
    StepOut,
    StepStates,
    ToolCallOut,
)
from minions.service._routes.runs import RunId, graph

__all__: list[str] = []

router = APIRouter(responses=ERRORS)


async def fold_run(runs: RunStore, record: RunRecord) -> RunStates:
    """The state of the run's steps: its stored events folded, what the store kept of each
    execution laid over them."""
    states = RunStates()
    for event in await runs.events(record.run_id):
        states.fold(event)
    states.stored(record.steps)
    return states


@router.get("/runs/{run_id}/steps", response_model=StepStates)
async def steps(caller: Reader, run_id: RunId, runs: Runs) -> StepStates:
    """The run's steps as its events tell them: each execution (a visit of a step, or one of
    its loop items) with its status, times, tokens, waits (for a person, for a model
    endpoint's limits) and retries, and each step's status. The run's event stream with
    `?states=true` keeps them up to date."""
    record = await runs.get(run_id)
    return StepStates.of(run_id, await fold_run(runs, record))


@router.get("/runs/{run_id}/steps/{step_id}", response_model=StepDetail)
async def step(
    caller: Reader,
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
    stored = [s for s in record.steps if s.step_id == step_id]
    if step_id not in nodes and not stored and not events:
        raise Refused(404, f"run {run_id} has no step {step_id!r}", "unknown_step")
    states = RunStates(details=True)
    for event in events:
        states.fold(event)
    states.stored(stored)
    latest = states.latest(step_id) or Execution(step_id=step_id, step=step_id, item=None, visit=1)
    details = [e.details for e in states.executions if step_id in (e.step, e.step_id) and e.details]
    retries = [r for e in states.executions if step_id in (e.step, e.step_id) for r in e.retries]
    return StepDetail(
        run_id=run_id,
        step_id=step_id,
        kind=nodes[step_id].kind if step_id in nodes else None,
        status=latest.status,
        executions=[StepOut.model_validate(s) for s in stored],
        started_at=latest.started_at,
        finished_at=latest.finished_at,
        skipped=latest.skipped,
        error=latest.error,
        usage=latest.usage,
        # Each in the order it happened, the loop items' together.
        model_calls=[
            ModelCallOut.model_validate(c)
            for c in sorted((c for d in details for c in d.model_calls), key=_seq)
        ],
        tool_calls=[
            ToolCallOut.model_validate(c)
            for c in sorted((c for d in details for c in d.tool_calls), key=_seq)
        ],
        retries=[RetryOut.model_validate(r) for r in sorted(retries, key=_seq)],
        decisions=[
            DecisionOut.model_validate(c)
            for c in sorted((c for d in details for c in d.decisions), key=_seq)
        ],
        approvals=[ApprovalOut.model_validate(a) for a in record.approvals if a.step_id == step_id],
    )


def _seq(told: ModelCall | ToolCall | Retry | Decision) -> int:
    return told.seq
