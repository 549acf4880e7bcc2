"""The run store's SQL, blocking: one SQLAlchemy engine per store, every state change one
transaction.

Every state change is a compare-and-set: a transaction starts with the conditional write
(``UPDATE ... WHERE status IN (...)`` or ``... WHERE epoch = ?``) and reads only after it,
so concurrent callers serialize on the run's row and exactly one wins, on SQLite (one writer;
a transaction that writes first never meets a stale snapshot) as on Postgres (the row lock,
and READ COMMITTED re-checks the condition). The holder of a run writes only under its
epoch: a worker that lost the run (declared dead, cancelled, a second worker with its id)
finds the epoch moved on and writes nothing.

SQLite runs in WAL mode with synchronous FULL (every commit fsynced); Postgres through psycopg.
`minions.runs._async` is the only caller that goes to a thread.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from minions.errors import IdempotencyConflictError, RunStateError, StoreError, UnknownRunError
from minions.runs._tables import (
    ACTIVE,
    HELD,
    MIGRATIONS,
    OURS,
    SCHEMA_VERSION,
    ApprovalRecord,
    RunFilter,
    RunRecord,
    StepRecord,
    WorkerRecord,
    approvals_table,
    events_table,
    meta_table,
    metadata,
    runs_table,
    step_cache_table,
    steps_table,
    workers_table,
)

__all__: list[str] = []

DEFAULT_URL = "sqlite:///./.minions/minions.db"
HEARTBEAT = float(os.environ.get("MINIONS_WORKER_HEARTBEAT", "2"))
"""Seconds between a worker's heartbeats (each renews the leases of the runs it holds)."""
DEAD_AFTER = float(os.environ.get("MINIONS_WORKER_DEAD_AFTER", "10"))
"""A worker silent this long is dead: its leases run out and a live worker takes its runs."""

Enqueue = Callable[[sa.Connection, str, int], None]
"""Queues attempt `n` of run `run_id` in the caller's transaction (DBOS's enqueue)."""
EventRow = tuple[int, str, str | None, str]
"""A stored event: its number, kind, step id and JSON."""


def dumps(value: Any) -> str:
    from minions._text import jsonable

    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))


def sqlalchemy_url(url: str) -> str:
    """A database URL as SQLAlchemy takes it (``postgresql://`` through psycopg 3)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    return Path(url.removeprefix("sqlite:///"))


def workflow_id(run_id: str, attempt: int) -> str:
    """The DBOS workflow of a run's attempt: the run id for the first, then ``RUN-2``..."""
    return run_id if attempt == 1 else f"{run_id}-{attempt}"


def describe(url: str) -> str:
    """The URL with any password hidden."""
    from minions._text import redact_url

    return redact_url(url)


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A worker's hold on a run: every write of the holder names its epoch."""

    run_id: str
    holder: str
    epoch: int
    attempt: int


class LeaseLost(Exception):
    """The run is no longer this holder's (its epoch moved on): the holder stands down."""


@dataclass(frozen=True, kw_only=True)
class Start:
    """What a worker needs to start (or go on with) a run it claimed, read in the claim."""

    lease: Lease
    record: RunRecord
    recipe_yaml: str
    recipe_path: str | None
    inputs: dict[str, Any]
    last_seq: int
    rerun: dict[str, Any] | None = None
    """For a rerun: its plan (the parent, the steps it reuses, the outputs set by hand)."""


ANY_RUN = RunFilter()
"""No filter: every run."""

Refusal = Literal["held", "stale", "ended"]
"""Why a claim was refused: another holder's lease is alive; the attempt is not the run's
current one (a stale delivery); the run has ended."""


