"""minions' own tables beside DBOS's: runs, their finished steps, the event log, approvals and
workers. JSON, never pickle; the CLI and the service read only these tables.

One SQLAlchemy engine per store. SQLite runs in WAL mode with synchronous FULL (every commit
fsynced); Postgres through psycopg. Blocking calls run in a worker thread for the async API.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from minions.errors import StoreError, UnknownRunError

__all__: list[str] = []


SCHEMA_VERSION = 1
DEFAULT_URL = "sqlite:///./.minions/minions.db"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
STATUSES = ("queued", "running", "waiting", "completed", "failed", "cancelled")


metadata = sa.MetaData()

meta_table = sa.Table(
    "minions_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
runs_table = sa.Table(
    "minions_runs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("recipe_id", sa.String(200), nullable=False, index=True),
    sa.Column("recipe_yaml", sa.Text, nullable=False),
    sa.Column("recipe_path", sa.Text, nullable=True),
    sa.Column("recipe_hash", sa.String(64), nullable=False),
    sa.Column("inputs", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("output", sa.Text, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("usage", sa.Text, nullable=True),
    sa.Column("idempotency_key", sa.String(200), nullable=True, unique=True),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, default=False),
    sa.Column("executor_id", sa.String(200), nullable=True),
    sa.Column("starts", sa.Integer, nullable=False, default=0),
)
steps_table = sa.Table(
    "minions_steps",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("step_id", sa.String(200), primary_key=True),
    sa.Column("visit", sa.Integer, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("execution", sa.Text, nullable=False),
    sa.Column("routing", sa.Text, nullable=True),
    sa.Column("saved_at", sa.Float, nullable=False),
)
events_table = sa.Table(
    "minions_events",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("kind", sa.String(40), nullable=False),
    sa.Column("step_id", sa.String(200), nullable=True),
    sa.Column("data", sa.Text, nullable=False),
)
approvals_table = sa.Table(
    "minions_approvals",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("call_id", sa.String(200), primary_key=True),
    sa.Column("step_id", sa.String(200), nullable=False),
    sa.Column("tool", sa.String(200), nullable=False),
    sa.Column("arguments", sa.Text, nullable=False),
    sa.Column("requested_at", sa.Float, nullable=False),
    sa.Column("decided_at", sa.Float, nullable=True),
    sa.Column("approved", sa.Boolean, nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
)
workers_table = sa.Table(
    "minions_workers",
    metadata,
    sa.Column("executor_id", sa.String(200), primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("stopped_at", sa.Float, nullable=True),
    sa.Column("version", sa.String(64), nullable=False),
    sa.Column("runs", sa.Text, nullable=False, default="[]"),
)
_OURS = {t.name for t in metadata.sorted_tables}


def dumps(value: Any) -> str:
    from minions._text import jsonable

    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """A finished step execution as stored: what `minions runs show` lists."""

    step_id: str
    visit: int
    status: str
    output: Any = None
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    attempts: int = 1
    items: int = 0


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A run as stored."""

    run_id: str
    recipe_id: str
    status: str
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    recipe_path: str | None = None
    recipe_hash: str = ""
    executor_id: str | None = None
    cancel_requested: bool = False
    steps: tuple[StepRecord, ...] = ()
    approvals: tuple[ApprovalRecord, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True, kw_only=True)
class ApprovalRecord:
    call_id: str
    step_id: str
    tool: str
    arguments: dict[str, Any]
    requested_at: float
    decided_at: float | None = None
    approved: bool | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerRecord:
    executor_id: str
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    version: str
    runs: list[str]


