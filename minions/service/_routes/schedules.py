"""``/schedules``: recipes of the server's folder run by themselves, at each slot of a cron
expression or an interval (the workers of the store fire them)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from fastapi import Path as PathParam
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from minions.service._access import Operator, Reader
from minions.service._deps import Catalog, InProject, Runs
from minions.service._errors import ERRORS, Refused
from minions.service._models import PROJECT_PATTERN, RunSummary

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

Name = Annotated[str, PathParam(description="The schedule's name.", max_length=200)]


class ScheduleRequest(BaseModel):
    """A schedule to add: a recipe id of the server's folder, and when it runs."""

    recipe: str = Field(max_length=200, description="A recipe id (GET /recipes).")
    cron: str | None = Field(
        None, max_length=200, description='A cron expression, e.g. "0 7 * * 1-5".'
    )
    every: str | None = Field(None, max_length=50, description="Or an interval: 30s, 5m, 1h, 1d.")
    inputs: dict[str, Any] = Field(default_factory=dict, description="The runs' inputs.")
    name: str | None = Field(
        None, max_length=200, description="The schedule's name (default: the recipe's id)."
    )
    timezone: str | None = Field(
        None, max_length=100, description="The cron expression's time zone (default UTC)."
    )
    catch_up: Literal["none", "one", "all"] | None = Field(
        None,
        description="Slots missed while no worker ran: none, one (the default: the latest "
        "fires) or all.",
    )
    overlap: Literal["skip", "buffer_one", "allow"] | None = Field(
        None,
        description="A slot due while a run of the schedule is still active: skip (the "
        "default: it is skipped, and the schedule flagged late), buffer_one (one run waits in "
        "the queue, no more) or allow (it fires all the same).",
    )
    replace: bool = Field(
        False, description="Replace the schedule of that name (else a 409 schedule_exists)."
    )
    project: str | None = Field(
        None,
        pattern=PROJECT_PATTERN,
        description="Its project, and its runs': one of the key's (default: its only one; for "
        "an admin, `default`).",
    )


class ScheduleOut(BaseModel):
    """A schedule: its recipe (snapshotted when it was added), when it fires, what it fired."""

    model_config = ConfigDict(from_attributes=True, populate_by_name=True)

    name: str
    recipe: str = Field(validation_alias=AliasChoices("recipe", "recipe_id"))
    inputs: dict[str, Any]
    cron: str | None
    every: int | None = Field(description="Seconds between slots (with no cron expression).")
    timezone: str
    catch_up: Literal["none", "one", "all"]
    paused: bool
    created_at: float
    next_at: float = Field(description="The next slot (a Unix time).")
    last_slot: float | None = Field(description="The slot that fired last.")
    last_fired_at: float | None
    last_run_id: str | None
    fired: int = Field(description="How many runs it fired.")
    changed_by: str | None = Field(None, description="Who added it, or paused or resumed it last.")
    overlap: Literal["skip", "buffer_one", "allow"] = Field(
        description="What a slot due while runs of it are active does."
    )
    late: bool = Field(
        description="The latest slots it handled: one fired over a minute late, or some were "
        "skipped (`late_reason`)."
    )
    late_reason: Literal["late", "overlap", "catch-up", "backlog"] | None = Field(
        description="late: fired over a minute after its time; overlap: skipped while a run "
        "of it was active; catch-up: missed while no worker ran, skipped by the policy; "
        "backlog: missed beyond the catch-up backlog."
    )
    late_at: float | None = Field(description="When it was last late (a Unix time).")
    late_slots: int = Field(description="How many of its slots fired late or were skipped.")
    project: str = Field("default", description="Its project, and its runs'.")


class ScheduleDetail(ScheduleOut):
    # Validated from the record, then given its runs: always in the answer all the same.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    runs: list[RunSummary] = Field(default_factory=list, description="Its runs, newest first.")


@router.post("/schedules", status_code=201, response_model=ScheduleOut)
async def add(
    caller: Operator, body: ScheduleRequest, runs: Runs, catalogs: Catalog
) -> ScheduleOut:
    """Add a schedule of a recipe of the project's folder (with neither `cron` nor `every`,
    the recipe's own `schedule:` says when). Its YAML is snapshotted now: to change it, add
    it again with `replace`."""
    project = runs.scope.project_for(body.project)
    catalog = catalogs.of(project)
    entry = await asyncio.to_thread(catalog.find, body.recipe)
    if entry is None:
        known = ", ".join(sorted(await asyncio.to_thread(catalog.scan))) or "none"
        raise Refused(
            400, f"`recipe`: no recipe {body.recipe!r} here; known: {known}", "unknown_recipe"
        )
    record = await runs.add_schedule(
        entry.path,
        cron=body.cron,
        every=body.every,
        inputs=body.inputs,
        name=body.name,
        timezone=body.timezone,
        catch_up=body.catch_up,
        overlap=body.overlap,
        replace=body.replace,
        actor=caller.actor,
        project=project,
    )
    return ScheduleOut.model_validate(record)


@router.get("/schedules", response_model=list[ScheduleOut])
async def list_schedules(caller: Reader, runs: InProject) -> list[ScheduleOut]:
    """The schedules of the caller's projects (or of the one `project` named), by name."""
    return [ScheduleOut.model_validate(r) for r in await runs.schedules()]


@router.get("/schedules/{name}", response_model=ScheduleDetail)
async def get_schedule(
    caller: Reader, name: Name, runs: Runs, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> ScheduleDetail:
    """A schedule and its latest runs."""
    record = await runs.schedule(name)
    fired = await runs.list_runs(schedule=name, limit=limit)
    detail = ScheduleDetail.model_validate(record)
    detail.runs = [RunSummary.model_validate(r) for r in fired]
    return detail


@router.delete("/schedules/{name}", status_code=204)
async def remove(caller: Operator, name: Name, runs: Runs) -> Response:
    """Remove a schedule (the runs it fired stay)."""
    await runs.remove_schedule(name, actor=caller.actor)
    return Response(status_code=204)


@router.post("/schedules/{name}/pause", response_model=ScheduleOut)
async def pause(caller: Operator, name: Name, runs: Runs) -> ScheduleOut:
    """Stop firing the schedule until it is resumed."""
    return ScheduleOut.model_validate(await runs.pause_schedule(name, actor=caller.actor))


@router.post("/schedules/{name}/resume", response_model=ScheduleOut)
async def resume(caller: Operator, name: Name, runs: Runs) -> ScheduleOut:
    """Fire the schedule again from its next slot (the slots of the pause do not fire)."""
    return ScheduleOut.model_validate(await runs.resume_schedule(name, actor=caller.actor))
