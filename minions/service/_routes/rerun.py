"""``/runs/{run_id}/rerun`` and ``/runs/{a}/diff/{b}``: a new run from a step of an ended one
(and ``/rerun/preview``: what it would reuse, nothing queued), and two runs compared step by
step.

A rerun is a submit: it runs only what this client could submit now. The parent's recipe is
taken by its id from the server's recipes folder as the folder is now (the run's snapshot
says where it came from, and may name a file the CLI, Python, a schedule or an earlier
configuration ran: that is not the client's to reach), or, for a run of an inline recipe,
its YAML again, only while the server takes inline recipes and under their rules. A client
never names a recipe file, and an idempotency key makes retries one rerun. A preview is
planned by the rerun's own planning, from the same recipe under the same rules."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from minions._text import jsonable
from minions.errors import RecipeError
from minions.runs import RerunPlan, ScopedRuns
from minions.service._access import Operator, Reader
from minions.service._config import ServiceConfig
from minions.service._deps import Catalog, Config, Runs
from minions.service._errors import ERRORS, Refused
from minions.service._models import Status
from minions.service._recipes import Catalogs, check_inline

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

RunId = Annotated[str, PathParam(description="The run's id.", max_length=200)]


class RerunPreviewRequest(BaseModel):
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
    cache: bool = Field(
        False,
        description="Let the steps that run again answer from the step cache (by default "
        "none does: each runs, and refreshes its entry).",
    )


class RerunRequest(RerunPreviewRequest):
    idempotency_key: str | None = Field(
        None,
        max_length=200,
        description="Rerunning again with the same key (and request) returns the same rerun; "
        "the `Idempotency-Key` header says the same.",
    )


class RerunPreview(BaseModel):
    # Validated from the rerun's plan, every field always in the answer.
    model_config = ConfigDict(
        from_attributes=True, json_schema_serialization_defaults_required=True
    )

    parent_run_id: str
    from_step: str
    reused: list[str] = Field(default_factory=list, description="Steps reused as recorded.")
    rerun: list[str] = Field(default_factory=list, description="Steps executed again.")
    changed: dict[str, str] = Field(
        default_factory=dict,
        description="Steps executed again for a reason of their own: `inputs` or `definition`.",
    )
    cache: bool = Field(
        False, description="The steps executed again may answer from the step cache."
    )


class Preview(RerunPreview):
    editable: list[str] = Field(
        default_factory=list,
        description="The reused steps whose output `outputs` may set: those the run completed.",
    )


class Rerun(RerunPreview):
    run_id: str
    status: Status = Field("queued", description="The rerun's status (`queued` once made).")
    created: bool = Field(True, description="False: the idempotency key named an earlier rerun.")


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
async def rerun(
    caller: Operator,
    run_id: RunId,
    body: RerunRequest,
    runs: Runs,
    config: Config,
    catalogs: Catalog,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=200,
            description="As the body's `idempotency_key` (give one or the other, or the same).",
        ),
    ] = None,
) -> Rerun:
    """Queue a new run of an ended run from step `from_step`: the steps that do not depend on
    it are reused as recorded (no model or tool calls). Its recipe is one this client could
    submit now: the recipe of the server's folder with the run's recipe id (a 403 when there
    is none), or the run's inline recipe while the server takes inline recipes."""
    if None not in (body.idempotency_key, idempotency_key) and body.idempotency_key != (
        idempotency_key
    ):
        raise Refused(400, "the `Idempotency-Key` header and `idempotency_key` differ")
    key = body.idempotency_key or idempotency_key
    plan = await _planned(
        run_id, body, runs, config, catalogs, idempotency_key=key, actor=caller.actor
    )
    made = Rerun.model_validate(plan)
    if not plan.created:  # the earlier rerun, as it is now
        made = made.model_copy(update={"status": (await runs.get(plan.run_id)).status})
    return made


@router.post("/runs/{run_id}/rerun/preview", response_model=Preview)
async def preview(
    caller: Operator,
    run_id: RunId,
    body: RerunPreviewRequest,
    runs: Runs,
    config: Config,
    catalogs: Catalog,
) -> Preview:
    """What `POST /runs/{run_id}/rerun` would do with the same body, and nothing queued: the
    steps it would reuse as recorded and those it would execute again (and why, when their
    inputs or definition changed), checked as the rerun is (a 400, 403 or 404 as it would
    be), and the reused steps whose output `outputs` may set."""
    plan = await _planned(run_id, body, runs, config, catalogs, dry_run=True)
    return Preview.model_validate(plan)


async def _planned(
    run_id: str,
    body: RerunPreviewRequest,
    runs: ScopedRuns,
    config: ServiceConfig,
    catalogs: Catalogs,
    **more: Any,
) -> RerunPlan:
    """`RunStore.rerun`'s plan of the rerun of `run_id` that `body` asks for (queued, or
    with `dry_run` not), of the recipe `_offered` gives."""
    source = await _offered(run_id, runs, config, catalogs)
    return await runs.rerun(
        run_id,
        from_step=body.from_step,
        inputs=body.inputs,
        outputs=body.outputs,
        cache=body.cache,
        **source,
        **more,
    )


async def _offered(
    run_id: str, runs: ScopedRuns, config: ServiceConfig, catalogs: Catalogs
) -> dict[str, Any]:
    """What `RunStore.rerun` reruns run `run_id` with, as a submit by this client
    would take it: its inline recipe again under the inline rules (while they are on; the
    store parses it once, off the event loop, and checks it before anything is built), or
    the recipe of the folder with its id, as the folder is now.

    Raises:
        UnknownRunError: no run has this id.
        Refused: 403, neither.
    """
    record = await runs.get(run_id)
    catalog = catalogs.of(record.project)  # the recipes of the run's project
    try:
        inline = catalog.inline_path(record.recipe_id)
    except RecipeError:
        inline = None
    was_inline = inline is not None and record.recipe_path == str(inline)
    if was_inline and inline is not None and config.allow_inline_recipes:
        text = await runs.recipe_yaml(run_id)
        check = functools.partial(check_inline, catalog=catalog, model=config.model)
        return {"recipe_yaml": text, "base": inline.parent, "check": check}
    entry = await asyncio.to_thread(catalog.find, record.recipe_id)
    if entry is not None:
        return {"recipe": entry.path}
    if was_inline:
        raise Refused(
            403,
            f"run {run_id} ran an inline recipe, and this server takes no inline recipes now "
            f"(nor has its folder a recipe {record.recipe_id!r}): it cannot be rerun here",
        )
    raise Refused(
        403,
        f"run {run_id}'s recipe {record.recipe_id!r} is not a recipe of this server's folder "
        "(GET /recipes): a client reruns only what it could submit; an operator reruns it "
        "with `minions runs rerun`",
    )


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
