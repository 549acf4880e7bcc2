"""The run store as async calls: the one place where minions goes to a thread for the database.

Each `AsyncStore` has threads of its own, so a service saturated with readers never makes its
worker's checkpoints wait behind them. A *patient* store (a worker's) waits out a database
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, ParamSpec, TypeVar

import sqlalchemy as sa
import structlog

from minions.errors import StoreError
from minions.events import Event, event_from_json
from minions.runs._db import describe, detail
from minions.runs._store import EventRow, Lease, Refusal, Start, Store
from minions.runs._tables import ApprovalRecord, RunFilter, RunRecord, WorkerRecord

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


class AsyncStore:
    """Async calls over a `Store`.

    Args:
        store: the blocking store.
        patient: try transient failures again, with backoff, until they pass (a worker);
            otherwise they raise `StoreError` at once.
        threads: the threads of this adapter.
    """

    def __init__(self, store: Store, *, patient: bool = False, threads: int = 4) -> None:
        self.store = store
        self.patient = patient
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="minions-store")
        self._outage: float | None = None

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def postgres(self) -> bool:
        return self.store.postgres

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()

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

    # -- reads -------------------------------------------------------------------------------

    async def get_run(self, run_id: str, *, details: bool = True) -> RunRecord:
        return await self.call(self.store.get_run, run_id, details=details)

    async def run_source(self, run_id: str) -> tuple[str, str | None, dict[str, Any]]:
        return await self.call(self.store.run_source, run_id)

    async def list_runs(
        self, which: RunFilter, *, limit: int, before: tuple[float, str] | None
    ) -> list[RunRecord]:
        return await self.call(self.store.list_runs, which, limit=limit, before=before)

    async def count_runs(self, which: RunFilter) -> int:
        return await self.call(self.store.count_runs, which)

    async def step_events(self, run_id: str, step_id: str) -> list[Event]:
        def read() -> list[Event]:
            return [event_from_json(data) for data in self.store.step_events(run_id, step_id)]

        return await self.call(read)

    async def head(self, run_id: str) -> tuple[str, int]:
        return await self.call(self.store.head, run_id)

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        def read() -> list[Event]:
            return [
                event_from_json(data)
                for data in self.store.events(run_id, after=after, limit=limit)
            ]

        return await self.call(read)

    async def announced(self, run_id: str) -> set[tuple[str, int]]:
        return await self.call(self.store.announced, run_id)

    async def saved_steps(self, run_id: str) -> dict[tuple[str, int], tuple[str, str | None]]:
        return await self.call(self.store.saved_steps, run_id)

    async def approval(self, run_id: str, call_id: str) -> ApprovalRecord | None:
        return await self.call(self.store.approval, run_id, call_id)

    async def watch(self, run_id: str, workflow_id: str) -> tuple[int, bool, str | None]:
        return await self.call(self.store.watch, run_id, workflow_id)

    async def workers(self) -> list[WorkerRecord]:
        return await self.call(self.store.workers)

    # -- writes ------------------------------------------------------------------------------

    async def claim(
        self,
        run_id: str,
        *,
        attempt: int,
        holder: str,
        executor_id: str,
        lease_until: float,
    ) -> Start | Refusal:
        return await self.call(
            self.store.claim,
            run_id,
            attempt=attempt,
            holder=holder,
            executor_id=executor_id,
            lease_until=lease_until,
            now=time.time(),
        )

    async def append(
        self,
        lease: Lease,
        *,
        after: int,
        events: Sequence[EventRow],
        step: dict[str, Any] | None = None,
        run: dict[str, Any] | None = None,
    ) -> None:
        await self.call(self.store.append, lease, after=after, events=events, step=step, run=run)

    async def renew(self, lease: Lease, *, lease_until: float) -> None:
        await self.call(self.store.renew, lease, lease_until=lease_until)

    async def set_held_status(self, lease: Lease, status: Literal["running", "waiting"]) -> None:
        await self.call(self.store.set_held_status, lease, status)

    async def request_approval(
        self, lease: Lease, *, call_id: str, step_id: str, tool: str, arguments: Any
    ) -> ApprovalRecord:
        return await self.call(
            self.store.request_approval,
            lease,
            call_id=call_id,
            step_id=step_id,
            tool=tool,
            arguments=arguments,
        )


def _dropped(exc: BaseException) -> bool:
    return isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
