"""``/evals``: the evals run on the store's workers (``minions eval --durable``) and the
reports they kept, read-only: the console's Evals page."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from minions.evals import EvalReport
from minions.runs import ScopedRuns
from minions.service._access import Reader
from minions.service._deps import InProject, Runs
from minions.service._errors import ERRORS, Refused
from minions.service._routes.runs import cursor_of, position

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

EvalId = Annotated[str, PathParam(description="The eval's id.", max_length=200)]

MAX_DIFFS = 200
"""Regressed cases whose baseline run is looked up in the store, at most."""


class EvalOut(BaseModel):
    """An eval run on the store's workers: running until its report is kept."""

    model_config = ConfigDict(from_attributes=True)

    eval_id: str
    dataset: str
    target: str
    total: int = Field(description="Its case runs.")
    status: Literal["running", "finished"]
    created_at: float
    finished_at: float | None = None
    project: str = Field("default", description="Its project, and its case runs'.")
    summary: dict[str, Any] = Field(
        default_factory=dict,
        description="Of a finished eval's report: pass_rate, interval, runs, passed, failed, "
        "errors, cases, flaky, regressed, baseline, ok (every gate held), tokens, duration.",
    )


class EvalPage(BaseModel):
    evals: list[EvalOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


class EvalDetail(EvalOut):
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    report: EvalReport | None = Field(None, description="The report, once it finished.")
    diffable: list[str] = Field(
        default_factory=list,
        description="The `baseline_run_id`s of regressed cases that this store has: a "
        "regressed case's failed run can be diffed against it (GET /runs/{a}/diff/{b}).",
    )


@router.get("/evals", response_model=EvalPage)
async def list_evals(
    caller: Reader,
    runs: InProject,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of a page.")] = None,
) -> EvalPage:
    """The evals run on the store's workers (of the caller's projects, or of the one
    `project` named), newest first, a page at a time."""
    records = await runs.evals(limit=limit, before=position(cursor) if cursor else None)
    evals = [EvalOut.model_validate(r) for r in records]
    last = evals[-1] if len(evals) == limit else None
    return EvalPage(
        evals=evals, next_cursor=cursor_of(last.created_at, last.eval_id) if last else None
    )


@router.get("/evals/{eval_id}", response_model=EvalDetail)
async def get_eval(caller: Reader, eval_id: EvalId, runs: Runs) -> EvalDetail:
    """An eval, with its report once it finished."""
    record = await runs.eval(eval_id)
    if record is None:
        raise Refused(404, f"no eval {eval_id!r} in this store", "unknown_eval")
    detail = EvalDetail.model_validate(record)
    if detail.report is not None:
        wanted = [
            c.baseline_run_id
            for c in detail.report.cases
            if c.baseline == "regressed" and c.baseline_run_id
        ][:MAX_DIFFS]
        detail.diffable = [run_id for run_id in wanted if await _known(runs, run_id)]
    return detail


async def _known(runs: ScopedRuns, run_id: str) -> bool:
    found = await runs.list_runs(id_prefix=run_id, limit=2)
    return any(r.run_id == run_id for r in found)
