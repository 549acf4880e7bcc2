"""The database of a run store, blocking: one SQLAlchemy engine per store, its schema opened
(made, migrated), its transactions, and the dialect's statements every room shares.

Every state change is a compare-and-set: a transaction starts with the conditional write
(``UPDATE ... WHERE status IN (...)`` or ``... WHERE epoch = ?``) and reads only after it,
so concurrent callers serialize on the row and exactly one wins, on SQLite (one writer; a
transaction that writes first never meets a stale snapshot) as on Postgres (the row lock, and
READ COMMITTED re-checks the condition).

SQLite runs in WAL mode with synchronous FULL (every commit fsynced); Postgres through psycopg.
Each table has one room, a module of `minions.runs`, that owns its SQL and the type of what
it stores (`_queue` reads DBOS's tables; docs/architecture.md lists them all); a room's
functions take the `Database` first, and `minions.runs._async` is the only caller that goes
to a thread with them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from minions.errors import StoreError
from minions.runs._tables import MIGRATIONS, OURS, SCHEMA_VERSION, meta_table, metadata

__all__: list[str] = []

DEFAULT_URL = "sqlite:///./.minions/minions.db"
IDLE_PING = 2.0
"""Seconds a pooled Postgres connection may rest before it is checked on its next use."""
DEAD_AFTER = float(os.environ.get("MINIONS_WORKER_DEAD_AFTER", "10"))
"""A worker silent this long is dead: its leases run out and a live worker takes its runs; a
Postgres session idle this long inside a transaction is ended (its locks go with it)."""


SQLITE_BUSY_WAIT = 30.0
"""Seconds an SQLite connection waits for another's write lock before it fails."""


class Database:
    """The tables of one database. `create`: make the database and its tables when missing
    (submitting and working do; reading never writes).

    Raises:
        StoreError: the URL is not a supported database, the database cannot be reached, is
            not a minions store, or is newer than this minions.
    """

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
                sqlalchemy_url(url),
                connect_args={"timeout": SQLITE_BUSY_WAIT, "check_same_thread": False},
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
            raise StoreError(f"cannot use the run store {describe(url)!r}: {detail(exc)}") from None
        except sa.exc.DatabaseError as exc:
            self.engine.dispose()
            raise StoreError(
                f"{describe(url)!r} is not a minions run store: {detail(exc)}"
            ) from None

    def close(self) -> None:
        self.engine.dispose()

    # -- schema ------------------------------------------------------------------------------

    def _migrate(self, create: bool) -> None:
        if not self.postgres and self._current():
            return  # the common case, read without taking SQLite's write lock
        with self.engine.begin() as db:
            if self.postgres:
                # Processes opening a new store at once (two workers started together) make
                # its tables one after the other: Postgres refused the second's types.
                db.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('minions_schema'))"))
            else:
                # The same on SQLite: the driver commits each CREATE TABLE on its own unless a
                # transaction is open, so a process opening the store meanwhile saw tables
                # without their schema version ("damaged"), or made them twice. Its write lock,
                # taken first, makes the tables and their version one transaction, and the
                # others wait for it.
                db.exec_driver_sql("BEGIN IMMEDIATE")
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
            version = _schema_version(
                self.url,
                db.execute(
                    sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
                ).all(),
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

    def _current(self) -> bool:
        """Whether the (SQLite) store has every table of this version, at this version."""
        with self.engine.connect() as db:
            names = set(sa.inspect(db).get_table_names())
            if "minions_meta" not in names or OURS - names:
                return False
            versions = db.execute(
                sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
            ).scalars()
            return list(versions) == [str(SCHEMA_VERSION)]  # else: the locked path says why

    # -- transactions ------------------------------------------------------------------------

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

    @contextmanager
    def stream(self) -> Iterator[sa.Connection]:
        """A read whose rows come in a stream of `yield_per` rows (memory bounded): on
        Postgres a server-side cursor, which lives in a transaction (a read one: it locks
        nothing writers wait for)."""
        with self.engine.begin() if self.postgres else self.read() as db:
            yield db.execution_options(stream_results=True, yield_per=500)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """This process's turn at the SQLite file's write lock (what `begin` takes), for work
        outside a transaction that must not meet a writer of this process (a vacuum)."""
        with self._turns:
            yield

    # -- the dialect's statements ------------------------------------------------------------

    def insert_ignoring_conflicts(self, table: sa.Table, values: Mapping[str, Any]) -> Any:
        """``INSERT`` of a row that does nothing when a row with its key (or another unique
        value of it) is there already."""
        return _insert(self.postgres, table, values).on_conflict_do_nothing()

    def upsert(self, table: sa.Table, values: Mapping[str, Any], *, key: Sequence[str]) -> Any:
        """``INSERT`` of a row that replaces the values of the row with its `key`."""
        return _insert(self.postgres, table, values).on_conflict_do_update(
            index_elements=list(key), set_={k: v for k, v in values.items() if k not in key}
        )


# -- the meta table: the store's own values ------------------------------------------------------


def put_meta(db: sa.Connection, values: Sequence[tuple[str, str]]) -> None:
    """Keep each (key, value) of `values` in the meta table, in the caller's transaction
    (its first statements write: each key updated, or inserted when it is new)."""
    for key, value in values:
        updated = db.execute(
            meta_table.update().where(meta_table.c.key == key).values(value=value)
        ).rowcount
        if not updated:
            db.execute(meta_table.insert().values(key=key, value=value))


def meta(db: sa.Connection, keys: Sequence[str]) -> dict[str, str]:
    """The values the meta table keeps of `keys` (those it has)."""
    return dict(
        db.execute(
            sa.select(meta_table.c.key, meta_table.c.value).where(meta_table.c.key.in_(keys))
        ).all()
    )


def _insert(postgres: bool, table: sa.Table, values: Mapping[str, Any]) -> Any:
    if postgres:
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).values(**values)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).values(**values)


