"""``/recipes``, ``/workers`` and ``/health``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from minions._version import __version__
from minions.service._access import Public, Reader
from minions.service._deps import Catalog, InProcessWorker, Runs, Streams
from minions.service._errors import ERRORS
from minions.service._models import Health, RecipeOut, WorkerOut
from minions.service._models import Streams as StreamsOut

__all__: list[str] = []

router = APIRouter(responses=ERRORS)


@router.get("/recipes", response_model=list[RecipeOut])
async def recipes(caller: Reader, catalog: Catalog) -> list[RecipeOut]:
    """The recipes of the server's folder: ids, descriptions, input schemas."""
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


@router.get("/workers", response_model=list[WorkerOut])
async def workers(caller: Reader, runs: Runs) -> list[WorkerOut]:
    """The workers of the store: ids, heartbeats, runs in hand, alive or not."""
    return [WorkerOut.model_validate(w) for w in await runs.workers()]


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "the in-process worker is not running"}},
)
async def health(
    anyone: Public, worker: InProcessWorker, runs: Runs, streams: Streams
) -> JSONResponse:
    """Up, the state of the worker in this process, and its event streams (no token
    needed): 503 while the worker is not running (its database is unreachable, or it
    stopped)."""
    state = "none" if worker is None else worker.state
    ok = state in ("none", "running")
    hub = runs.log.hub
    body = Health(
        status="ok" if ok else "unavailable",
        version=__version__,
        streams=StreamsOut(
            open=streams.open,
            runs_followed=runs.log.feeds(),
            live_subscriptions=hub.subscriptions() if hub is not None else 0,
        ),
        worker=state,
        error=None if worker is None else worker.error,
    )
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)
