"""`minions serve` underneath: uvicorn with the service's app, and (unless told not to) a worker
in the same process, in a thread of its own, whose live events (token deltas) reach the
streams."""

from __future__ import annotations

import gc
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import structlog

from minions import _logsetup as logs
from minions._step.settings import RunSettings
from minions.models import Limits
from minions.service._app import create_app
from minions.service._config import ServiceConfig
from minions.service._protocol import bounded_protocol, connection_cap

if TYPE_CHECKING:
    import uvicorn

__all__ = ["serve"]

log = structlog.get_logger(__name__)


def serve(
    config: ServiceConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    worker: bool = True,
    concurrency: int = 4,
    retention: str | None = None,
    audit_retention: str | None = "365d",
    on_ready: Callable[[str], None] | None = None,
    limits: Limits | None = None,
    log_format: logs.LogFormat = "console",
    grace: float = 30.0,
) -> None:
    """Serve until SIGINT or SIGTERM; the in-process worker drains as `minions worker` does:
    at the signal it claims nothing more and starts no new step, its steps in flight get
    `grace` seconds to finish, then its unfinished runs are handed back to the queue (to go
    on in the next worker, in their place); a second signal cuts the grace short.

    The process is the server's: its logging is set up here (every record, minions' and the
    libraries', on stderr in one format, tracebacks without local variables, the token and
    the environment's secrets redacted, a store outage said once), and its descriptor limit
    raised towards the hard one to hold `ServiceConfig.max_connections`.

    Args:
        config: what to serve.
        host: the address to bind (keep 127.0.0.1 unless a TLS proxy is in front).
        port: the port.
        worker: run queued runs in this process too.
        concurrency: runs at a time in that worker.
        retention: that worker prunes finished runs periodically, keeping those younger than
            a duration (``30d``) or the newest number of them (``1000 runs``).
        audit_retention: and the audit log's entries older than this (None: never).
        on_ready: told the worker's id (or ``""`` without one) once the server listens.
        limits: limits per model endpoint for the in-process worker's runs (held over every
            worker of the store given them).
        log_format: ``console`` (lines for people) or ``json`` (one object per line).
        grace: seconds the in-process worker's steps in flight get to finish when it stops
            (as `minions worker --grace`).

    Raises:
        MissingExtraError: `config` asks for metrics and the metrics extra is missing.
    """
    import uvicorn

    from minions.runs import LiveHub, database_url

    url = database_url(config.database_url)
    logs.install(logs.Redactor(logs.secrets_of(config.token, os.environ, url)), format=log_format)
    exported = None
    if config.metrics:
        from minions._tracing.prometheus import PrometheusMetrics

        exported = PrometheusMetrics()
    connections = connection_cap(config.max_connections)
    if connections < config.max_connections:
        log.warning(
            "fewer connections than asked: the descriptor limit holds no more",
            max_connections=connections,
        )
    hub = LiveHub() if worker else None
    running = None
    thread = None
    if worker:
        from minions.runs import Worker

        started = threading.Event()
        failure: list[BaseException] = []
        running = Worker(
            url,
            concurrency=concurrency,
            settings=RunSettings(
                model=config.model,
                metrics=None if exported is None else exported.metrics,
            ),
            hub=hub,
            on_ready=lambda _: started.set(),
            retention=retention,
            audit_retention=audit_retention,
            limits=limits,
            recipes=config.recipes,
            project_recipes=config.project_recipes,
            grace=grace,
        )

        def work() -> None:
            try:
                running.run(handle_signals=False)
            except BaseException as exc:  # told to the main thread
                failure.append(exc)
                started.set()

        thread = threading.Thread(target=work, name="minions-worker", daemon=True)
        thread.start()
        started.wait()
        if failure:
            raise failure[0]
    app = create_app(config, hub=hub, worker=running, metrics=exported)
    executor_id = running.executor_id if running is not None else ""

    signals = 0
    """Stop signals received: the first drains the worker, the next cut its grace short."""

    def stop_worker(*_: object) -> None:
        nonlocal signals
        signals += 1
        if running is not None:
            running.stop(now=signals > 1)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # The worker drains from the signal on (it claims nothing more while the server
            # closes its connections), not once the server has stopped.
            stop_worker()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            # What was built to start (FastAPI, DBOS, SQLAlchemy, pydantic: a big heap) lives
            # as long as the process: the collector need not walk it again on every full
            # collection, which stalled every stream at once for tens of milliseconds.
            gc.collect()
            gc.freeze()
            if self.started and on_ready is not None:
                on_ready(executor_id)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # The event streams end first, cleanly: otherwise each open one (a console
            # watching a run) held the stop for the graceful timeout, then was cancelled with
            # a traceback in the log.
            app.state.streams.stop()
            await super().shutdown(sockets)
            # Stopped by SIGTERM or SIGINT: the process ends by returning, once the worker
            # in it has stopped and let go of its runs, with exit code 0 (what systemd,
            # Docker and Kubernetes take as a clean stop), not by uvicorn raising the signal
            # again, which killed it before its worker stopped.
            self._captured_signals.clear()

    server = Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            log_config=None,  # its records go through the process's log (see _logsetup)
            access_log=False,
            timeout_graceful_shutdown=3,
            http=bounded_protocol(head_timeout=config.request_timeout, max_connections=connections),
            timeout_keep_alive=5,
            # With a trusted proxy's user header, the peer must be the proxy's address, not
            # what an X-Forwarded-For header (which a client can write) says.
            proxy_headers=config.proxy_user_header is None,
        )
    )

    def drain() -> None:
        if running is not None and thread is not None:
            if signals == 0:
                stop_worker()  # it drains: its steps in flight get its grace to finish
            thread.join(timeout=running.grace + 15)

    try:
        serve_then_drain(server, drain)
    finally:
        if exported is not None:
            exported.shutdown()


def serve_then_drain(server: uvicorn.Server, drain: Callable[[], None]) -> None:
    """Run `server`, then `drain` the worker, with SIGINT and SIGTERM calling the server's
    `handle_exit` from before it starts until the drain ends (in the main thread): a signal
    while the server runs stops it, and one after cuts the worker's grace short. uvicorn puts
    back, as it stops, the handlers it found: these, never the default, which killed the
    process when a second signal came between the server's stop and the drain (exit -15)."""
    if threading.current_thread() is not threading.main_thread():
        try:
            server.run()
        finally:
            drain()
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in signals}
    try:
        try:
            server.run()
        finally:
            drain()
    finally:
        for sig, restored in previous.items():
            signal.signal(sig, restored)
