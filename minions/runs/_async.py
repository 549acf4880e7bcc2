"""The run store's database as async calls: the one place where minions goes to a thread for
the database.

A room's function takes the `Database` first (``runs.get(database, run_id)``): blocking code
(a worker's heartbeat) calls it so, async code applies it here (``await
database.apply(runs.get, run_id)``), in one of the adapter's threads. Each `AsyncDatabase`
has threads of its own, so a service saturated with readers never makes its worker's
checkpoints wait behind them. A *patient* store (a worker's) waits out a database
that restarts, refuses connections, is locked or has a full disk: it tries again with backoff
until the write is done (a run pauses, and goes on where it was); an impatient one (the API's,
the CLI's) says `StoreError` at once.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
import structlog

from minions.errors import StoreError
from minions.runs._db import DamagedStoreError, Database, damage, describe, detail

__all__: list[str] = []

log = structlog.get_logger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

_SQLITE_TRANSIENT = ("locked", "busy", "full", "i/o error", "unable to open")


def transient(exc: BaseException) -> bool:
    """Whether `exc` says the database cannot be used *now* (it restarts, refuses
    connections, is locked, its disk is full, descriptors ran out), rather than that the
    request is wrong."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    original = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    if isinstance(original, sqlite3.OperationalError):
        return any(word in str(original).lower() for word in _SQLITE_TRANSIENT)
    if isinstance(exc, sa.exc.DisconnectionError | sa.exc.TimeoutError):
        return True
    if isinstance(original, OSError):
        return original.errno != errno.ENOENT
    try:
        import psycopg
    except ImportError:  # pragma: no cover - a dependency
        return False
    return isinstance(original, psycopg.OperationalError | psycopg.InterfaceError)


class AsyncDatabase:
    """Async calls over a `Database`.

    Args:
        database: the blocking database.
        patient: try transient failures again, with backoff, until they pass (a worker);
            otherwise they raise `StoreError` at once.
        threads: the threads of this adapter.
    """

    def __init__(self, database: Database, *, patient: bool = False, threads: int = 4) -> None:
        self.database = database
        self.patient = patient
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="minions-store")
        self._outage: float | None = None

    @property
    def url(self) -> str:
        return self.database.url

    @property
    def postgres(self) -> bool:
        return self.database.postgres

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.database.close()

    async def apply(
        self, fn: Callable[Concatenate[Database, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`fn(database, *args, **kwargs)` (a room's function) in one of this adapter's
        threads, as `call`."""
        return await self.call(functools.partial(fn, self.database, *args, **kwargs))

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` in one of this adapter's threads."""
        loop = asyncio.get_running_loop()
        bound = functools.partial(fn, *args, **kwargs)
        delay = 0.05
        retried = False
        while True:
            try:
                result = await loop.run_in_executor(self._pool, bound)
            except Exception as exc:
                damaged = damage(exc)
                if damaged is not None:
                    raise DamagedStoreError(
                        f"the run store {describe(self.url)} is damaged: {damaged}"
                    ) from None
                if not transient(exc):
                    raise
                if not retried and _dropped(exc):
                    # A pooled connection the server dropped (it restarted): the pool has
                    # let go of every such connection; a new one is made at once.
                    retried = True
                    continue
                if not self.patient:
                    raise StoreError(
                        f"the run store {describe(self.url)} cannot be used now: {detail(exc)}"
                    ) from None
                self._down(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if self._outage is not None:
                log.warning("run store back", after=round(time.monotonic() - self._outage, 1))
                self._outage = None
            return result

    def _down(self, exc: BaseException) -> None:
        if self._outage is None:
            self._outage = time.monotonic()
            log.warning("run store unavailable; trying again until it is back", error=detail(exc))


def _dropped(exc: BaseException) -> bool:
    return isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
