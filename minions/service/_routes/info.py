"""``/recipes``, and the probes: ``/health``, ``/health/live``, ``/health/ready``."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from minions._version import __version__
from minions.errors import MinionsError, UnknownProjectError
from minions.service._access import Public, Reader
from minions.service._deps import Catalog, InProcessWorker, Runs, Streams, WholeStore
from minions.service._errors import ERRORS, Refused
from minions.service._models import Health, Probe, RecipeOut
from minions.service._models import Streams as StreamsOut
from minions.service._ready import problem

__all__: list[str] = []

router = APIRouter(responses=ERRORS)


@router.get("/recipes", response_model=list[RecipeOut])
async def recipes(
    caller: Reader,
    runs: Runs,
    catalogs: Catalog,
    project: Annotated[
        str | None,
        Query(
            description="The recipes this project of the key's is offered (default: its "
            "only project's; for a key of several, or an admin, the server's folder's).",
            max_length=64,
        ),
    ] = None,
) -> list[RecipeOut]:
    """The recipes a project is offered (its own folder's, or the server's): ids,
    descriptions, input schemas."""
    try:
        chosen = runs.scope.project_for(project)
    except ValueError as exc:
        raise Refused(422, f"query.project: {exc}") from None
    except UnknownProjectError:
        raise
    except MinionsError:  # several projects and none named: the server's folder
        chosen = None
    catalog = catalogs.of(chosen) if chosen is not None else catalogs.shared
    entries = await asyncio.to_thread(catalog.scan)
    folder = catalog.folder
    return [
        RecipeOut(
            id=e.id,
            description=e.description,
            file=str(e.path.relative_to(folder)) if folder else e.path.name,
            inputs=e.inputs,
        )
        for e in entries.values()
    ]


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "the store or the worker is unusable"}},
)
async def health(
    anyone: Public, worker: InProcessWorker, runs: WholeStore, streams: Streams
) -> JSONResponse:
    """Up, the state of the worker in this process, and its event streams (no token
    needed): 503 while the run store cannot be used (down, or of another schema) or the
    worker in this process is not running."""
    state = "none" if worker is None else worker.state
    why = await problem(runs, worker)
    hub = runs.log.hub
    body = Health(
        status="ok" if why is None else "unavailable",
        version=__version__,
        streams=StreamsOut(
            open=streams.open,
            runs_followed=runs.log.feeds(),
            live_subscriptions=hub.subscriptions() if hub is not None else 0,
        ),
        worker=state,
        error=why,
    )
    return JSONResponse(body.model_dump(), status_code=200 if why is None else 503)


@router.get("/health/live", response_model=Probe)
async def live(anyone: Public) -> Probe:
    """The process answers (no token needed): restart it when this fails."""
    return Probe(status="ok")


@router.get(
    "/health/ready",
    response_model=Probe,
    responses={503: {"model": Probe, "description": "not able to serve now, and why"}},
)
async def ready(anyone: Public, worker: InProcessWorker, runs: WholeStore) -> JSONResponse:
    """The process can serve now (no token needed): its run store answers with the schema
    this minions knows, and the worker in its process (if any) runs; 503 with the reason
    otherwise (send it no traffic until it is 200 again)."""
    why = await problem(runs, worker)
    body = Probe(status="ok" if why is None else "unavailable", reason=why)
    return JSONResponse(body.model_dump(), status_code=200 if why is None else 503)
