"""DBOS underneath, seen from outside a worker: each attempt of a run is one DBOS workflow on
one queue, enqueued in the same transaction that changes the run (submit, resume, a takeover),
so a run is queued exactly when minions' tables say so; and DBOS's tables as minions reads
them (a workflow's status, the workflows handed to a worker, the rows of a pruned run's
workflows). DBOS is heavy to import: only the queue's client imports it.

DBOS delivers; minions' tables decide. A delivery of an attempt that is no longer the run's
current one, or of a run that ended, does nothing; a worker holds a run by a lease whose epoch
fences out every earlier holder (see `minions.runs._leases`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from minions.runs._db import sqlalchemy_url
from minions.runs._tables import OURS
from minions.runs._wake import wake_in

if TYPE_CHECKING:
    from dbos import DBOSClient

    from minions.runs._db import Database

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


def workflow_id(run_id: str, attempt: int) -> str:
    """The DBOS workflow of a run's attempt: the run id for the first, then ``RUN-2``..."""
    return run_id if attempt == 1 else f"{run_id}-{attempt}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunAttempt:
    """The run and attempt a workflow is."""

    run_id: str
    attempt: int


def attempt_of(workflow: str) -> RunAttempt:
    """The run id and attempt of a workflow id made by `workflow_id`."""
    run_id, _, attempt = workflow.partition("-")
    return RunAttempt(run_id=run_id, attempt=int(attempt) if attempt.isdigit() else 1)


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
            from dbos import DBOS, DBOSClient

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
        if attempt > 1 or db.dialect.name == "sqlite":
            # On SQLite under Python < 3.12, DBOS stamps a workflow to the second: the runs
            # of one second would tie, and a run queued again (stamped to the millisecond)
            # would go behind those queued after it in the same second.
            keep_place(db, run_id, workflow_id(run_id, attempt))
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


def keep_place(db: sa.Connection, run_id: str, workflow: str) -> None:
    """Give the run's queued `workflow` the run's place in the queue: the time it was first
    queued, not now. DBOS hands out a queue's workflows by their creation time (and a
    priority minions does not use), so a run queued again (taken over, handed back, given
    back by a worker that drains, resumed) goes before the runs queued after it was first
    submitted, and a restarted worker does not take newer runs first."""
    table = status_table(db.dialect.name == "postgresql")
    db.execute(
        sa.text(
            f"UPDATE {table} SET created_at = (SELECT CAST(created_at * 1000 AS BIGINT) "
            "FROM minions_runs WHERE run_id = :run) WHERE workflow_uuid = :workflow"
        ),
        {"run": run_id, "workflow": workflow},
    )


# -- DBOS's tables ---------------------------------------------------------------------------------


def status_table(postgres: bool) -> str:
    """DBOS's table of workflows and their status (``PENDING``, ``CANCELLED``...)."""
    return "dbos.workflow_status" if postgres else "workflow_status"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowTable:
    """A table of DBOS that holds rows of workflows."""

    table: sa.Table
    column: str
    """The column naming a row's workflow."""


_WORKFLOW_TABLES: dict[str, list[WorkflowTable]] = {}


def workflow_tables(database: Database, db: sa.Connection) -> list[WorkflowTable]:
    """DBOS's tables that hold rows of a workflow; the workflows' own table last (the
    others refer to it)."""
    known = _WORKFLOW_TABLES.get(database.url)
    if known is not None:
        return known
    schema = "dbos" if database.postgres else None
    inspector = sa.inspect(db)
    found: list[WorkflowTable] = []
    last: list[WorkflowTable] = []
    for name in inspector.get_table_names(schema=schema):
        if name in OURS:
            continue
        columns = {c["name"] for c in inspector.get_columns(name, schema=schema)}
        for column in ("workflow_uuid", "destination_uuid"):
            if column in columns:
                table = sa.Table(name, sa.MetaData(), sa.Column(column, sa.Text), schema=schema)
                kept = WorkflowTable(table=table, column=column)
                (last if name == "workflow_status" else found).append(kept)
                break
    _WORKFLOW_TABLES[database.url] = found + last
    return found + last


def forget(database: Database, db: sa.Connection, workflows: Sequence[str]) -> None:
    """Delete what DBOS keeps of these workflows (pruning, in the caller's transaction)."""
    for kept in workflow_tables(database, db):
        db.execute(kept.table.delete().where(kept.table.c[kept.column].in_(list(workflows))))