def sqlalchemy_url(url: str) -> str:
    """A database URL as SQLAlchemy takes it (``postgresql://`` through psycopg 3)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    return Path(url.removeprefix("sqlite:///"))


def describe(url: str) -> str:
    """The URL with any password hidden."""
    from minions._text import redact_url

    return redact_url(url)


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
            self.engine = sa.create_engine(
                sqlalchemy_url(url), connect_args={"connect_timeout": 10}
            )
            sa.event.listen(self.engine, "checkout", _ping_if_idle)
        self._postgres = self.engine.dialect.name == "postgresql"
        self._turns = _SQLITE_TURNS.setdefault(
            str(path.resolve()) if path is not None else url, threading.RLock()
        )
        try:
            self._migrate(create)
        except sa.exc.OperationalError as exc:
            self.engine.dispose()
            detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise StoreError(f"cannot use the run store {describe(url)!r}: {detail}") from None
        except sa.exc.DatabaseError as exc:
            self.engine.dispose()
            detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise StoreError(f"{describe(url)!r} is not a minions run store: {detail}") from None

    def close(self) -> None:
        self.engine.dispose()

    # -- schema ------------------------------------------------------------------------------

    def _migrate(self, create: bool) -> None:
        with self.engine.begin() as db:
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
            for step in range(version, SCHEMA_VERSION):
                _MIGRATIONS[step](db)
            if version < SCHEMA_VERSION:
                db.execute(
                    meta_table.update()
                    .where(meta_table.c.key == "schema_version")
                    .values(value=str(SCHEMA_VERSION))
                )
            if _OURS - names:  # tables added by this version: created empty
                metadata.create_all(db)

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        if self._postgres:
            with self.engine.begin() as db:
                yield db
            return
        # SQLite has one writer at a time, and a connection that finds the file locked backs
        # off in sleeps of up to 100 ms: this process's own transactions take turns here
        # instead (8 runs at a time went 5x faster).
        with self._turns, self.engine.begin() as db:
            yield db

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        """A read: it takes no turn (in WAL mode readers never wait for the writer)."""
        with self.engine.connect() as db:
            yield db

    # -- runs --------------------------------------------------------------------------------

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
    ) -> tuple[str, bool]:
        """Insert a queued run; with an idempotency key used before, the earlier run's id and
        False."""
        with self.begin() as db:
            if idempotency_key is not None:
                found = db.execute(
                    sa.select(runs_table.c.run_id).where(
                        runs_table.c.idempotency_key == idempotency_key
                    )
                ).scalar_one_or_none()
                if found is not None:
                    return str(found), False
            db.execute(
                runs_table.insert().values(
                    run_id=run_id,
                    recipe_id=recipe_id,
                    recipe_yaml=recipe_yaml,
                    recipe_path=recipe_path,
                    recipe_hash=recipe_hash,
                    inputs=dumps(dict(inputs)),
                    status="queued",
                    created_at=time.time(),
                    idempotency_key=idempotency_key,
                    cancel_requested=False,
                    starts=0,
                )
            )
        return run_id, True

    def update_run(self, run_id: str, **values: Any) -> None:
        values = _encoded(values)
        with self.begin() as db:
            db.execute(runs_table.update().where(runs_table.c.run_id == run_id).values(**values))

    def run_source(self, run_id: str) -> tuple[str, str | None, dict[str, Any]]:
        """The run's recipe YAML, the file it came from, and its inputs."""
        with self.read() as db:
            row = db.execute(
                sa.select(
                    runs_table.c.recipe_yaml, runs_table.c.recipe_path, runs_table.c.inputs
                ).where(runs_table.c.run_id == run_id)
            ).one_or_none()
        if row is None:
            raise UnknownRunError(run_id)
        return row.recipe_yaml, row.recipe_path, json.loads(row.inputs)

    def run_to_start(self, run_id: str) -> tuple[RunRecord, str, str | None, dict[str, Any], int]:
        """What a worker needs to start (or go on with) a run, in one read: the run, its
        recipe YAML and the file it came from, its inputs, and its last event's number."""
        with self.read() as db:
            row = _run_row(db, run_id)
            last = db.execute(
                sa.select(sa.func.max(events_table.c.seq)).where(events_table.c.run_id == run_id)
            ).scalar_one_or_none()
        record = _run_record(row, (), ())
        return record, row.recipe_yaml, row.recipe_path, json.loads(row.inputs), int(last or 0)

    def get_run(self, run_id: str, *, details: bool = True) -> RunRecord:
        with self.read() as db:
            row = _run_row(db, run_id)
            steps: tuple[StepRecord, ...] = ()
            approvals: tuple[ApprovalRecord, ...] = ()
            if details:
                steps = tuple(
                    _step_record(s)
                    for s in db.execute(
                        sa.select(steps_table)
                        .where(steps_table.c.run_id == run_id)
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

    def list_runs(
        self,
        *,
        status: str | None = None,
        recipe: str | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        """Newest first; `before` (created_at, run_id) continues after a page's last run."""
        query = sa.select(runs_table).order_by(
            runs_table.c.created_at.desc(), runs_table.c.run_id.desc()
        )
        if status is not None:
            query = query.where(runs_table.c.status == status)
        if recipe is not None:
            query = query.where(runs_table.c.recipe_id == recipe)
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

    # -- steps and events --------------------------------------------------------------------

    def last_seq(self, run_id: str) -> int:
        with self.read() as db:
            found = db.execute(
                sa.select(sa.func.max(events_table.c.seq)).where(events_table.c.run_id == run_id)
            ).scalar_one_or_none()
        return int(found or 0)

    def write(
        self,
        run_id: str,
        events: Sequence[Mapping[str, Any]],
        *,
        step: Mapping[str, Any] | None = None,
        run: Mapping[str, Any] | None = None,
    ) -> None:
        """Events, and a finished step, and a run update, in one transaction (one commit)."""
        if not events and step is None and run is None:
            return
        rows = [(run_id, e["seq"], e["kind"], e.get("step_id"), dumps(e)) for e in events]
        step_row = (
            None
            if step is None
            else (
                run_id,
                step["step_id"],
                step["visit"],
                step["status"],
                step["execution"],
                step["routing"],
                step["saved_at"],
            )
        )
        with self.begin() as db:
            # The step loop waits on this commit, so its statements go straight to the driver
            # (SQLAlchemy's compiled inserts cost as much as the commit itself).
            cursor = db.connection.driver_connection.cursor()  # type: ignore[union-attr]
            if self._postgres:
                # One statement, one round trip: the inserts as data-modifying CTEs, and the
                # notice to followers (they LISTEN, and learn of new events at this commit).
                parts, params = [], []
                *before, last = [rows[i : i + 1000] for i in range(0, len(rows), 1000)] or [[]]
                for chunk in before:  # thousands of events at once (a big loop): a statement
                    cursor.executemany(  # holds at most 65,535 parameters
                        f"INSERT INTO minions_events {_EVENT_COLUMNS} VALUES (%s, %s, %s, %s, %s)",
                        chunk,
                    )
                if last:
                    placeholders = ", ".join(["(%s, %s, %s, %s, %s)"] * len(last))
                    parts.append(
                        f"e AS (INSERT INTO minions_events {_EVENT_COLUMNS} VALUES {placeholders})"
                    )
                    params += [value for row in last for value in row]
                if step_row is not None:
                    parts.append(
                        f"s AS (INSERT INTO minions_steps {_STEP_COLUMNS} "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s))"
                    )
                    params += step_row
                if parts:
                    notify = "pg_notify('minions_events', %s)" if rows else "1"
                    params += [run_id] if rows else []
                    cursor.execute(f"WITH {', '.join(parts)} SELECT {notify}", params)
            else:
                if rows:
                    cursor.executemany(
                        f"INSERT INTO minions_events {_EVENT_COLUMNS} VALUES (?, ?, ?, ?, ?)", rows
                    )
                if step_row is not None:
                    cursor.execute(
                        f"INSERT INTO minions_steps {_STEP_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?)",
                        step_row,
                    )
            cursor.close()
            if run is not None:
                values = _encoded(dict(run))
                db.execute(
                    runs_table.update().where(runs_table.c.run_id == run_id).values(**values)
                )

    def saved_steps(self, run_id: str) -> dict[tuple[str, int], tuple[str, str | None]]:
        """Every finished step of the run, by step id and visit (one query, to resume)."""
        with self.read() as db:
            rows = db.execute(
                sa.select(
                    steps_table.c.step_id,
                    steps_table.c.visit,
                    steps_table.c.execution,
                    steps_table.c.routing,
                ).where(steps_table.c.run_id == run_id)
            )
            return {(r.step_id, r.visit): (r.execution, r.routing) for r in rows}

    def events(
        self, run_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        query = (
            sa.select(events_table.c.data)
            .where(events_table.c.run_id == run_id, events_table.c.seq > after)
            .order_by(events_table.c.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        with self.read() as db:
            return [json.loads(row.data) for row in db.execute(query)]

    # -- approvals ---------------------------------------------------------------------------

    def request_approval(
        self, run_id: str, *, call_id: str, step_id: str, tool: str, arguments: Any
    ) -> ApprovalRecord:
        """Record a request (once: a step run again asks the same call again)."""
        with self.begin() as db:
            row = db.execute(
                sa.select(approvals_table).where(
                    approvals_table.c.run_id == run_id, approvals_table.c.call_id == call_id
                )
            ).one_or_none()
            if row is None:
                db.execute(
                    approvals_table.insert().values(
                        run_id=run_id,
                        call_id=call_id,
                        step_id=step_id,
                        tool=tool,
                        arguments=dumps(arguments),
                        requested_at=time.time(),
                    )
                )
                row = db.execute(
                    sa.select(approvals_table).where(
                        approvals_table.c.run_id == run_id, approvals_table.c.call_id == call_id
                    )
                ).one()
        return _approval_record(row)

    def approval(self, run_id: str, call_id: str) -> ApprovalRecord | None:
        with self.read() as db:
            row = db.execute(
                sa.select(approvals_table).where(
                    approvals_table.c.run_id == run_id, approvals_table.c.call_id == call_id
                )
            ).one_or_none()
        return None if row is None else _approval_record(row)

    def decide(self, run_id: str, call_id: str, *, approved: bool, reason: str | None) -> None:
        with self.begin() as db:
            db.execute(
                approvals_table.update()
                .where(
                    approvals_table.c.run_id == run_id,
                    approvals_table.c.call_id == call_id,
                    approvals_table.c.decided_at.is_(None),
                )
                .values(decided_at=time.time(), approved=approved, reason=reason)
            )

    # -- workers -----------------------------------------------------------------------------

    def heartbeat(self, executor_id: str, *, version: str, runs: Sequence[str]) -> None:
        now = time.time()
        with self.begin() as db:
            updated = db.execute(
                workers_table.update()
                .where(workers_table.c.executor_id == executor_id)
                .values(heartbeat_at=now, runs=dumps(list(runs)), stopped_at=None)
            ).rowcount
            if not updated:
                db.execute(
                    workers_table.insert().values(
                        executor_id=executor_id,
                        started_at=now,
                        heartbeat_at=now,
                        version=version,
                        runs=dumps(list(runs)),
                    )
                )

    def stopped(self, executor_id: str) -> None:
        with self.begin() as db:
            db.execute(
                workers_table.update()
                .where(workers_table.c.executor_id == executor_id)
                .values(stopped_at=time.time(), runs="[]")
            )

    def workers(self) -> list[WorkerRecord]:
        with self.read() as db:
            return [
                WorkerRecord(
                    executor_id=r.executor_id,
                    started_at=r.started_at,
                    heartbeat_at=r.heartbeat_at,
                    stopped_at=r.stopped_at,
                    version=r.version,
                    runs=json.loads(r.runs),
                )
                for r in db.execute(sa.select(workers_table).order_by(workers_table.c.started_at))
            ]


_EVENT_COLUMNS = "(run_id, seq, kind, step_id, data)"
_STEP_COLUMNS = "(run_id, step_id, visit, status, execution, routing, saved_at)"

_SQLITE_TURNS: dict[str, threading.RLock] = {}
"""One lock per SQLite file, shared by the stores of a process (a service and its worker)."""


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
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _loads(text: str | None, default: Any = None) -> Any:
    return default if text is None else json.loads(text)


def _step_record(row: Any) -> StepRecord:
    execution = json.loads(row.execution)
    return StepRecord(
        step_id=row.step_id,
        visit=row.visit,
        status=row.status,
        output=execution.get("output"),
        error=execution.get("error"),
        usage=execution.get("usage", {}),
        attempts=execution.get("attempts", 1),
        items=len(execution.get("items", [])),
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
        steps=steps,
        approvals=approvals,
    )


_MIGRATIONS: dict[int, Any] = {}
"""Schema version n -> n+1 upgrades, each a function of a connection (none yet)."""
