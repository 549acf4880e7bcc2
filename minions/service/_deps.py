"""What routes depend on, through FastAPI's `Depends`: the run store as the caller's projects
let it see it (`Runs`), the recipes, the config, the in-process worker and the count of open
streams, kept on ``app.state``. The whole store (`WholeStore`) is for the routes of admins and
the probes only: the app refuses to start with another route that takes it
(`minions.service._access.unscoped`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Query, Request

from minions.runs import RunStore, ScopedRuns
from minions.service._access import CALLER, Caller
from minions.service._config import ServiceConfig
from minions.service._errors import Refused
from minions.service._models import PROJECT_PATTERN
from minions.service._recipes import Catalogs
from minions.service._stream import OpenStreams

if TYPE_CHECKING:
    from minions.runs import Worker

__all__: list[str] = []


def _whole(request: Request) -> RunStore:
    runs: RunStore = request.app.state.runs
    return runs


def _scoped(request: Request) -> ScopedRuns:
    """The store as the request's caller sees it: its projects' runs, schedules and evals."""
    caller: Caller | None = request.scope.get(CALLER)
    if caller is None:  # the guard lets no request without one reach a route but public ones
        raise Refused(401, "this endpoint needs an Authorization: Bearer <key> header")
    runs: RunStore = request.app.state.runs
    return runs.scoped(caller.scope)


def _in_project(
    runs: Annotated[ScopedRuns, Depends(_scoped)],
    project: Annotated[
        str | None,
        Query(
            description="Only what belongs to this project, one of the key's (any, for an "
            "admin): a project not the key's is a 404 `unknown_project`.",
            max_length=64,
            pattern=PROJECT_PATTERN,
        ),
    ] = None,
) -> ScopedRuns:
    """The store as the caller sees it, narrowed to the `project` the request names."""
    return runs.within(project)


def _config(request: Request) -> ServiceConfig:
    config: ServiceConfig = request.app.state.config
    return config


def _catalogs(request: Request) -> Catalogs:
    catalogs: Catalogs = request.app.state.catalogs
    return catalogs


def _worker(request: Request) -> Worker | None:
    worker: Worker | None = request.app.state.worker
    return worker


def _streams(request: Request) -> OpenStreams:
    streams: OpenStreams = request.app.state.streams
    return streams


Runs = Annotated[ScopedRuns, Depends(_scoped)]
"""The store as the caller sees it (every route that reads or changes runs, schedules,
evals)."""
InProject = Annotated[ScopedRuns, Depends(_in_project)]
"""The store as the caller sees it, narrowed by the request's ``?project=`` (every listing
that a person narrows to one project: the console's project picker)."""
WholeStore = Annotated[RunStore, Depends(_whole)]
"""The whole store: for admins' routes and the probes only."""
Config = Annotated[ServiceConfig, Depends(_config)]
Catalog = Annotated[Catalogs, Depends(_catalogs)]
"""The recipes each project is offered."""
InProcessWorker = Annotated["Worker | None", Depends(_worker)]
Streams = Annotated[OpenStreams, Depends(_streams)]
