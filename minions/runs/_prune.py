"""Retention: deleting finished runs with everything stored of them (steps, events,
approvals, the step cache entries they made, and the DBOS workflows of their attempts), a
batch per short transaction so that workers writing meanwhile wait for one batch at most;
then, on SQLite, giving the freed pages back to the file system.

A run is deleted by compare-and-set on its status: a run resumed meanwhile (queued again) is
not finished any more, and stays.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minions._duration import TooLongError, duration_seconds
from minions.runs import _approvals as approvals
from minions.runs import _audit
from minions.runs import _cache as cache
from minions.runs import _checkpoints as checkpoints
from minions.runs import _evals as evals
from minions.runs import _events as events
from minions.runs import _queue as queue
from minions.runs import _runs as runs
from minions.runs._db import Database, meta, put_meta, sqlite_path
from minions.runs._tables import (
    TERMINAL,
    approvals_table,
    events_table,
    runs_table,
    steps_table,
)

__all__ = ["History", "PruneResult", "Retention"]

BATCH = 500
"""Runs deleted per transaction."""
PAUSE = 0.02
"""Seconds between two batches: the workers' writes go first."""


@dataclass(frozen=True, kw_only=True)
class PruneResult:
    """What a prune deleted (or, in a dry run, would delete).

    Attributes:
        runs: finished runs deleted, with their steps, events, approvals, step cache
            entries and DBOS workflows.
        before: runs that finished before this moment (a Unix time) were eligible.
        statuses: the statuses pruned.
        dry_run: nothing was deleted.
        bytes_before: the SQLite file's size before (None on Postgres).
        bytes_after: and after, once the freed pages went back to the file system.
        evals: kept eval reports deleted with them (see `RunStore.keep_eval`).
    """

    runs: int
    before: float
    statuses: tuple[str, ...]
    dry_run: bool = False
    bytes_before: int | None = None
    bytes_after: int | None = None
    evals: int = 0


@dataclass(frozen=True, kw_only=True)
class History:
    """How far the stored history goes back.

    Attributes:
        oldest_at: when the oldest stored run was created (None: no run).
        pruned_before: runs that finished before this were pruned (None: never pruned).
        pruned_at: when that prune ran.
    """

    oldest_at: float | None
    pruned_before: float | None = None
    pruned_at: float | None = None
    pruned_by: str | None = None
    """Who ran that prune (a key's name, ``token``, ``cli:USER``; None: not known)."""


@dataclass(frozen=True, kw_only=True)
class Retention:
    """What periodic pruning keeps: finished runs younger than `older_than` seconds, or the
    newest `keep` finished runs."""

    older_than: float | None = None
    keep: int | None = None

    def describe(self) -> str:
        """What it keeps, as `parse` reads it."""
        return f"{self.keep} runs" if self.keep is not None else f"{self.older_than:g}s"

    @classmethod
    def parse(cls, text: str) -> Retention:
        """``30d`` (a duration: younger runs are kept) or ``1000 runs`` (a count).

        Raises:
            ValueError: neither, or a duration too long (the message names the value).
        """
        counted = re.fullmatch(r"\s*(\d+)\s*runs?\s*", text)
        if counted:
            return cls(keep=int(counted.group(1)))
        try:
            return cls(older_than=duration_seconds(text))
        except TooLongError:
            raise
        except ValueError:
            raise ValueError(
                f"retention {text!r}: give a duration (30d, 12h) or a number of runs (1000 runs)"
            ) from None


def audit_horizon(text: str) -> float:
    """The seconds of an audit retention (``365d``).

    Raises:
        ValueError: it is not a duration (the message names it).
    """
    try:
        return duration_seconds(text)
    except TooLongError:
        raise
    except ValueError:
        raise ValueError(f"audit retention {text!r}: give a duration (365d, 90d)") from None


