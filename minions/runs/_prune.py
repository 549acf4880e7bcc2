"""Retention: deleting finished runs with everything stored of them (steps, events,
approvals, and the DBOS workflows of their attempts), a batch per short transaction so that
workers writing meanwhile wait for one batch at most; then, on SQLite, giving the freed pages
back to the file system.

A run is deleted by compare-and-set on its status: a run resumed meanwhile (queued again) is
not finished any more, and stays.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from minions._text import duration_seconds
from minions.runs._store import Store, sqlite_path, workflow_id
from minions.runs._tables import (
    OURS,
    TERMINAL,
    History,
    PruneResult,
    approvals_table,
    events_table,
    meta_table,
    runs_table,
    steps_table,
)

__all__: list[str] = []

BATCH = 500
"""Runs deleted per transaction."""
PAUSE = 0.02
"""Seconds between two batches: the workers' writes go first."""


@dataclass(frozen=True, kw_only=True)
class Retention:
    """What periodic pruning keeps: finished runs younger than `older_than` seconds, or the
    newest `keep` finished runs."""

    older_than: float | None = None
    keep: int | None = None

    @classmethod
    def parse(cls, text: str) -> Retention:
        """``30d`` (a duration: younger runs are kept) or ``1000 runs`` (a count).

        Raises:
            ValueError: neither (the message names the value).
        """
        counted = re.fullmatch(r"\s*(\d+)\s*runs?\s*", text)
        if counted:
            return cls(keep=int(counted.group(1)))
        try:
            return cls(older_than=duration_seconds(text))
        except ValueError:
            raise ValueError(
                f"retention {text!r}: give a duration (30d, 12h) or a number of runs (1000 runs)"
            ) from None


def prune(
    store: Store,
    *,
    before: float,
    statuses: Sequence[str] = tuple(sorted(TERMINAL)),
    keep: int | None = None,
    dry_run: bool = False,
    batch: int = BATCH,
    pause: float = PAUSE,
    actor: str | None = None,
) -> PruneResult:
    """Delete the runs in one of `statuses` (finished ones only) that finished before
    `before`, oldest first, but the newest `keep` of them; `actor` ran the prune (recorded
    with how far pruning went).

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
    runs = runs_table.c
    eligible = sa.and_(runs.status.in_(chosen), runs.finished_at < before)
    with store.read() as db:
        total = int(db.execute(sa.select(sa.func.count()).where(eligible)).scalar_one())
    total = max(0, total - (keep or 0))
    path = sqlite_path(store.url)
    size_before = _size(path)
    if dry_run or not total:
        return PruneResult(
            runs=total, before=before, statuses=chosen, dry_run=dry_run, bytes_before=size_before,
            bytes_after=size_before,
        )  # fmt: skip
    deleted = 0
    while deleted < total:
        with store.read() as db:
            found = db.execute(
                sa.select(runs.run_id)
                .where(eligible)
                .order_by(runs.finished_at, runs.run_id)
                .limit(min(batch, total - deleted))
            ).all()
        if not found:
            break
        deleted += _delete(store, [r.run_id for r in found], chosen)
        time.sleep(pause)
    with store.begin() as db:
        now = time.time()
        told = (("pruned_before", repr(before)), ("pruned_at", repr(now)), ("pruned_by", actor))
        for key, value in told:
            updated = db.execute(
                meta_table.update().where(meta_table.c.key == key).values(value=value or "")
            ).rowcount
            if not updated:
                db.execute(meta_table.insert().values(key=key, value=value or ""))
    if path is not None:
        _shrink(store)
    elif store.postgres:
        _vacuum(store)
    return PruneResult(
        runs=deleted, before=before, statuses=chosen, bytes_before=size_before,
        bytes_after=_size(path),
    )  # fmt: skip


def _delete(store: Store, run_ids: list[str], statuses: tuple[str, ...]) -> int:
    """Delete these runs (those still finished) and what is stored of them, in one commit."""
    runs = runs_table.c
    with store.begin() as db:
        gone = db.execute(
            runs_table.delete()
            .where(runs.run_id.in_(run_ids), runs.status.in_(statuses))
            .returning(runs.run_id, runs.attempt)
        ).all()
        ids = [r.run_id for r in gone]
        if not ids:
            return 0
        for table in (steps_table, events_table, approvals_table):
            db.execute(table.delete().where(table.c.run_id.in_(ids)))
        workflows = [workflow_id(r.run_id, n) for r in gone for n in range(1, r.attempt + 1)]
        for table, column in _dbos_tables(store, db):
            db.execute(table.delete().where(table.c[column].in_(workflows)))
    return len(ids)


_DBOS_TABLES: dict[str, list[tuple[sa.Table, str]]] = {}


def _dbos_tables(store: Store, db: sa.Connection) -> list[tuple[sa.Table, str]]:
    """DBOS's tables that hold rows of a workflow, and the column naming it; the workflows'
    own table last (the others refer to it)."""
    known = _DBOS_TABLES.get(store.url)
    if known is not None:
        return known
    schema = "dbos" if store.postgres else None
    inspector = sa.inspect(db)
    found: list[tuple[sa.Table, str]] = []
    last: list[tuple[sa.Table, str]] = []
    for name in inspector.get_table_names(schema=schema):
        if name in OURS:
            continue
        columns = {c["name"] for c in inspector.get_columns(name, schema=schema)}
        for column in ("workflow_uuid", "destination_uuid"):
            if column in columns:
                table = sa.Table(name, sa.MetaData(), sa.Column(column, sa.Text), schema=schema)
                (last if name == "workflow_status" else found).append((table, column))
                break
    _DBOS_TABLES[store.url] = found + last
    return found + last


def _shrink(store: Store) -> None:
    """Give an SQLite file's free pages back: a few thousand at a time where the store
    vacuums incrementally (stores made since pruning exists do), else with one full
    ``VACUUM`` (in WAL mode it cannot switch a store to incremental); then empty the
    write-ahead log."""
    with store.engine.connect() as raw:
        incremental = raw.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2
    # `executescript`: the driver's `execute` steps a vacuum once, a page.
    script = "PRAGMA incremental_vacuum(2000);" if incremental else "VACUUM;"
    while True:
        with store._turns, store.engine.connect() as raw:
            sqlite: Any = raw.connection.driver_connection
            sqlite.executescript(script)
            left = sqlite.execute("PRAGMA freelist_count").fetchone()[0]
            if not incremental or not left:
                sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                return
        time.sleep(PAUSE)


def _vacuum(store: Store) -> None:
    """Make the deleted rows' space reusable at once on Postgres (a plain ``VACUUM`` takes
    no lock writers wait on): autovacuum alone fell behind a retention that prunes every
    minute, and the database grew by the size of each pruned batch."""
    with store.engine.connect() as raw:
        with store.read() as db:
            tables = [t for t, _ in _dbos_tables(store, db)]
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


def history(store: Store) -> History:
    """How far the stored runs go back, and how far pruning went."""
    with store.read() as db:
        oldest = db.execute(sa.select(sa.func.min(runs_table.c.created_at))).scalar()
        meta = dict(
            db.execute(
                sa.select(meta_table.c.key, meta_table.c.value).where(
                    meta_table.c.key.in_(("pruned_before", "pruned_at", "pruned_by"))
                )
            ).all()
        )
    return History(
        oldest_at=oldest,
        pruned_before=float(meta["pruned_before"]) if "pruned_before" in meta else None,
        pruned_at=float(meta["pruned_at"]) if "pruned_at" in meta else None,
        pruned_by=meta.get("pruned_by") or None,
    )