class Store:
    """The tables of one database. `create`: make the database and its tables when missing
    (submitting and working do; reading never writes)."""

    def __init__(self, url: str = DEFAULT_URL, *, create: bool = False) -> None:
        self.url = url
        if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise StoreError(
                f"unsupported database URL {describe(url)!r}: use sqlite:///PATH or "
                "postgresql://USER:PASSWORD@HOST:PORT/DB"
            )
        path = sqlite_path(url)
        if path is not None:
            if not path.exists():
                if not create:
                    raise StoreError(
                        f"no run store at {str(path)!r}: nothing was submitted there yet "
                        "(set MINIONS_DATABASE_URL or --database-url to yours)"
                    )
                path.parent.mkdir(parents=True, exist_ok=True)
            self.engine = sa.create_engine(
                sqlalchemy_url(url), connect_args={"timeout": 30, "check_same_thread": False}
            )
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            # A session idle inside a transaction this long belongs to a process that froze
            # (or lost its network) between two statements: the server ends it, and the locks
            # it holds on a run go with it, or no other worker could take the run over.
            idle = f"-c idle_in_transaction_session_timeout={int(DEAD_AFTER * 1000)}"
            self.engine = sa.create_engine(
                sqlalchemy_url(url),
                connect_args={"connect_timeout": 10, "options": idle},
                # Connections are kept for as many threads as use them at once (a worker's
                # store threads, its heartbeat): SQLAlchemy's default keeps 5 and closes the
                # rest after each use, and a new connection is a new Postgres process
                # (Postgres spent 11.9 instead of 7.2 ms of CPU per W6b run, 8 at a time).
                pool_size=16,
                max_overflow=8,
            )
            sa.event.listen(self.engine, "checkout", _ping_if_idle)
        self.postgres = self.engine.dialect.name == "postgresql"
        # On Postgres a read, or a write of one statement, is its own transaction: one round
        # trip instead of three (BEGIN, the statement, COMMIT). Nothing is lost: under READ
        # COMMITTED each statement of a transaction sees its own snapshot anyway.
        self._single = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT") if self.postgres else None
        )
        self._turns = _SQLITE_TURNS.setdefault(
            str(path.resolve()) if path is not None else url, threading.RLock()
        )
        try:
            self._migrate(create)
        except sa.exc.OperationalError as exc:
            self.engine.dispose()
            raise StoreError(
                f"cannot use the run store {describe(url)!r}: {_detail(exc)}"
            ) from None
        except sa.exc.DatabaseError as exc:
            self.engine.dispose()
            raise StoreError(
                f"{describe(url)!r} is not a minions run store: {_detail(exc)}"
            ) from None

    def close(self) -> None:
        self.engine.dispose()

    # -- schema ------------------------------------------------------------------------------

    def _migrate(self, create: bool) -> None:
        with self.engine.begin() as db:
            if self.postgres:
                # Processes opening a new store at once (two workers started together) make
                # its tables one after the other: Postgres refused the second's types.
                db.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('minions_schema'))"))
            names = set(sa.inspect(db).get_table_names())
            if "minions_meta" not in names:
                if not create:
                    raise StoreError(
                        f"{describe(self.url)!r} is not a minions run store (it has no "
                        "minions tables; `minions submit` or `minions worker` make them)"
                    )
                metadata.create_all(db)
                db.execute(
                    meta_table.insert().values(key="schema_version", value=str(SCHEMA_VERSION))
                )
                return
            version = int(
                db.execute(
                    sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
                ).scalar_one()
            )
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the run store {describe(self.url)!r} has schema version {version}, made "
                    f"by a newer minions (this one knows {SCHEMA_VERSION}): upgrade minions"
                )
            if version < SCHEMA_VERSION:
                # One migration at a time, under a lock on the version row (Postgres) or the
                # write lock (SQLite): two processes opening an old store migrate it once.
                updated = db.execute(
                    meta_table.update()
                    .where(meta_table.c.key == "schema_version", meta_table.c.value == str(version))
                    .values(value=str(SCHEMA_VERSION))
                ).rowcount
                if updated:
                    for step in range(version, SCHEMA_VERSION):
                        MIGRATIONS[step](db)
            if OURS - names:  # tables added by this version: created empty
                metadata.create_all(db)

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """A write transaction. Its first statement must write (see the module's docstring)."""
        if self.postgres:
            with self.engine.begin() as db:
                yield db
            return
        # SQLite has one writer at a time, and a connection that finds the file locked backs
        # off in sleeps of up to 100 ms: this process's own transactions take turns here
        # instead (8 runs at a time went 5x faster).
        with self._turns, self.engine.begin() as db:
            yield db

    @contextmanager
    def statement(self) -> Iterator[sa.Connection]:
        """A write transaction of one statement (on Postgres, the statement's own)."""
        if self._single is None:
            with self.begin() as db:
                yield db
            return
        with self._single.connect() as db:
            yield db

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        """A read: it takes no turn (in WAL mode readers never wait for the writer); on
        Postgres each of its statements is a transaction of its own."""
        with (self.engine if self._single is None else self._single).connect() as db:
            yield db

    # -- submitting ----------------------------------------------------------------------------

    def insert_run(
        self,
        *,
        run_id: str,
        recipe_id: str,
        recipe_yaml: str,
        recipe_path: str | None,
        recipe_hash: str,
        inputs: Mapping[str, Any],
        idempotency_key: str | None,
        request_hash: str,
        enqueue: Enqueue,
        rerun: Mapping[str, Any] | None = None,
        steps: Sequence[Mapping[str, Any]] = (),
        actor: str | None = None,
    ) -> tuple[str, bool]:
        """Store a queued run and queue it, in one transaction: both happen or neither. With
        an idempotency key used before, the earlier run's id and False. `rerun`: the plan of
        a rerun (its ``parent_run_id`` and ``from_step`` are stored as columns too), and
        `steps` the checkpoints it starts with (the steps it reuses of its parent). `actor`:
        who queued it.

        Raises:
            IdempotencyConflictError: the key was used for another request.
        """
        row = queued_row(
            run_id=run_id,
            recipe_id=recipe_id,
            recipe_yaml=recipe_yaml,
            recipe_path=recipe_path,
            recipe_hash=recipe_hash,
            inputs=dumps(dict(inputs)),
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            queued_by=actor,
        )
        if rerun is not None:
            row.update(
                parent_run_id=rerun["parent_run_id"],
                from_step=rerun["from_step"],
                rerun=dumps(dict(rerun)),
            )
        with self.begin() as db:
            # Written first, and only when the key is new (a concurrent submission with the same
            # key waits on the row and then inserts nothing).
            inserted = db.execute(
                _insert_ignoring_conflicts(self.postgres, row).returning(runs_table.c.run_id)
            ).first()
            if inserted is not None:
                if steps:
                    db.execute(steps_table.insert(), [{**s, "run_id": run_id} for s in steps])
                enqueue(db, run_id, 1)
                return run_id, True
            found = db.execute(
                sa.select(runs_table.c.run_id, runs_table.c.request_hash).where(
                    runs_table.c.idempotency_key == idempotency_key
                )
            ).one()
        if found.request_hash is not None and found.request_hash != request_hash:
            assert idempotency_key is not None
            raise IdempotencyConflictError(idempotency_key, found.run_id)
        return str(found.run_id), False

    # -- reading -------------------------------------------------------------------------------

    def get_run(self, run_id: str, *, details: bool = True) -> RunRecord:
        """The run (with its finished steps and approvals when `details`).

        Raises:
            UnknownRunError: no run has this id.
        """
        with self.read() as db:
            row = _run_row(db, run_id)
            steps: tuple[StepRecord, ...] = ()
            approvals: tuple[ApprovalRecord, ...] = ()
            if details:
                steps = tuple(
                    _step_record(s)
                    for s in db.execute(
                        sa.select(steps_table)
                        .where(steps_table.c.run_id == run_id, steps_table.c.item.is_(None))
                        .order_by(steps_table.c.saved_at)
                    )
                )
                approvals = tuple(
                    _approval_record(a)
                    for a in db.execute(
                        sa.select(approvals_table)
                        .where(approvals_table.c.run_id == run_id)
                        .order_by(approvals_table.c.requested_at)
                    )
                )
        return _run_record(row, steps, approvals)

    def run_source(self, run_id: str) -> tuple[str, str | None, dict[str, Any]]:
        """The run's recipe YAML, the file it came from, and its inputs."""
        with self.read() as db:
            row = _run_row(db, run_id)
        return row.recipe_yaml, row.recipe_path, json.loads(row.inputs)

    def list_runs(
        self,
        which: RunFilter = ANY_RUN,
        *,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        schedule: str | None = None,
    ) -> list[RunRecord]:
        """Newest first; `before` (created_at, run_id) continues after a page's last run."""
        query = _filtered(sa.select(runs_table), which).order_by(
            runs_table.c.created_at.desc(), runs_table.c.run_id.desc()
        )
        if before is not None:
            created, run_id = before
            query = query.where(
                sa.or_(
                    runs_table.c.created_at < created,
                    sa.and_(runs_table.c.created_at == created, runs_table.c.run_id < run_id),
                )
            )
        with self.read() as db:
            return [_run_record(r, (), ()) for r in db.execute(query.limit(limit))]

    def count_runs(self, which: RunFilter = ANY_RUN) -> int:
        """How many runs `list_runs` gives with this filter, every page together."""
        query = _filtered(sa.select(sa.func.count()).select_from(runs_table), which)
        with self.read() as db:
            return int(db.execute(query).scalar_one())

    def head(self, run_id: str) -> tuple[str, int]:
        """The run's status and the number of its last stored event (one indexed read).

        Raises:
            UnknownRunError: no run has this id.
        """
        with self.read() as db:
            row = db.execute(
                sa.select(runs_table.c.status, runs_table.c.last_seq).where(
                    runs_table.c.run_id == run_id
                )
            ).one_or_none()
        if row is None:
            raise UnknownRunError(run_id)
        return str(row.status), int(row.last_seq)

    def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[str]:
        """The JSON of the run's stored events after number `after`, in order."""
        query = (
            sa.select(events_table.c.data)
            .where(events_table.c.run_id == run_id, events_table.c.seq > after)
            .order_by(events_table.c.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        with self.read() as db:
            return [row.data for row in db.execute(query)]

    def step_events(self, run_id: str, step_id: str) -> list[str]:
        """The JSON of the stored events of one step of the run (every visit) and of its loop
        items (``step[0]``, ``step[1]``...), in order."""
        query = (
            sa.select(events_table.c.data)
            .where(
                events_table.c.run_id == run_id,
                sa.or_(
                    events_table.c.step_id == step_id,
                    events_table.c.step_id.startswith(f"{step_id}[", autoescape=True),
                ),
            )
            .order_by(events_table.c.seq)
        )
        with self.read() as db:
            return [row.data for row in db.execute(query)]

    def saved_steps(self, run_id: str) -> dict[tuple[str, int], tuple[str, str | None]]:
        """Every finished step and loop item of the run, by name and visit, in the order they
        were saved (one query)."""
        with self.read() as db:
            rows = db.execute(
                sa.select(
                    steps_table.c.step_id,
                    steps_table.c.visit,
                    steps_table.c.execution,
                    steps_table.c.routing,
                )
                .where(steps_table.c.run_id == run_id)
                .order_by(steps_table.c.saved_at)
            )
            return {(r.step_id, r.visit): (r.execution, r.routing) for r in rows}

    def cached_step(self, key: str) -> tuple[str, Any, str | None, dict[str, int], float] | None:
        """The step cache's entry of `key`: (step id, output, next step, usage, made at)."""
        with self.read() as db:
            row = db.execute(
                sa.select(step_cache_table).where(step_cache_table.c.key == key)
            ).one_or_none()
        if row is None:
            return None
        return (
            row.step_id,
            json.loads(row.output),
            row.next_step,
            json.loads(row.usage),
            row.created_at,
        )

    def cache_step(
        self,
        key: str,
        *,
        step_id: str,
        output: Any,
        next_step: str | None,
        usage: Mapping[str, int],
        now: float,
    ) -> None:
        """Keep a step's output in the step cache under `key` (a newer one replaces it)."""
        values = {
            "key": key,
            "step_id": step_id,
            "output": dumps(output),
            "next_step": next_step,
            "usage": dumps(dict(usage)),
            "created_at": now,
        }
        if self.postgres:
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            statement: Any = pg_insert(step_cache_table).values(**values)
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            statement = sqlite_insert(step_cache_table).values(**values)
        statement = statement.on_conflict_do_update(
            index_elements=["key"], set_={k: v for k, v in values.items() if k != "key"}
        )
        with self.begin() as db:
            db.execute(statement)

    def announced(self, run_id: str) -> set[tuple[str, int]]:
        """The steps and loop items (name, visit) a rerun said it reused (its stored
        ``step_reused`` events)."""
        with self.read() as db:
            rows = db.execute(
                sa.select(events_table.c.step_id, events_table.c.data).where(
                    events_table.c.run_id == run_id, events_table.c.kind == "step_reused"
                )
            )
            return {(r.step_id, int(json.loads(r.data).get("visit", 1))) for r in rows}

    def approval(self, run_id: str, call_id: str) -> ApprovalRecord | None:
        with self.read() as db:
            row = db.execute(
                sa.select(approvals_table).where(
                    approvals_table.c.run_id == run_id, approvals_table.c.call_id == call_id
                )
            ).one_or_none()
        return None if row is None else _approval_record(row)

    def watch(self, run_id: str, workflow_id: str) -> tuple[int, bool, str | None]:
        """What the holder of a run watches while it runs: the run's epoch, whether a cancel
        was asked (here, or by an operator through DBOS: ``dbos workflow cancel``), and DBOS's
        status of the workflow (None when DBOS has no such workflow)."""
        dbos = _dbos_status_table(self.postgres)
        with self.read() as db:
            row = db.execute(
                sa.text(
                    "SELECT r.epoch, r.cancel_requested, w.status FROM minions_runs r "
                    f"LEFT JOIN {dbos} w ON w.workflow_uuid = :workflow WHERE r.run_id = :run"
                ),
                {"run": run_id, "workflow": workflow_id},
            ).one_or_none()
        if row is None:
            raise UnknownRunError(run_id)
        return int(row.epoch), bool(row.cancel_requested), row.status

    # -- the holder's writes -------------------------------------------------------------------

    def claim(
        self,
        run_id: str,
        *,
        attempt: int,
        holder: str,
        executor_id: str,
        lease_until: float,
        now: float,
    ) -> Start | Refusal:
        """Take the run for `holder`: attempt `attempt` is the current one, it has not ended,
        and nobody holds it (or the holder's lease ran out). A new epoch fences every earlier
        holder out."""
        with self.statement() as db:
            row = db.execute(
                _CLAIM,
                {
                    "run_id": run_id,
                    "attempt": attempt,
                    "holder": holder,
                    "lease_until": lease_until,
                    "executor_id": executor_id,
                    "now": now,
                },
            ).one_or_none()
        if row is None:
            with self.read() as db:
                found = _run_row(db, run_id)
            if found.status not in ACTIVE:
                return "ended"
            return "stale" if found.attempt != attempt else "held"
        return Start(
            lease=Lease(run_id=run_id, holder=holder, epoch=row.epoch, attempt=attempt),
            record=_run_record(row, (), ()),
            recipe_yaml=row.recipe_yaml,
            recipe_path=row.recipe_path,
            inputs=json.loads(row.inputs),
            last_seq=int(row.last_seq),
            rerun=_loads(row.rerun),
        )

    def append(
        self,
        lease: Lease,
        *,
        after: int,
        events: Sequence[EventRow],
        step: Mapping[str, Any] | None = None,
        run: Mapping[str, Any] | None = None,
    ) -> None:
        """Store the holder's events (numbered after `after`, the log's head it knows), a
        finished step and the run's new values, in one commit, if the lease still holds.

        A commit whose answer was lost (the connection dropped) may be tried again: one that
        was done already is recognized by the head it moved.

        Raises:
            LeaseLost: the run's epoch moved on: nothing was written.
        """
        new = events[-1][0] if events else after
        values = _encoded(dict(run or {}))
        if values.get("status") in ("completed", "failed", "cancelled"):
            values.update(holder=None, lease_until=None)
        values["last_seq"] = new
        rows = [(lease.run_id, seq, kind, step_id, data) for seq, kind, step_id, data in events]
        step_row = None if step is None else tuple(step[c] for c in _STEP_COLUMN_NAMES)
        step_row = None if step_row is None else (lease.run_id, *step_row)
        # On Postgres the commit is one statement (a transaction of its own) unless thousands
        # of events go in chunks.
        with self.statement() if len(rows) <= _CHUNK else self.begin() as db:
            # The step loop waits on this commit, so its statements go straight to the driver
            # (SQLAlchemy's compiled statements cost as much as the commit itself).
            cursor = db.connection.driver_connection.cursor()  # type: ignore[union-attr]
            try:
                if self.postgres:
                    done = _append_postgres(cursor, lease, after, values, rows, step_row)
                else:
                    done = _append_sqlite(cursor, lease, after, values, rows, step_row)
            finally:
                cursor.close()
        if not done:
            self._append_refused(lease, after=after, new=new)

    def _append_refused(self, lease: Lease, *, after: int, new: int) -> None:
        with self.read() as db:
            row = db.execute(
                sa.select(runs_table.c.epoch, runs_table.c.last_seq).where(
                    runs_table.c.run_id == lease.run_id
                )
            ).one_or_none()
        if row is None or row.epoch != lease.epoch:
            raise LeaseLost(lease.run_id)
        if row.last_seq == new and new > after:
            return  # this very commit went through before its answer was lost
        raise StoreError(
            f"the event log of run {lease.run_id} is at {row.last_seq}, not at {after} as its "
            "holder believes"
        )

    def set_held_status(self, lease: Lease, status: Literal["running", "waiting"]) -> None:
        """`running` <-> `waiting` (a call waits for a person), by the holder.

        Raises:
            LeaseLost: the run is no longer this holder's.
        """
        self._held_update(lease, status=status)

    def _held_update(self, lease: Lease, **values: Any) -> None:
        """Set `values` on the run while `lease` holds it (its epoch is the run's).

        Raises:
            LeaseLost: the run is no longer this holder's.
        """
        with self.statement() as db:
            updated = db.execute(
                runs_table.update()
                .where(
                    runs_table.c.run_id == lease.run_id,
                    runs_table.c.epoch == lease.epoch,
                    runs_table.c.status.in_(HELD),
                )
                .values(**values)
            ).rowcount
        if not updated:
            raise LeaseLost(lease.run_id)

    def request_approval(
        self,
        lease: Lease,
        *,
        call_id: str,
        step_id: str,
        tool: str,
        arguments: Any,
    ) -> ApprovalRecord:
        """Record a request once (a step run again asks the same call again), as the holder.

        Raises:
            LeaseLost: the run is no longer this holder's.
        """
        with self.begin() as db:
            fenced = db.execute(
                runs_table.update()
                .where(runs_table.c.run_id == lease.run_id, runs_table.c.epoch == lease.epoch)
                .values(epoch=runs_table.c.epoch)
            ).rowcount
            if not fenced:
                raise LeaseLost(lease.run_id)
            db.execute(
                _insert_ignoring_conflicts(
                    self.postgres,
                    {
                        "run_id": lease.run_id,
                        "call_id": call_id,
                        "step_id": step_id,
                        "tool": tool,
                        "arguments": dumps(arguments),
                        "requested_at": time.time(),
                    },
                    table=approvals_table,
                )
            )
            row = db.execute(
                sa.select(approvals_table).where(
                    approvals_table.c.run_id == lease.run_id, approvals_table.c.call_id == call_id
                )
            ).one()
        return _approval_record(row)

    def release(self, holder: str, run_ids: Sequence[str] = ()) -> None:
        """A stopping worker lets go of its runs (of `run_ids`, or all): any live worker takes
        them over at once, from their last checkpoint."""
        query = runs_table.update().where(
            runs_table.c.holder == holder, runs_table.c.status.in_(HELD)
        )
        if run_ids:
            query = query.where(runs_table.c.run_id.in_(list(run_ids)))
        with self.begin() as db:
            db.execute(query.values(lease_until=0.0))

    # -- the clients' state changes ------------------------------------------------------------

    def request_cancel(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        """Ask the run's holder to cancel it (compare-and-set: the run has not ended), for
        `actor`.

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run has ended already.
        """
        with self.begin() as db:
            updated = db.execute(
                runs_table.update()
                .where(runs_table.c.run_id == run_id, runs_table.c.status.in_(ACTIVE))
                .values(cancel_requested=True, cancelled_by=actor)
            ).rowcount
            row = _run_row(db, run_id)
        if not updated:
            raise RunStateError(
                f"run {run_id} is {row.status}: there is nothing to cancel", status=row.status
            )
        return _run_record(row, (), ())

    def end_unheld(
        self,
        run_id: str,
        *,
        status: Literal["cancelled", "failed"],
        error: str,
        event: Callable[[int], EventRow],
        when: Literal["queued", "unheld", "any"],
        now: float,
    ) -> bool:
        """End a run nobody is running (`when`: it is queued; or its holder's lease ran out;
        or whatever its holder is doing: the holder is fenced out), with its terminal event
        `event(seq)` appended after its log's head. True when this call ended it."""
        runs = runs_table.c
        condition: list[Any] = [runs.run_id == run_id, runs.status.in_(ACTIVE)]
        if when == "queued":
            condition.append(runs.status == "queued")
        elif when == "unheld":
            condition.append(
                sa.or_(
                    runs.status == "queued",
                    runs.holder.is_(None),
                    runs.lease_until.is_(None),
                    runs.lease_until < now,
                )
            )
        with self.begin() as db:
            row = db.execute(
                runs_table.update()
                .where(*condition)
                .values(
                    status=status,
                    error=error,
                    finished_at=now,
                    epoch=runs.epoch + 1,
                    holder=None,
                    lease_until=None,
                    last_seq=runs.last_seq + 1,
                )
                .returning(runs.last_seq)
            ).one_or_none()
            if row is None:
                return False
            seq, kind, step_id, data = event(int(row.last_seq))
            db.execute(
                events_table.insert().values(
                    run_id=run_id, seq=seq, kind=kind, step_id=step_id, data=data
                )
            )
            # The usage of the steps it finished (what a holder that ended it would have said
            # of them; the calls of a step in flight when it was fenced out are not known).
            usage = _usage_of_steps(db, run_id)
            db.execute(runs_table.update().where(runs.run_id == run_id).values(usage=dumps(usage)))
            self._notify(db, run_id)
        return True

    def requeue(
        self,
        run_id: str,
        *,
        statuses: Sequence[str],
        epoch: int | None,
        recovery: bool,
        enqueue: Enqueue,
        attempt: int | None = None,
        actor: str | None = None,
    ) -> RunRecord | None:
        """Queue the run's next attempt (compare-and-set: its status is one of `statuses`, its
        epoch is `epoch` and its current attempt `attempt` when given), and enqueue it in the
        same transaction; `actor` queued it (None: a worker, taking it over). None when the
        run was not in that state."""
        runs = runs_table.c
        condition = [runs.run_id == run_id, runs.status.in_(list(statuses))]
        if epoch is not None:
            condition.append(runs.epoch == epoch)
        if attempt is not None:
            condition.append(runs.attempt == attempt)
        values: dict[str, Any] = {
            "status": "queued",
            "attempt": runs.attempt + 1,
            "epoch": runs.epoch + 1,
            "holder": None,
            "lease_until": None,
            "cancel_requested": False,
            "finished_at": None,
            "error": None,
            "queued_by": actor,
            "cancelled_by": None,
        }
        if recovery:
            values["recoveries"] = runs.recoveries + 1
        with self.begin() as db:
            row = db.execute(
                runs_table.update().where(*condition).values(**values).returning(*runs_table.c)
            ).one_or_none()
            if row is None:
                return None
            enqueue(db, run_id, int(row.attempt))
        return _run_record(row, (), ())

    def decide(
        self,
        run_id: str,
        call_id: str,
        *,
        approved: bool,
        reason: str | None,
        actor: str | None = None,
    ) -> ApprovalRecord | None:
        """Decide a waiting call as `actor` (compare-and-set: undecided, and the run has not
        ended). None when it was decided already or the run ended."""
        with self.begin() as db:
            updated = db.execute(
                approvals_table.update()
                .where(
                    approvals_table.c.run_id == run_id,
                    approvals_table.c.call_id == call_id,
                    approvals_table.c.decided_at.is_(None),
                    sa.exists().where(
                        runs_table.c.run_id == run_id, runs_table.c.status.in_(ACTIVE)
                    ),
                )
                .values(decided_at=time.time(), approved=approved, reason=reason, decided_by=actor)
            ).rowcount
            if not updated:
                return None
            row = db.execute(
                sa.select(approvals_table).where(
                    approvals_table.c.run_id == run_id, approvals_table.c.call_id == call_id
                )
            ).one()
        return _approval_record(row)

    def _notify(self, db: sa.Connection, run_id: str) -> None:
        if self.postgres:
            db.execute(sa.text("SELECT pg_notify('minions_events', :run)"), {"run": run_id})

    # -- workers -------------------------------------------------------------------------------

    def register_worker(
        self, executor_id: str, *, incarnation: str, version: str, host: str, pid: int
    ) -> None:
        """This incarnation is the worker `executor_id` from now on (a crashed earlier one is
        replaced; see `Worker` for how a live one is told apart)."""
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
        }
        with self.begin() as db:
            updated = db.execute(
                workers_table.update()
                .where(workers_table.c.executor_id == executor_id)
                .values(**values)
            ).rowcount
            if not updated:
                db.execute(
                    _insert_ignoring_conflicts(
                        self.postgres, {"executor_id": executor_id, **values}, table=workers_table
                    )
                )

    def worker_row(self, executor_id: str) -> Any:
        with self.read() as db:
            return db.execute(
                sa.select(workers_table).where(workers_table.c.executor_id == executor_id)
            ).one_or_none()

    def heartbeat(
        self, executor_id: str, *, incarnation: str, runs: Sequence[str], lease_until: float
    ) -> set[str] | None:
        """Say this incarnation lives and renew the leases of the runs it runs: the runs among
        `runs` it still holds (their leases renewed). None when the worker's id belongs to
        another incarnation now (this one was declared dead, or a second worker took the id):
        it must stand down."""
        with self.begin() as db:
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
            if not runs:
                return set()
            mine = (
                runs_table.c.holder == incarnation,
                runs_table.c.run_id.in_(list(runs)),
                runs_table.c.status.in_(HELD),
            )
            db.execute(runs_table.update().where(*mine).values(lease_until=lease_until))
            return set(db.execute(sa.select(runs_table.c.run_id).where(*mine)).scalars())

    def renew(self, lease: Lease, *, lease_until: float) -> None:
        """Renew one lease, if it still holds (a holder unsure of it, before a side effect).

        Raises:
            LeaseLost: the run is no longer this holder's.
        """
        self._held_update(lease, lease_until=lease_until)

    def stopped(self, executor_id: str, *, incarnation: str) -> None:
        with self.begin() as db:
            db.execute(
                workers_table.update()
                .where(
                    workers_table.c.executor_id == executor_id,
                    workers_table.c.incarnation == incarnation,
                )
                .values(stopped_at=time.time(), runs="[]")
            )

    def room_elsewhere(self, executor_id: str, *, queue: str, places: int, now: float) -> bool:
        """Whether another live worker of the store has a place free: fewer than `places` of
        the queue's workflows handed to it and not finished (DBOS's count, which includes a
        run waiting in it for a place)."""
        dbos = _dbos_status_table(self.postgres)
        with self.read() as db:
            found = db.execute(
                sa.text(
                    "SELECT 1 FROM minions_workers w WHERE w.executor_id <> :me "
                    "AND w.stopped_at IS NULL AND w.heartbeat_at >= :alive "
                    f"AND (SELECT count(*) FROM {dbos} s WHERE s.executor_id = w.executor_id "
                    "AND s.queue_name = :queue AND s.status = 'PENDING') < :places LIMIT 1"
                ),
                {"me": executor_id, "alive": now - DEAD_AFTER, "queue": queue, "places": places},
            ).first()
        return found is not None

    def workers(self) -> list[WorkerRecord]:
        now = time.time()
        with self.read() as db:
            return [
                WorkerRecord(
                    executor_id=r.executor_id,
                    started_at=r.started_at,
                    heartbeat_at=r.heartbeat_at,
                    stopped_at=r.stopped_at,
                    version=r.version,
                    runs=json.loads(r.runs),
                    alive=r.stopped_at is None and now - r.heartbeat_at <= DEAD_AFTER,
                )
                for r in db.execute(sa.select(workers_table).order_by(workers_table.c.started_at))
            ]

    def expired(self, now: float) -> list[tuple[str, int, int]]:
        """Runs held by nobody alive: (run id, epoch, recoveries so far)."""
        runs = runs_table.c
        with self.read() as db:
            return [
                (r.run_id, r.epoch, r.recoveries)
                for r in db.execute(
                    sa.select(runs.run_id, runs.epoch, runs.recoveries).where(
                        runs.status.in_(HELD),
                        sa.or_(runs.lease_until.is_(None), runs.lease_until < now),
                    )
                )
            ]

    def queued_attempts(self, run_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """The current attempt and epoch of those of `run_ids` that are queued."""
        runs = runs_table.c
        with self.read() as db:
            return {
                r.run_id: (r.attempt, r.epoch)
                for r in db.execute(
                    sa.select(runs.run_id, runs.attempt, runs.epoch).where(
                        runs.run_id.in_(list(run_ids)), runs.status == "queued"
                    )
                )
            }


def queued_row(**values: Any) -> dict[str, Any]:
    """A new queued run's row: `values` (its ids, recipe, JSON inputs, keys) and the rest."""
    return {
        "status": "queued",
        "created_at": time.time(),
        "cancel_requested": False,
        "starts": 0,
        "epoch": 0,
        "attempt": 1,
        "recoveries": 0,
        "last_seq": 0,
        **values,
    }


# -- statements --------------------------------------------------------------------------------

_STEP_COLUMN_NAMES = ("step_id", "visit", "status", "execution", "routing", "saved_at", "item")
_EVENT_COLUMNS = "(run_id, seq, kind, step_id, data)"
_STEP_COLUMNS = "(run_id, step_id, visit, status, execution, routing, saved_at, item)"
_RUN_VALUES = frozenset(
    {"status", "finished_at", "output", "error", "usage", "last_seq", "holder", "lease_until"}
)


def _set_clause(values: Mapping[str, Any], placeholder: str) -> tuple[str, list[Any]]:
    unknown = set(values) - _RUN_VALUES
    if unknown:
        raise ValueError(f"not a run value a holder writes: {sorted(unknown)}")
    return ", ".join(f"{k} = {placeholder}" for k in values), list(values.values())


def _append_sqlite(
    cursor: Any,
    lease: Lease,
    after: int,
    values: Mapping[str, Any],
    rows: Sequence[tuple[Any, ...]],
    step_row: tuple[Any, ...] | None,
) -> bool:
    clause, params = _set_clause(values, "?")
    cursor.execute(
        f"UPDATE minions_runs SET {clause} WHERE run_id = ? AND epoch = ? AND last_seq = ?",
        [*params, lease.run_id, lease.epoch, after],
    )
    if cursor.rowcount != 1:
        return False
    if rows:
        cursor.executemany(
            f"INSERT INTO minions_events {_EVENT_COLUMNS} VALUES (?, ?, ?, ?, ?)", rows
        )
    if step_row is not None:
        cursor.execute(
            f"INSERT INTO minions_steps {_STEP_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", step_row
        )
    return True


_CHUNK = 1000
"""Events a statement inserts at most (a statement holds at most 65,535 parameters)."""


def _append_postgres(
    cursor: Any,
    lease: Lease,
    after: int,
    values: Mapping[str, Any],
    rows: Sequence[tuple[Any, ...]],
    step_row: tuple[Any, ...] | None,
) -> bool:
    # One statement, one round trip: the fenced update of the run, the inserts as data-modifying
    # CTEs that happen only when it did, and the notice to followers (they LISTEN, and learn of
    # new events at this commit).
    clause, params = _set_clause(values, "%s")
    parts = [
        f"r AS (UPDATE minions_runs SET {clause} WHERE run_id = %s AND epoch = %s "
        "AND last_seq = %s RETURNING 1)"
    ]
    params += [lease.run_id, lease.epoch, after]
    *before, last = [rows[i : i + _CHUNK] for i in range(0, len(rows), _CHUNK)] or [[]]
    if before:  # thousands of events at once (a big loop): a statement holds at most 65,535
        # parameters; the earlier chunks go first, fenced by the same condition
        cursor.execute(
            "SELECT 1 FROM minions_runs WHERE run_id = %s AND epoch = %s AND last_seq = %s "
            "FOR UPDATE",
            [lease.run_id, lease.epoch, after],
        )
        if cursor.fetchone() is None:
            return False
        for chunk in before:
            cursor.executemany(
                f"INSERT INTO minions_events {_EVENT_COLUMNS} VALUES (%s, %s, %s, %s, %s)", chunk
            )
    if last:
        typed = "(%s::text, %s::integer, %s::text, %s::text, %s::text)"
        parts.append(
            f"e AS (INSERT INTO minions_events {_EVENT_COLUMNS} SELECT * FROM (VALUES "
            f"{', '.join([typed] * len(last))}) AS v WHERE EXISTS (SELECT 1 FROM r))"
        )
        params += [value for row in last for value in row]
    if step_row is not None:
        parts.append(
            f"s AS (INSERT INTO minions_steps {_STEP_COLUMNS} SELECT %s::text, %s::text, "
            "%s::integer, %s::text, %s::text, %s::text, %s::double precision, %s::integer "
            "WHERE EXISTS (SELECT 1 FROM r))"
        )
        params += step_row
    params.append(lease.run_id)
    cursor.execute(
        f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM r), pg_notify('minions_events', %s)",
        params,
    )
    found = cursor.fetchone()
    return bool(found and found[0])


_ACTIVE_SQL = ", ".join(f"'{status}'" for status in ACTIVE)
_CLAIM = sa.text(
    # Written out once (every run's start pays for it; SQLAlchemy's expression of it cost a
    # millisecond of CPU to build and compile each time). Never the same holder again: a
    # second delivery of a run its holder runs already would fence out the execution in
    # flight after its effects.
    "UPDATE minions_runs SET holder = :holder, epoch = epoch + 1, lease_until = :lease_until, "
    "status = 'running', executor_id = :executor_id, "
    "started_at = coalesce(started_at, :now), starts = starts + 1, finished_at = NULL, "
    "error = NULL "
    f"WHERE run_id = :run_id AND attempt = :attempt AND status IN ({_ACTIVE_SQL}) "
    "AND (holder IS NULL OR lease_until IS NULL OR lease_until < :now) "
    f"RETURNING {', '.join(c.name for c in runs_table.c)}"
).columns(*runs_table.c)


def _insert_ignoring_conflicts(
    postgres: bool, values: Mapping[str, Any], *, table: sa.Table = runs_table
) -> Any:
    if postgres:
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).values(**values).on_conflict_do_nothing()
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).values(**values).on_conflict_do_nothing()


