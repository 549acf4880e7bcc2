"""``/runs``: submit, list, read, cancel, resume and approve runs."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi import Path as PathParam

from minions.runs import RunFilters, ScopedRuns
from minions.service._access import Approver, Operator, Reader
from minions.service._bytes import json_problem
from minions.service._deps import Catalog, Config, InProject, Runs
from minions.service._errors import ERRORS, Refused
from minions.service._models import (
    Decision,
    GraphNode,
    HistoryOut,
    RunOut,
    RunPage,
    RunSummary,
    Status,
    SubmitOut,
    SubmitRequest,
)
from minions.service._recipes import check_inline

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

RunId = Annotated[str, PathParam(description="The run's id.", max_length=200)]
MAX_TIME = 2.0**40
"""Times above this (about 36,800 years from 1970) are refused."""


@router.post("/runs", status_code=201, response_model=SubmitOut)
async def submit(
    caller: Operator, body: SubmitRequest, runs: Runs, config: Config, catalogs: Catalog
) -> SubmitOut:
    """Queue a run in a project of the caller's (the same run again for a repeated
    `idempotency_key` with the same request; a key reused for another request is a 409; a
    project not the caller's is a 404 `unknown_project`)."""
    if (body.recipe is None) == (body.recipe_yaml is None):
        raise Refused(400, "give either `recipe` (a recipe id) or `recipe_yaml`")
    project = runs.scope.project_for(body.project)
    catalog = catalogs.of(project)
    if body.recipe_yaml is not None:
        if not config.allow_inline_recipes:
            raise Refused(
                403,
                "`recipe_yaml`: this server takes no inline recipes (start it with "
                "--allow-inline-recipes); submit a recipe id from GET /recipes",
            )
        # Parsed once, in the store, and checked before anything is built or stored.
        submitted = await runs.submit_yaml(
            body.recipe_yaml,
            body.inputs,
            base=catalog.folder or Path.cwd(),
            idempotency_key=body.idempotency_key,
            check=functools.partial(check_inline, catalog=catalog, model=config.model),
            actor=caller.actor,
            project=project,
        )
    else:
        assert body.recipe is not None
        entry = await asyncio.to_thread(catalog.find, body.recipe)
        if entry is None:
            known = ", ".join(sorted(await asyncio.to_thread(catalog.scan))) or "none"
            raise Refused(
                400, f"`recipe`: no recipe {body.recipe!r} here; known: {known}", "unknown_recipe"
            )
        submitted = await runs.submit(
            entry.path,
            body.inputs,
            idempotency_key=body.idempotency_key,
            actor=caller.actor,
            project=project,
        )
    if submitted.created:  # just stored as queued: no need to read it back
        return SubmitOut(run_id=submitted.run_id, status="queued", created=True)
    record = await runs.get(submitted.run_id)
    return SubmitOut(run_id=submitted.run_id, status=record.status, created=False)


@router.get("/runs", response_model=RunPage)
async def list_runs(
    caller: Reader,
    runs: InProject,
    status: Annotated[Status | None, Query(description="Only runs in this status.")] = None,
    recipe: Annotated[
        str | None, Query(description="Only runs of this recipe id.", max_length=200)
    ] = None,
    created_after: Annotated[
        float | None,
        Query(ge=0, le=MAX_TIME, description="Only runs created at or after (Unix seconds)."),
    ] = None,
    created_before: Annotated[
        float | None,
        Query(ge=0, le=MAX_TIME, description="Only runs created before (Unix seconds)."),
    ] = None,
    id_prefix: Annotated[
        str | None,
        Query(description="Only runs whose id starts with this.", max_length=200),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of a page.")] = None,
) -> RunPage:
    """The runs of the caller's projects (or of the one `project` named), newest first, a
    page at a time (the filters given, together)."""
    before = position(cursor) if cursor else None
    which = RunFilters(
        status=status,
        recipe=recipe,
        created_after=created_after,
        created_before=created_before,
        id_prefix=id_prefix,
    )
    records = await runs.list_runs(**which, limit=limit, before=before)
    summaries = [RunSummary.model_validate(r) for r in records]
    more = len(summaries) == limit
    return RunPage(
        runs=summaries,
        next_cursor=cursor_of(summaries[-1].created_at, summaries[-1].run_id) if more else None,
        history=HistoryOut.model_validate(await runs.history()),
        total=await runs.count_runs(**which),
    )


@router.get("/runs/{run_id}", response_model=RunOut)
async def get_run(caller: Reader, run_id: RunId, runs: Runs) -> RunOut:
    """A run: status, finished steps, approvals (each decided one with who decided it),
    usage, output, error, and its recipe's steps as a graph."""
    return await run_out(run_id, runs)


async def run_out(run_id: str, runs: ScopedRuns) -> RunOut:
    """What `GET /runs/{run_id}` answers."""
    run = RunOut.model_validate(await runs.get(run_id))
    run.graph = [GraphNode.model_validate(n) for n in await runs.recipe_graph(run_id)]
    return run


@router.post("/runs/{run_id}/cancel", response_model=RunOut)
async def cancel(caller: Operator, run_id: RunId, runs: Runs) -> RunOut:
    """Cancel a run: a queued one at once, a running one at its next step boundary."""
    await runs.cancel(run_id, wait=5.0, actor=caller.actor)
    return await run_out(run_id, runs)


@router.post("/runs/{run_id}/resume", response_model=RunOut)
async def resume(caller: Operator, run_id: RunId, runs: Runs) -> RunOut:
    """Queue a failed or cancelled run again, from its last completed step (one of
    concurrent resumes wins; the others are 409 `wrong_state`)."""
    await runs.resume(run_id, actor=caller.actor)
    return await run_out(run_id, runs)


@router.post("/runs/{run_id}/approvals/{call_id:path}", response_model=RunOut)
async def approve(
    caller: Approver,
    run_id: RunId,
    call_id: Annotated[str, PathParam(description="The call's id.", max_length=500)],
    body: Decision,
    runs: Runs,
) -> RunOut:
    """Approve or reject a call the run waits for (decided once: of concurrent decisions
    one wins, the others are 409 `wrong_state`)."""
    await runs.approve(
        run_id, call_id, approved=body.approve, reason=body.reason, actor=caller.actor
    )
    return await run_out(run_id, runs)


# -- helpers ----------------------------------------------------------------------------------


def cursor_of(created_at: float, ident: str) -> str:
    """The cursor of a page that ends at this item (a run, an eval)."""
    raw = json.dumps([created_at, ident]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def position(cursor: str) -> tuple[float, str]:
    """Where a page given by `cursor_of` ended: its last item's created_at and id."""
    refused = Refused(
        400, "`cursor` is not a cursor this server gave (pass next_cursor as it came)"
    )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except ValueError:
        raise refused from None
    if json_problem(raw) is not None:  # NaN, NUL, surrogates, deep nesting, not UTF-8
        raise refused
    value = json.loads(raw)
    if not isinstance(value, list) or len(value) != 2:
        raise refused
    created, run_id = value
    if not isinstance(run_id, str) or len(run_id) > 200:
        raise refused
    if isinstance(created, bool) or not isinstance(created, int | float):
        raise refused
    return float(created), run_id
