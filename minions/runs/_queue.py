"""DBOS underneath, seen from outside a worker: each attempt of a run is one DBOS workflow on
one queue, enqueued in the same transaction that changes the run (submit, resume, a takeover),
so a run is queued exactly when minions' tables say so. Imported only by what needs DBOS (a
submission, a resume, a worker), as DBOS is heavy to import.

DBOS delivers; minions' tables decide. A delivery of an attempt that is no longer the run's
current one, or of a run that ended, does nothing; a worker holds a run by a lease whose epoch
fences out every earlier holder (see `minions.runs._store`).
"""

from __future__ import annotations

import logging
import re

import sqlalchemy as sa
from dbos import DBOS, DBOSClient

from minions.runs._store import sqlalchemy_url, workflow_id
from minions.runs._wake import wake_in

__all__: list[str] = []

QUEUE = "minions-runs"
WORKFLOW = "minions_run"
FORMAT = 1
"""The version of what a run's workflow is given (its run id and attempt): only a change of it
needs a migration. The DBOS application version is this, not the package's version, so a
new minions runs the queued runs of the one before."""
APP_VERSION = f"minions-durable-{FORMAT}"
LEGACY_VERSION = re.compile(r"^minions-\d")
"""DBOS application versions of minions before the format had its own version (the package's
version): their queued and unfinished runs are taken over by today's workers."""


def attempt_of(workflow: str) -> tuple[str, int]:
    """The run id and attempt of a workflow id made by `workflow_id`."""
    run_id, _, attempt = workflow.partition("-")
    return run_id, int(attempt) if attempt.isdigit() else 1


def client_url(url: str) -> str:
    return sqlalchemy_url(url).replace("postgresql+psycopg://", "postgresql://")


_MIGRATED: set[str] = set()


class Queue:
    """The store's DBOS queue seen from outside a worker. One DBOS client, made on first use;
    DBOS's tables are made first when no worker made them yet."""

    name = QUEUE

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: DBOSClient | None = None

    def client(self) -> DBOSClient:
        if self._client is None:
            logging.getLogger("dbos").setLevel(logging.WARNING)
            if self.url not in _MIGRATED:
                DBOS.migrate(client_url(self.url))
                _MIGRATED.add(self.url)
            self._client = DBOSClient(system_database_url=client_url(self.url), lazy=True)
        return self._client

    def enqueue(self, db: sa.Connection, run_id: str, attempt: int) -> None:
        """Queue the run's attempt in the caller's transaction (`db`: the store's database).
        The client must be made first (`client()`): making it may create DBOS's tables,
        which on SQLite would wait forever on the caller's transaction."""
        if self._client is None:
            raise RuntimeError("Queue.client() must be called before a transaction enqueues")
        self._client.enqueue_in_transaction(
            db,
            {
                "queue_name": QUEUE,
                "workflow_name": WORKFLOW,
                "workflow_id": workflow_id(run_id, attempt),
                "app_version": APP_VERSION,
            },
            run_id,
            attempt,
        )
        # The store's workers look at the queue when this transaction commits.
        wake_in(db, self.url, "queue")

    def cancel(self, workflow: str) -> None:
        """Take a workflow out of DBOS's queue (best effort: minions' tables already decided
        that nothing runs it)."""
        try:
            self.client().cancel_workflow(workflow)
        except Exception as exc:  # DBOS keeps a stale attempt that does nothing when run
            logging.getLogger(__name__).debug("could not cancel %s: %s", workflow, exc)

    def close(self) -> None:
        if self._client is not None:
            self._client.destroy()
            self._client = None
