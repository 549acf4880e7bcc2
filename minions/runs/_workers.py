"""The workers table: each worker of a store as its heartbeats tell of it, and the places it
has free (counted from DBOS's queue).

A worker's id is held by one incarnation at a time (a process; see `Worker`): a heartbeat
of an incarnation that lost the id writes nothing, and tells it to stand down. Each heartbeat
renews the leases of the runs the incarnation holds (`minions.runs._leases.renew_held`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from minions.runs import _leases as leases
from minions.runs._db import DEAD_AFTER, dumps
from minions.runs._queue import status_table
from minions.runs._tables import workers_table

if TYPE_CHECKING:
    from minions.runs._db import Database

__all__ = ["WorkerRecord"]

HEARTBEAT = float(os.environ.get("MINIONS_WORKER_HEARTBEAT", "2"))
"""Seconds between a worker's heartbeats (each renews the leases of the runs it holds)."""
EXPIRY = float(os.environ.get("MINIONS_WORKER_EXPIRY", str(24 * 3600)))
"""Seconds a worker that stopped, or stopped beating, stays in the store's records (and the
fleet views) after its last heartbeat: then a live worker deletes its record."""


@dataclass(frozen=True, kw_only=True)
class WorkerRecord:
    """A worker as its heartbeats tell of it."""

    executor_id: str
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    version: str
    runs: list[str]
    alive: bool = False
    """It beat within the dead-worker timeout and did not stop."""
    places: int | None = None
    """Runs it runs at a time (its own ``--concurrency``; None: a worker of an older
    minions)."""
    host: str | None = None
    """The machine it runs on."""
    pid: int | None = None
    """Its process id there."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    """Who holds a worker's id (its incarnation: a process), and how it was last heard of:
    what a worker starting with the id looks at."""

    incarnation: str | None
    host: str | None
    pid: int | None
    heartbeat_at: float
    stopped_at: float | None


def register(
    database: Database,
    executor_id: str,
    *,
    incarnation: str,
    version: str,
    host: str,
    pid: int,
    places: int | None = None,
) -> None:
    """This incarnation is the worker `executor_id` from now on, running `places` runs at a
    time (a crashed earlier one is replaced; see `Worker` for how a live one is told
    apart)."""
    now = time.time()
    values = {
        "started_at": now,
        "heartbeat_at": now,
        "stopped_at": None,
        "version": version,
        "runs": "[]",
        "incarnation": incarnation,
        "host": host,
        "pid": pid,
        "places": places,
    }
    with database.begin() as db:
        updated = db.execute(
            workers_table.update()
            .where(workers_table.c.executor_id == executor_id)
            .values(**values)
        ).rowcount
        if not updated:
            db.execute(
                database.insert_ignoring_conflicts(
                    workers_table, {"executor_id": executor_id, **values}
                )
            )


def registration(database: Database, executor_id: str) -> Registration | None:
    """Who holds the worker's id (None: no worker had it)."""
    with database.read() as db:
        row = db.execute(
            sa.select(workers_table).where(workers_table.c.executor_id == executor_id)
        ).one_or_none()
    if row is None:
        return None
    return Registration(
        incarnation=row.incarnation,
        host=row.host,
        pid=row.pid,
        heartbeat_at=row.heartbeat_at,
        stopped_at=row.stopped_at,
    )


def heartbeat(
    database: Database,
    executor_id: str,
    *,
    incarnation: str,
    runs: Sequence[str],
    lease_until: float,
) -> set[str] | None:
    """Say this incarnation lives and renew the leases of the runs it runs: the runs among
    `runs` it still holds (their leases renewed). None when the worker's id belongs to
    another incarnation now (this one was declared dead, or a second worker took the id):
    it must stand down."""
    with database.begin() as db:
        updated = db.execute(
            workers_table.update()
            .where(
                workers_table.c.executor_id == executor_id,
                workers_table.c.incarnation == incarnation,
            )
            .values(heartbeat_at=time.time(), runs=dumps(list(runs)), stopped_at=None)
        ).rowcount
        if not updated:
            return None
        return leases.renew_held(db, incarnation, runs, lease_until)


def stopped(database: Database, executor_id: str, *, incarnation: str) -> None:
    """The incarnation stopped (its runs were let go first)."""
    with database.begin() as db:
        db.execute(
            workers_table.update()
            .where(
                workers_table.c.executor_id == executor_id,
                workers_table.c.incarnation == incarnation,
            )
            .values(stopped_at=time.time(), runs="[]")
        )


def listed(database: Database) -> list[WorkerRecord]:
    """Every worker the store has known, in the order they started."""
    now = time.time()
    with database.read() as db:
        return [
            as_record(r, now)
            for r in db.execute(sa.select(workers_table).order_by(workers_table.c.started_at))
        ]


def expire(database: Database, executor_ids: Sequence[str], *, before: float) -> int:
    """Delete the records of these workers (found stopped or dead) whose last heartbeat is
    older than `before`; how many. A worker that beats again in between keeps its record."""
    if not executor_ids:
        return 0
    with database.begin() as db:
        return int(
            db.execute(
                workers_table.delete().where(
                    workers_table.c.executor_id.in_(list(executor_ids)),
                    workers_table.c.heartbeat_at < before,
                )
            ).rowcount
        )


def room_elsewhere(
    database: Database, executor_id: str, *, queue: str, places: int, now: float
) -> bool:
    """Whether another live worker of the store has a place free: fewer of the queue's
    workflows handed to it and not finished (DBOS's count, which includes a run waiting in
    it for a place) than its own places (`places`, the asker's, for a worker of an older
    minions that did not say its own)."""
    dbos = status_table(database.postgres)
    with database.read() as db:
        found = db.execute(
            sa.text(
                "SELECT 1 FROM minions_workers w WHERE w.executor_id <> :me "
                "AND w.stopped_at IS NULL AND w.heartbeat_at >= :alive "
                f"AND (SELECT count(*) FROM {dbos} s WHERE s.executor_id = w.executor_id "
                "AND s.queue_name = :queue AND s.status = 'PENDING') < coalesce(w.places, :places) "
                "LIMIT 1"
            ),
            {"me": executor_id, "alive": now - DEAD_AFTER, "queue": queue, "places": places},
        ).first()
    return found is not None


def as_record(row: Any, now: float) -> WorkerRecord:
    return WorkerRecord(
        executor_id=row.executor_id,
        started_at=row.started_at,
        heartbeat_at=row.heartbeat_at,
        stopped_at=row.stopped_at,
        version=row.version,
        runs=json.loads(row.runs),
        alive=row.stopped_at is None and now - row.heartbeat_at <= DEAD_AFTER,
        places=row.places,
        host=row.host,
        pid=row.pid,
    )