def _filtered(query: sa.Select[Any], which: RunFilter) -> sa.Select[Any]:
    """`query` on the runs table, narrowed to the runs `which` lets through."""
    if which.status is not None:
        query = query.where(runs_table.c.status == which.status)
    if which.recipe is not None:
        query = query.where(runs_table.c.recipe_id == which.recipe)
    if which.created_after is not None:
        query = query.where(runs_table.c.created_at >= which.created_after)
    if which.created_before is not None:
        query = query.where(runs_table.c.created_at < which.created_before)
    if which.id_prefix:
        query = query.where(runs_table.c.run_id.startswith(which.id_prefix, autoescape=True))
    if which.schedule is not None:
        query = query.where(runs_table.c.schedule == which.schedule)
    return query


def _dbos_status_table(postgres: bool) -> str:
    return "dbos.workflow_status" if postgres else "workflow_status"


def _usage_of_steps(db: sa.Connection, run_id: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for row in db.execute(
        sa.select(steps_table.c.execution).where(
            steps_table.c.run_id == run_id, steps_table.c.item.is_(None)
        )
    ):
        for key, value in json.loads(row.execution).get("usage", {}).items():
            total[key] = total.get(key, 0) + int(value)
    return total


_SQLITE_TURNS: dict[str, threading.RLock] = {}
"""One lock per SQLite file, shared by the stores of a process (a service and its worker)."""


def _detail(exc: sa.exc.DBAPIError) -> str:
    return str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)


