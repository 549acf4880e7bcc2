"""``/runs/{run_id}/rerun`` and ``/runs/{a}/diff/{b}``: a new run from a step of an ended one,
and two runs compared step by step. A rerun uses the run's recipe snapshot: a client never
names a recipe file."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from minions._text import jsonable
from minions.service._access import Operator, Reader
from minions.service._deps import Config, Runs
from minions.service._errors import ERRORS
from minions.service._models import Status

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

RunId = Annotated[str, PathParam(description="The run's id.", max_length=200)]


class RerunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_step: str = Field(
        max_length=200, description="The step to run again, with everything downstream of it."
    )
    inputs: dict[str, Any] = Field(
        default_factory=dict,
        description="Inputs to change (the others are the run's); steps whose rendered "
        "templates change with them run again too.",
    )
    outputs: dict[str, Any] = Field(
        default_factory=dict,
        description="Outputs of reused steps to replace, by step id (checked against each "
        "step's output schema); what follows them runs again.",
    )


class Rerun(BaseModel):
    # Validated from the rerun's plan: queued, and every field always in the answer.
    model_config = ConfigDict(
        from_attributes=True, json_schema_serialization_defaults_required=True
    )

    run_id: str
    status: Status = "queued"
    parent_run_id: str
    from_step: str
    reused: list[str] = Field(default_factory=list, description="Steps reused as recorded.")
    rerun: list[str] = Field(default_factory=list, description="Steps executed again.")
    changed: dict[str, str] = Field(
        default_factory=dict,
        description="Steps executed again for a reason of their own: `inputs` or `definition`.",
    )


class OutputChangeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    path: str
    a: Any = None
    b: Any = None


class StepDiffOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    step_id: str
    visit: int
    status: tuple[str | None, str | None]
    diverges: bool
    changes: list[OutputChangeOut]
    tokens: tuple[int, int]
    calls: tuple[int, int]
    duration: tuple[float | None, float | None]
    reused: tuple[bool, bool]


class RunDiffOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    run_a: str
    run_b: str
    status: tuple[str, str]
    steps: list[StepDiffOut]
    first_divergence: str | None = Field(
        description="The first step (`step` or `step#visit`) where the runs diverge."
    )
    tokens: tuple[int, int]
    calls: tuple[int, int]


@router.post("/runs/{run_id}/rerun", status_code=201, response_model=Rerun)
async def rerun(caller: Operator, run_id: RunId, body: RerunRequest, runs: Runs) -> Rerun:
    """Queue a new run of an ended run from step `from_step`: the steps that do not depend on
    it are reused as recorded (no model or tool calls)."""
    plan = await runs.rerun(
        run_id,
        from_step=body.from_step,
        inputs=body.inputs,
        outputs=body.outputs,
        actor=caller.name,
    )
    return Rerun.model_validate(plan)


@router.get("/runs/{run_a}/diff/{run_b}", response_model=RunDiffOut)
async def diff(caller: Reader, run_a: RunId, run_b: RunId, runs: Runs, config: Config) -> Response:
    """Two runs compared step by step: status, output (a structured diff), tokens, calls,
    duration, and the first step where they diverge. Runs whose step outputs hold more
    JSON values than the server's bound (500,000 by default) are a 422."""
    result = await runs.diff(run_a, run_b, max_values=config.max_diff_values)
    # Shaping a big diff's answer takes as long as the diff: off the event loop too.
    body = await asyncio.to_thread(_diff_json, result)
    return Response(body, media_type="application/json")


def _diff_json(result: Any) -> bytes:
    return (
        RunDiffOut.model_validate(jsonable(dataclasses.asdict(result))).model_dump_json().encode()
    )
