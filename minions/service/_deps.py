"""What routes depend on, through FastAPI's `Depends`: the run store, the recipes, the config,
the in-process worker and the count of open streams, kept on ``app.state``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from minions.runs import RunStore
from minions.service._config import ServiceConfig
from minions.service._recipes import RecipeCatalog
from minions.service._stream import OpenStreams

if TYPE_CHECKING:
    from minions.runs import Worker

__all__: list[str] = []


def _runs(request: Request) -> RunStore:
    runs: RunStore = request.app.state.runs
    return runs


def _config(request: Request) -> ServiceConfig:
    config: ServiceConfig = request.app.state.config
    return config


def _catalog(request: Request) -> RecipeCatalog:
    catalog: RecipeCatalog = request.app.state.catalog
    return catalog


def _worker(request: Request) -> Worker | None:
    worker: Worker | None = request.app.state.worker
    return worker


def _streams(request: Request) -> OpenStreams:
    streams: OpenStreams = request.app.state.streams
    return streams


Runs = Annotated[RunStore, Depends(_runs)]
Config = Annotated[ServiceConfig, Depends(_config)]
Catalog = Annotated[RecipeCatalog, Depends(_catalog)]
InProcessWorker = Annotated["Worker | None", Depends(_worker)]
Streams = Annotated[OpenStreams, Depends(_streams)]