def _run_row(db: sa.Connection, run_id: str) -> Any:
    """The run's row.

    Raises:
        UnknownRunError: no run has this id.
    """
    row = db.execute(sa.select(runs_table).where(runs_table.c.run_id == run_id)).one_or_none()
    if row is None:
        raise UnknownRunError(run_id)
    return row


def _encoded(values: dict[str, Any]) -> dict[str, Any]:
    """Run values as stored: the output and the usage as JSON text."""
    for key in ("output", "usage"):
        if key in values:
            values[key] = dumps(values[key])
    return values


IDLE_PING = 2.0
"""Seconds a pooled Postgres connection may rest before it is checked on its next use."""


def _ping_if_idle(connection: Any, record: Any, _proxy: Any) -> None:
    """Check a connection that rested (the server may have restarted or dropped it) before
    it is used; a busy one is not checked: a ping per checkout is a round trip per step."""
    now = time.monotonic()
    rested = now - record.info.get("used", now)
    record.info["used"] = now
    if rested <= IDLE_PING:
        return
    try:
        cursor = connection.cursor()
        cursor.execute("SELECT 1")
        cursor.close()
        connection.rollback()
    except Exception:
        raise sa.exc.DisconnectionError() from None  # the pool connects anew and retries


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    # Only a new file takes it (before its first table): pruning then gives pages back to the
    # file system a few at a time, instead of a VACUUM that stops every writer.
    cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _loads(text: str | None, default: Any = None) -> Any:
    return default if text is None else json.loads(text)


