"""DBOS underneath: one workflow per run (its id is the run id), a queue with a concurrency
limit, recovery of pending workflows (this worker's after a restart, a dead worker's by a live
one), cancellation and resumption. Imported only by what needs DBOS (a worker, a submit), as
DBOS is heavy to import."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dbos import DBOS, DBOSClient

from minions._version import __version__
from minions.models._base import Model
from minions.runs._runner import DurableRunner, LiveHub
from minions.runs._store import Store, sqlalchemy_url

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__: list[str] = []

QUEUE = "minions-runs"
WORKFLOW = "minions_run"
APP_VERSION = f"minions-{__version__}"
"""DBOS's application version: a worker runs (and recovers) only runs of its own version. The
run's recipe is a snapshot of its own, so editing the YAML never changes a queued run."""
POLLING = 0.05
"""Seconds between the queue's polls (DBOS's default of 1 s caps throughput)."""
HEARTBEAT = float(os.environ.get("MINIONS_WORKER_HEARTBEAT", "2"))
"""Seconds between a worker's heartbeats."""
DEAD_AFTER = float(os.environ.get("MINIONS_WORKER_DEAD_AFTER", "10"))
"""A worker silent this long is dead: a live one recovers its runs."""

_RUNNER: DurableRunner | None = None


@DBOS.workflow(name=WORKFLOW)
async def minions_run(run_id: str) -> None:
    """One run, from its last completed step."""
    if _RUNNER is None:
        raise RuntimeError("no minions worker in this process")
    await _RUNNER.execute(run_id)


def _client_url(url: str) -> str:
    return sqlalchemy_url(url).replace("postgresql+psycopg://", "postgresql://")


_MIGRATED: set[str] = set()


class Queue:
    """The store's DBOS queue seen from outside a worker: enqueue, cancel, resume. One DBOS
    client, made on first use; DBOS's tables are made first when no worker made them yet."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: DBOSClient | None = None

    def _dbos(self) -> DBOSClient:
        if self._client is None:
            logging.getLogger("dbos").setLevel(logging.WARNING)
            if self.url not in _MIGRATED:
                DBOS.migrate(_client_url(self.url))
                _MIGRATED.add(self.url)
            self._client = DBOSClient(system_database_url=_client_url(self.url))
        return self._client

    def enqueue(self, run_id: str) -> None:
        self._dbos().enqueue(
            {
                "queue_name": QUEUE,
                "workflow_name": WORKFLOW,
                "workflow_id": run_id,
                "app_version": APP_VERSION,
            },
            run_id,
        )

    def cancel(self, run_id: str) -> None:
        self._dbos().cancel_workflow(run_id)

    def resume(self, run_id: str) -> None:
        dbos_client = self._dbos()
        status = dbos_client.retrieve_workflow(run_id).get_status().status
        if status == "ERROR":
            # DBOS resumes only unfinished workflows; a failed run's workflow is rewound
            # (its steps are minions' checkpoints, so it goes on from the last completed one).
            dbos_client.rewind_workflow(run_id, queue_name=QUEUE, application_version=APP_VERSION)
        else:
            dbos_client.resume_workflow(run_id)

    def close(self) -> None:
        if self._client is not None:
            self._client.destroy()
            self._client = None


def stranded_runs() -> dict[str, list[str]]:
    """Runs waiting in the queue (or left running) under another minions version, by version:
    no worker of this version takes them, so a worker says so when it starts."""
    found: dict[str, list[str]] = {}
    for workflow in DBOS.list_workflows(
        status=["ENQUEUED", "PENDING"], queue_name=QUEUE, load_input=False, load_output=False
    ):
        if workflow.app_version != APP_VERSION:
            found.setdefault(workflow.app_version or "?", []).append(workflow.workflow_id)
    return found


def default_executor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs queued runs until stopped (SIGINT or SIGTERM, or `stop()`)."""

    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 4,
        executor_id: str | None = None,
        model: str | None = None,
        resolver: Callable[[Model | str | None], Model] | None = None,
        hub: LiveHub | None = None,
        on_ready: Callable[[Worker], None] | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.url = url
        self.concurrency = concurrency
        self.executor_id = executor_id or default_executor_id()
        self.store = Store(url, create=True)
        self.runner = DurableRunner(
            self.store,
            executor_id=self.executor_id,
            model=model,
            resolver=resolver,
            hub=hub,
            tracer_provider=tracer_provider,
        )
        self.on_ready = on_ready
        self._stop = threading.Event()
        self._recovered: set[tuple[str, float]] = set()
        self.stranded: dict[str, list[str]] = {}
        """Runs of other minions versions found when the worker started (see `stranded_runs`)."""

    def stop(self) -> None:
        self._stop.set()

    def run(self, *, handle_signals: bool = True) -> None:
        global _RUNNER
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, lambda *_: self.stop())
        _RUNNER = self.runner
        logging.getLogger("dbos").setLevel(logging.WARNING)
        DBOS(
            config={
                "name": "minions",
                "system_database_url": _client_url(self.url),
                "executor_id": self.executor_id,
                "application_version": APP_VERSION,
                "log_level": "WARNING",
                "notification_listener_polling_interval_sec": POLLING,
            }
        )
        try:
            DBOS.launch()
            DBOS.register_queue(
                QUEUE, worker_concurrency=self.concurrency, polling_interval_sec=POLLING
            )
            self.store.heartbeat(self.executor_id, version=APP_VERSION, runs=[])
            self.stranded = stranded_runs()
            if self.on_ready is not None:
                self.on_ready(self)
            while not self._stop.wait(HEARTBEAT):
                self._beat()
        finally:
            with contextlib.suppress(Exception):
                self.store.stopped(self.executor_id)
            DBOS.destroy(workflow_completion_timeout_sec=0)
            _RUNNER = None
            for restored, handler in previous.items():
                signal.signal(restored, handler)

    def _beat(self) -> None:
        """Say this worker lives; recover the runs left by workers that died or stopped."""
        self.store.heartbeat(self.executor_id, version=APP_VERSION, runs=list(self.runner.running))
        now = time.time()
        for worker in self.store.workers():
            if worker.executor_id == self.executor_id:
                continue
            gone = worker.stopped_at is not None or now - worker.heartbeat_at > DEAD_AFTER
            # Once per incarnation (a worker restarted with its id beats anew). DBOS is asked,
            # not minions' tables: a run the dead worker had taken from the queue but not yet
            # started is pending in DBOS while still `queued` here. Idempotent: DBOS hands
            # each pending run to one recoverer.
            incarnation = (worker.executor_id, worker.heartbeat_at)
            if gone and incarnation not in self._recovered:
                DBOS._recover_pending_workflows([worker.executor_id])
                self._recovered.add(incarnation)
                if worker.stopped_at is None:
                    self.store.stopped(worker.executor_id)
