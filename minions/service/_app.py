"""The FastAPI application: its lifespan (the run store, its event log, the recipes), the
guard (bearer token, body size), the routers and the error table."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from minions._version import __version__
from minions.runs import LiveHub, RunStore
from minions.service._access import undeclared, unscoped
from minions.service._config import ServiceConfig
from minions.service._errors import install
from minions.service._guard import PUBLIC_PATHS, Guard, proxy_networks
from minions.service._recipes import Catalogs, RecipeCatalog
from minions.service._routes import (
    audit,
    console,
    evals,
    events,
    fleet,
    info,
    keys,
    rerun,
    runs,
    schedules,
    steps,
)
from minions.service._stream import OpenStreams

if TYPE_CHECKING:
    from minions._tracing.prometheus import PrometheusMetrics
    from minions.runs import Worker

__all__ = ["ServiceConfig", "create_app"]


def create_app(
    config: ServiceConfig,
    *,
    hub: LiveHub | None = None,
    worker: Worker | None = None,
    metrics: PrometheusMetrics | None = None,
) -> FastAPI:
    """The service's ASGI application over the run store of `config`.

    Args:
        config: what to serve.
        hub: the live events of a worker in this process (token deltas reach the streams
            only through it).
        worker: the worker in this process, whose state the probes report.
        metrics: this process's metrics, served by ``/metrics`` with the store's gauges when
            `config` says so (``None``: the store's gauges only).

    Raises:
        ValueError: a proxy's user header without the proxy's address, or a trusted proxy
            that is not an address or a network.
        MissingExtraError: `config` asks for metrics and the metrics extra is missing.
    """
    if config.proxy_user_header is not None and not config.trusted_proxies:
        raise ValueError(
            f"a proxy's user header ({config.proxy_user_header}) needs the proxy's address: "
            "trusted_proxies (--trusted-proxy ADDR)"
        )
    proxy_networks(config.trusted_proxies)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # No request makes this process import code: recipes are checked without importing
        # their tools modules (the worker imports them when it runs the run).
        store = RunStore(
            config.database_url, create=True, hub=hub, poll=config.poll, import_tools=False
        )
        catalogs = Catalogs(
            RecipeCatalog(config.recipes),
            {project: RecipeCatalog(folder) for project, folder in config.project_recipes.items()},
        )
        await asyncio.to_thread(catalogs.start)
        await store.log.start()
        app.state.runs, app.state.catalogs = store, catalogs
        try:
            yield
        finally:
            await store.aclose()

    app = FastAPI(
        title="minions",
        version=__version__,
        description="Durable runs of minions recipes: submit, watch, cancel, resume, approve.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.config, app.state.worker = config, worker
    app.state.streams = OpenStreams()
    install(app)
    routers = (runs.router, rerun.router, events.router, steps.router, info.router)
    for router in (
        *routers,
        fleet.router,
        schedules.router,
        evals.router,
        keys.router,
        audit.router,
        console.router,
    ):
        app.include_router(router)
    public = PUBLIC_PATHS
    if config.metrics:
        from minions._tracing.prometheus import PrometheusMetrics
        from minions.service._routes import metrics as metrics_route

        app.state.metrics = metrics if metrics is not None else PrometheusMetrics()
        app.include_router(metrics_route.router)
        if config.metrics_public:
            public = public | {"/metrics"}
    missing = undeclared(app)
    if missing:  # a route of this package that forgot its permission: never served
        raise RuntimeError(f"routes without one permission declared: {', '.join(missing)}")
    loose = unscoped(app)
    if loose:  # a route that could reach another project's rows: never served
        raise RuntimeError(f"routes not kept to their caller's projects: {', '.join(loose)}")
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(
        Guard,
        token=config.token,
        max_body=config.max_body_bytes,
        body_timeout=config.request_timeout,
        proxy_user_header=config.proxy_user_header,
        trusted_proxies=config.trusted_proxies,
        public=public,
    )
    app.state.public = public
    return app


UNLINKED = frozenset({"/runs/{run_id}/events/stream", "/runs/{run_id}/approvals/{call_id}"})
"""Operations on a run that its submission does not link to: a stream lasts as long as the
run, and an approval needs a call id the run gives later."""


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The schema, with the bearer scheme on every operation but the public ones, and links
    from a submitted run to what can be done with it."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"}
        }
        links = {}
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                if path not in app.state.public:
                    operation["security"] = [{"bearer": []}]
                if path.startswith("/runs/{run_id}") and path not in UNLINKED:
                    links[operation["operationId"]] = {
                        "operationId": operation["operationId"],
                        "parameters": {"path.run_id": "$response.body#/run_id"},
                    }
        schema["paths"]["/runs"]["post"]["responses"]["201"]["links"] = links
        app.openapi_schema = schema
    return app.openapi_schema