def dumps(value: Any) -> str:
    """`value` as the JSON text a column keeps (compact, UTF-8)."""
    from minions._text import jsonable

    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))


def loads(text: str | None, default: Any = None, *, what: str = "a stored value") -> Any:
    """The value of a JSON column (`default` for NULL).

    Raises:
        DamagedStoreError: the column holds text that is not JSON (`what` names it).
    """
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DamagedStoreError(f"{what}: not JSON ({exc})") from None


class DamagedStoreError(StoreError):
    """A row of the store holds what minions never writes (changed by hand, or by a disk
    that failed): the message names it."""


def damage(exc: BaseException) -> str | None:
    """What `exc` says is damaged in the store (``None``: it is no damage): a JSON column
    that is not JSON, a file SQLite cannot read as its own."""
    if isinstance(exc, DamagedStoreError):
        return str(exc)
    if isinstance(exc, json.JSONDecodeError):
        return f"a stored value is not JSON ({exc})"
    if isinstance(exc, sa.exc.DatabaseError):
        said = detail(exc)
        if any(
            sign in said
            for sign in ("malformed", "not a database", "Could not decode", "file is encrypted")
        ):
            return said
    return None


def _schema_version(url: str, rows: Sequence[Any]) -> int:
    """The store's schema version, from its meta rows.

    Raises:
        DamagedStoreError: there is none, or it is not a whole number.
    """
    if len(rows) != 1:
        raise DamagedStoreError(
            f"the run store {describe(url)!r} is damaged: minions_meta has no schema_version"
        )
    value = rows[0][0]
    try:
        return int(str(value).strip())
    except ValueError:
        raise DamagedStoreError(
            f"the run store {describe(url)!r} is damaged: its schema_version {str(value)[:40]!r} "
            "is not a whole number"
        ) from None


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


def detail(exc: BaseException) -> str:
    """The first line of what the database said."""
    original = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    text = str(original).strip().splitlines()
    return text[0] if text else type(original).__name__


_SQLITE_TURNS: dict[str, threading.RLock] = {}
"""One lock per SQLite file, shared by the stores of a process (a service and its worker)."""


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


def _wal(cursor: Any) -> None:
    """WAL mode (kept in the file: set once, by its first connection). SQLite answers "database
    is locked" at once, without waiting, to a connection that asks for it while another
    makes the file: it asks again, for as long as a busy connection would wait."""
    import sqlite3

    deadline = time.monotonic() + SQLITE_BUSY_WAIT
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    """A new connection's settings; none writes to a store that exists (a reader opens it
    while another process holds its write lock)."""
    cursor = connection.cursor()
    # Only a new file takes it (before its first table): pruning then gives pages back to the
    # file system a few at a time, instead of a VACUUM that stops every writer. Set on a file
    # that has pages, it opens a write transaction: every connection then waited for the
    # file's write lock, and a process frozen while it held it kept every reader out too.
    cursor.execute("PRAGMA page_count")
    if cursor.fetchone()[0] == 0:
        cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
    _wal(cursor)
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_WAIT * 1000)}")
    cursor.close()
