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
from typing import Any

from dbos import DBOS, DBOSClient

from minions._version import __version__
from minions.models._base import Model
from minions.runs._runner import DurableRunner, LiveHub
from minions.runs._store import Store, sqlalchemy_url

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


@contextlib.contextmanager
def client(url: str) -> Any:
    """A DBOS client of the store's database (to enqueue, cancel, resume); DBOS's tables are
    made first when no worker made them yet."""
    logging.getLogger("dbos").setLevel(logging.WARNING)
    if url not in _MIGRATED:
        DBOS.migrate(_client_url(url))
        _MIGRATED.add(url)
    dbos_client = DBOSClient(system_database_url=_client_url(url))
    try:
        yield dbos_client
    finally:
        dbos_client.destroy()


def enqueue(url: str, run_id: str) -> None:
    with client(url) as dbos_client:
        dbos_client.enqueue(
            {
                "queue_name": QUEUE,
                "workflow_name": WORKFLOW,
                "workflow_id": run_id,
                "app_version": APP_VERSION,
            },
            run_id,
        )


def cancel(url: str, run_id: str) -> None:
    with client(url) as dbos_client:
        dbos_client.cancel_workflow(run_id)


def resume(url: str, run_id: str) -> None:
    with client(url) as dbos_client:
        status = dbos_client.retrieve_workflow(run_id).get_status().status
        if status == "ERROR":
            # DBOS resumes only unfinished workflows; a failed run's workflow is rewound
            # (its steps are minions' checkpoints, so it goes on from the last completed one).
            dbos_client.rewind_workflow(run_id, queue_name=QUEUE, application_version=APP_VERSION)
        else:
            dbos_client.resume_workflow(run_id)


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
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.url = url
        self.concurrency = concurrency
        self.executor_id = executor_id or default_executor_id()
        self.store = Store(url, create=True)
        self.runner = DurableRunner(
            self.store, executor_id=self.executor_id, model=model, resolver=resolver, hub=hub
        )
        self.on_ready = on_ready
        self._stop = threading.Event()

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
            if gone and self.store.runs_of(worker.executor_id, ("running", "waiting")):
                # Idempotent: DBOS re-enqueues each pending run once, for one runner.
                DBOS._recover_pending_workflows([worker.executor_id])
                if worker.stopped_at is None:
                    self.store.stopped(worker.executor_id)
