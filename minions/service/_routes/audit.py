"""``/me`` (who a key is, and what waits for it), ``/projects`` (the projects it may pick)
and ``/audit`` (the audit log, for admins): the service's answers to people."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from minions.runs import Role
from minions.service._access import NEEDS, Admin, Permission, Reader
from minions.service._deps import Catalog, InProject, Runs, WholeStore
from minions.service._errors import ERRORS, Refused

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

MAX_TIME = 2.0**40
"""Times above this (about 36,800 years from 1970) are refused."""


class MeOut(BaseModel):
    name: str = Field(description="Who the key is: what the audit log records for it.")
    role: Role
    projects: list[str] = Field(description="Its projects (empty: the server's token, all).")
    may: list[Permission] = Field(description="What it may do: read, approve, operate, admin.")
    waiting: int = Field(
        description="Calls that wait for a decision this key may make (of the one `project` "
        "named, when one is; 0 for a viewer)."
    )


class AuditOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="Its place in the log (pass as `cursor` to go on after it).")
    at: float = Field(description="When (Unix seconds).")
    actor: str | None = Field(
        description="Who: a key's name, token, cli:USER, schedule:NAME, system (null: not known)."
    )
    address: str | None = Field(
        description="From where: the client's address, or the machine of a command."
    )
    action: str = Field(description="What: run.submit, approval.reject, key.add...")
    target: str = Field(description="What it changed: a run's id, a schedule's or key's name.")
    project: str
    detail: dict[str, Any] = Field(description="What else the change said.")


class AuditPage(BaseModel):
    entries: list[AuditOut]
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page.")


@router.get("/me", response_model=MeOut)
async def me(caller: Reader, runs: InProject) -> MeOut:
    """Who the request's key is (never the key), what it may do, and how many calls wait for
    a decision it may make (in the one `project` named, when one is)."""
    may: list[Permission] = [p for p in NEEDS if p != "public" and caller.may(p)]
    waiting = await runs.waiting_approvals() if caller.may("approve") else 0
    return MeOut(
        name=caller.name,
        role=caller.role,
        projects=list(caller.projects),
        may=may,
        waiting=waiting,
    )


@router.get("/projects", response_model=list[str])
async def projects(caller: Reader, runs: Runs, catalogs: Catalog) -> list[str]:
    """The projects the key may pick (to narrow a listing with ``?project=``, or to submit
    into), sorted: its own; for an admin, every one the store knows (of its runs, schedules,
    evals and keys) and those with a recipes folder of their own."""
    found = await runs.projects()
    if runs.scope.every:
        found = sorted({*found, *catalogs.own})
    return found


@router.get("/audit", response_model=AuditPage)
async def audit(
    caller: Admin,
    runs: WholeStore,
    since: Annotated[
        float | None,
        Query(ge=0, le=MAX_TIME, description="Only changes at or after (Unix seconds)."),
    ] = None,
    actor: Annotated[
        str | None, Query(max_length=200, description="Only changes made by this actor.")
    ] = None,
    action: Annotated[
        str | None,
        Query(max_length=40, description="Only this action (run.cancel) or family (run)."),
    ] = None,
    project: Annotated[
        str | None, Query(max_length=64, description="Only changes in this project.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        int | None, Query(ge=1, le=2**62, description="`next_cursor` of a page.")
    ] = None,
) -> AuditPage:
    """The audit log: who changed what, when and from where, newest first, a page at a
    time (the filters given, together)."""
    try:
        found = await runs.audit(
            since=since,
            actor=actor,
            action=action,
            project=project,
            before=cursor,
            limit=limit,
        )
    except ValueError as exc:
        raise Refused(400, f"`action`: {exc}") from None
    entries = [AuditOut.model_validate(e) for e in found]
    more = len(entries) == limit
    return AuditPage(entries=entries, next_cursor=entries[-1].id if more else None)