def prune(
    database: Database,
    *,
    before: float,
    statuses: Sequence[str] = tuple(sorted(TERMINAL)),
    keep: int | None = None,
    dry_run: bool = False,
    batch: int = BATCH,
    pause: float = PAUSE,
    actor: str | None = None,
    audit: Mapping[str, Any] | None = None,
    audit_empty: bool = True,
) -> PruneResult:
    """Delete the runs in one of `statuses` (finished ones only) that finished before
    `before`, oldest first, but the newest `keep` of them; `actor` ran the prune (recorded
    with how far pruning went). `audit`: the prune's audit entry, written with what it
    deleted in the transaction that records how far pruning went (a prune that deleted
    nothing writes it when `audit_empty`: a person asked; a worker's retention does not).

    Raises:
        ValueError: a status that is not a finished one.
    """
    unknown = sorted(set(statuses) - TERMINAL)
    if unknown:
        raise ValueError(
            f"only finished runs are pruned: {', '.join(unknown)} is not one of "
            f"{', '.join(sorted(TERMINAL))}"
        )
    chosen = tuple(sorted(set(statuses)))
    total = max(0, runs.count_finished(database, chosen, before) - (keep or 0))
    path = sqlite_path(database.url)
    size_before = _size(path)
    # Kept eval reports go with the runs when every finished run is pruned.
    gone_evals = (
        evals.prune(database, before=before, keep=keep, dry_run=dry_run)
        if set(chosen) == TERMINAL
        else 0
    )
    if dry_run or not total:
        if not dry_run and audit is not None and (gone_evals or audit_empty):
            _audit.add(database, _audit.told(audit, runs=0, evals=gone_evals))
        return PruneResult(
            runs=total, before=before, statuses=chosen, dry_run=dry_run, bytes_before=size_before,
            bytes_after=size_before, evals=gone_evals,
        )  # fmt: skip
    deleted = 0
    while deleted < total:
        found = runs.oldest_finished(database, chosen, before, limit=min(batch, total - deleted))
        if not found:
            break
        deleted += _delete(database, found, chosen)
        time.sleep(pause)
    with database.begin() as db:
        now = time.time()
        told = (("pruned_before", repr(before)), ("pruned_at", repr(now)), ("pruned_by", actor))
        put_meta(db, [(key, value or "") for key, value in told])
        if audit is not None and (deleted or gone_evals or audit_empty):
            _audit.write(db, _audit.told(audit, runs=deleted, evals=gone_evals))
    if path is not None:
        _shrink(database)
    elif database.postgres:
        _vacuum(database)
    return PruneResult(
        runs=deleted, before=before, statuses=chosen, bytes_before=size_before,
        bytes_after=_size(path), evals=gone_evals,
    )  # fmt: skip


def _delete(database: Database, run_ids: list[str], statuses: tuple[str, ...]) -> int:
    """Delete these runs (those still finished) and what is stored of them, in one commit."""
    with database.begin() as db:
        gone = runs.forget(db, run_ids, statuses)
        ids = [r.run_id for r in gone]
        if not ids:
            return 0
        checkpoints.forget(db, ids)
        cache.forget(db, ids)
        events.forget(db, ids)
        approvals.forget(db, ids)
        workflows = [queue.workflow_id(r.run_id, n) for r in gone for n in range(1, r.attempt + 1)]
        queue.forget(database, db, workflows)
    return len(ids)


def _shrink(database: Database) -> None:
    """Give an SQLite file's free pages back: a few thousand at a time where the store
    vacuums incrementally (stores made since pruning exists do), else with one full
    ``VACUUM`` (in WAL mode it cannot switch a store to incremental); then empty the
    write-ahead log."""
    with database.engine.connect() as raw:
        incremental = raw.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2
    # `executescript`: the driver's `execute` steps a vacuum once, a page.
    script = "PRAGMA incremental_vacuum(2000);" if incremental else "VACUUM;"
    while True:
        with database.turn(), database.engine.connect() as raw:
            sqlite: Any = raw.connection.driver_connection
            sqlite.executescript(script)
            left = sqlite.execute("PRAGMA freelist_count").fetchone()[0]
            if not incremental or not left:
                sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                return
        time.sleep(PAUSE)


def _vacuum(database: Database) -> None:
    """Make the deleted rows' space reusable at once on Postgres (a plain ``VACUUM`` takes
    no lock writers wait on): autovacuum alone fell behind a retention that prunes every
    minute, and the database grew by the size of each pruned batch."""
    with database.engine.connect() as raw:
        with database.read() as db:
            tables = [kept.table for kept in queue.workflow_tables(database, db)]
        names = [t.name for t in (runs_table, steps_table, events_table, approvals_table)]
        names += [f"dbos.{t.name}" for t in tables]
        autocommit = raw.execution_options(isolation_level="AUTOCOMMIT")
        for name in names:
            autocommit.exec_driver_sql(f"VACUUM {name}")


def _size(path: Any) -> int | None:
    if path is None:
        return None
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += (path.parent / (path.name + suffix)).stat().st_size
        except FileNotFoundError:
            pass
    return total


def history(database: Database) -> History:
    """How far the stored runs go back, and how far pruning went."""
    oldest = runs.oldest_created(database)
    with database.read() as db:
        told = meta(db, ("pruned_before", "pruned_at", "pruned_by"))
    return History(
        oldest_at=oldest,
        pruned_before=float(told["pruned_before"]) if "pruned_before" in told else None,
        pruned_at=float(told["pruned_at"]) if "pruned_at" in told else None,
        pruned_by=told.get("pruned_by") or None,
    )