def _step_record(row: Any) -> StepRecord:
    return _execution_record(json.loads(row.execution), status=row.status)


def _execution_record(execution: dict[str, Any], *, status: str | None = None) -> StepRecord:
    """A stored execution (`StepExecution.to_data`) as a record; its loop items too."""
    items = execution.get("items", [])
    reused = execution.get("reused") or {}
    started, finished = execution.get("started_at"), execution.get("finished_at")
    return StepRecord(
        step_id=execution["step_id"],
        visit=execution.get("visit", 1),
        status=status or execution["status"],
        output=execution.get("output"),
        error=execution.get("error"),
        usage=execution.get("usage", {}),
        attempts=execution.get("attempts", 1),
        items=len(items),
        started_at=started,
        finished_at=finished,
        model_calls=execution.get("model_calls", 0),
        tool_calls=execution.get("tool_calls", 0),
        loop_items=tuple(_execution_record(item) for item in items),
        duration=None if started is None or finished is None else finished - started,
        reused_from=reused.get("run_id"),
        reused_usage=reused.get("usage", {}),
    )


def _approval_record(row: Any) -> ApprovalRecord:
    return ApprovalRecord(
        call_id=row.call_id,
        step_id=row.step_id,
        tool=row.tool,
        arguments=json.loads(row.arguments),
        requested_at=row.requested_at,
        decided_at=row.decided_at,
        approved=row.approved,
        reason=row.reason,
        decided_by=row.decided_by,
    )


def _run_record(
    row: Any, steps: tuple[StepRecord, ...], approvals: tuple[ApprovalRecord, ...]
) -> RunRecord:
    return RunRecord(
        run_id=row.run_id,
        recipe_id=row.recipe_id,
        status=row.status,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        inputs=_loads(row.inputs, {}),
        output=_loads(row.output),
        error=row.error,
        usage=_loads(row.usage, {}),
        recipe_path=row.recipe_path,
        recipe_hash=row.recipe_hash,
        executor_id=row.executor_id,
        cancel_requested=bool(row.cancel_requested),
        attempt=row.attempt,
        schedule=row.schedule,
        slot=row.slot,
        steps=steps,
        approvals=approvals,
        parent_run_id=row.parent_run_id,
        from_step=row.from_step,
        queued_by=row.queued_by,
        cancelled_by=row.cancelled_by,
    )
