"""``/runs/{run_id}/steps``: a run's steps as the one fold of its stored events tells them
(`minions._fold`), and ``/runs/{run_id}/steps/{step_id}``: one step, its every call."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam

from minions.service._access import Reader
from minions.service._deps import Runs
from minions.service._errors import ERRORS
from minions.service._models import StepDetail, StepStates
from minions.service._routes.runs import RunId

__all__: list[str] = []

router = APIRouter(responses=ERRORS)


@router.get("/runs/{run_id}/steps", response_model=StepStates)
async def steps(caller: Reader, run_id: RunId, runs: Runs) -> StepStates:
    """The run's steps as its events tell them: each execution (a visit of a step, or one of
    its loop items) with its status, times, tokens, waits (for a person, for a model
    endpoint's limits) and retries, and each step's status. The run's event stream with
    `?states=true` keeps them up to date."""
    return StepStates.of(run_id, await runs.step_states(run_id))


@router.get("/runs/{run_id}/steps/{step_id}", response_model=StepDetail)
async def step(
    caller: Reader,
    run_id: RunId,
    step_id: Annotated[str, PathParam(description="The step's id.", max_length=200)],
    runs: Runs,
) -> StepDetail:
    """A step of the run (``each``, or one loop item: ``each[2]``): its finished visits, and
    from the run's stored events its model calls (each attempt), tool calls with their
    arguments and results, retries with their reasons, completion decisions and
    approvals."""
    detail = await runs.step_detail(run_id, step_id)
    return StepDetail.model_validate(detail, from_attributes=True)
