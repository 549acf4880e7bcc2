"""What a worker shares with every other worker of its store about model endpoints: the
places of limited endpoints (`StoreLimiter`), and what each endpoint taught the
structured-output ladder (`StoreCapabilities`)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog

from minions.models import (
    CapabilityMemory,
    EndpointLimit,
    EndpointLimiter,
    EndpointWait,
    Evidence,
    Limits,
    Model,
    OutputMode,
)
from minions.models._internal import (
    DEFAULT_DEMOTE_RUNS,
    LineOfTurns,
    OnWait,
    Sleep,
    wait_for_change,
)
from minions.runs import _endpoints as sql
from minions.runs._async import AsyncDatabase

__all__: list[str] = []

log = structlog.get_logger(__name__)

POLL: tuple[float, float] = (0.02, 0.5)
"""The first and the longest pause between two looks at the store of a caller in line (a
place freed in this process wakes it at once)."""


class StoreLimiter(EndpointLimiter):
    """Holds the limits over every worker of a store.

    The callers of this process wait in line per entry of the limits (asyncio, first come
    first served); the first of them waits in the store's line with the first callers of the
    other processes. Places in flight are leases that the worker's heartbeat renews
    (`renew`): the places of a process that was killed are free once their lease runs out.

    Args:
        database: the worker's store's database.
        limits: the limits.
        holder: whose places these are (the worker's incarnation).
        lease: seconds a place stays in flight without a renewal.
        clock: the time in seconds, as every worker of the store sees it (`time.time`).
        sleep: waits seconds of `clock` (`asyncio.sleep`).
    """

    def __init__(
        self,
        database: AsyncDatabase,
        limits: Limits,
        *,
        holder: str,
        lease: float = 10.0,
        clock: Callable[[], float] = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        super().__init__(limits, clock=clock)
        self.database = database
        self.holder = holder
        self.lease = lease
        self.sleep = sleep
        self._held: set[str] = set()
        self._held_lock = threading.Lock()  # the heartbeat renews from the worker's thread
        self._turns = LineOfTurns()
        self._writes: set[asyncio.Task[None]] = set()

    async def _acquire(self, rule: EndpointLimit, tokens: int, on_wait: OnWait | None) -> Any:
        ticket = uuid.uuid4().hex
        turns = self._turns.of(rule.match)
        told = False

        def tell(wait: EndpointWait) -> None:
            nonlocal told
            if not told and on_wait is not None:
                told = True
                on_wait(wait)

        me = id(tell)
        if turns.line.locked():
            # Behind this process's own callers: a wait from its first moment, for the
            # reason the head of the line waits (told as soon as the head knows it).
            if turns.head is not None:
                tell(turns.head)
            else:
                turns.untold[me] = tell
        delay = POLL[0]
        try:
            async with turns.line:
                turns.untold.pop(me, None)
                try:
                    while True:
                        turns.changed.clear()
                        now = self.clock()
                        wait = await self.database.apply(
                            sql.take,
                            rule,
                            ticket=ticket,
                            holder=self.holder,
                            tokens=tokens,
                            now=now,
                            lease=self.lease,
                            line_ttl=max(10 * POLL[1], self.lease),
                            max_pause=self.limits.max_pause,
                        )
                        if wait is None:
                            with self._held_lock:
                                self._held.add(ticket)
                            return ticket
                        tell(wait)
                        turns.told_behind(wait)
                        pause = delay if wait.until is None else min(wait.until - now, POLL[1])
                        await wait_for_change(turns.changed, max(pause, 0.0), self.sleep)
                        delay = min(delay * 2, POLL[1])
                finally:
                    turns.head = None  # whoever comes next is told again
        except BaseException:
            turns.untold.pop(me, None)
            # Out of line (and its place given back if the store granted it as it was
            # cancelled), off the event loop's cancellation.
            self._write(sql.give_back, rule.match, ticket, None)
            raise

    def _release(self, rule: EndpointLimit, ticket: Any, tokens: int) -> None:
        with self._held_lock:
            self._held.discard(ticket)
        task = self._write(sql.give_back, rule.match, ticket, tokens)
        if task is not None:
            # The callers of this process waiting for the place look again once it is free.
            task.add_done_callback(lambda _: self._turns.wake(rule.match))

    def _pause(self, rule: EndpointLimit, seconds: float, *, by: str | None, asked: float) -> None:
        now = self.clock()
        self._write(
            functools.partial(sql.pause, by=by, asked=asked, now=now), rule.match, now + seconds
        )

    def _write(self, fn: Callable[..., None], *args: Any) -> asyncio.Task[None] | None:
        """`fn(database, *args)` in the store, without making the caller wait for it: a
        call's end must not wait for the database, nor be lost to its task's cancellation."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        task = loop.create_task(self._written(fn, *args))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _written(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            await self.database.apply(fn, *args)
        except Exception:
            log.exception("endpoint limits: a write to the store failed")

    def renew(self) -> None:
        """Keep this process's places in flight for another lease (blocking: the worker's
        heartbeat calls it from its own thread)."""
        with self._held_lock:
            held = sorted(self._held)
        sql.renew(self.database.database, held, self.clock() + self.lease)

    async def settle(self) -> None:
        """EndpointWait for the writes started so far (for tests and an orderly stop)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)


class StoreCapabilities:
    """What endpoints taught the structured-output ladder, kept in the store for every worker
    and every later run: a `CapabilityMemory` shared by the models of a worker, loaded from
    the store when a run starts (`refresh`) and written to it as it learns.

    A refusal on the wire is every run's at once; a mode a run's answers ignored is that
    run's own, and every run's once `demote_runs` distinct runs of any worker saw it ignored
    within `expiry` (each run's strike is kept in the store).

    Args:
        database: the worker's store's database.
        expiry: seconds a lesson is kept; an older one is learned again.
        demote_runs: the distinct runs whose answers must each ignore a mode before it is
            demoted for every run (`Limits.demote_after_runs`).
        clock: the time in seconds (`time.time`).
    """

    def __init__(
        self,
        database: AsyncDatabase,
        *,
        expiry: float,
        demote_runs: int = DEFAULT_DEMOTE_RUNS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.database = database
        self.expiry = expiry
        self.clock = clock
        self.memory = CapabilityMemory(demote_runs=demote_runs, clock=clock)
        self.memory.on_change = self._changed
        self.memory.on_strike = self._struck
        self._dirty: set[tuple[str, str]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._strikes: set[asyncio.Task[None]] = set()

    def _changed(self, key: tuple[str, str]) -> None:
        self._dirty.add(key)
        if self._flusher is not None and not self._flusher.done():
            return  # the writer at work writes this one too
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # learned outside an event loop: kept at once, blocking
            self._dirty.discard(key)
            sql.save_capability(self.database.database, key, *self._lesson(key))
            return
        self._flusher = loop.create_task(self._flush())

    def _lesson(self, key: tuple[str, str]) -> tuple[Any, ...]:
        rejected, worked = self.memory.learned(key)
        return rejected, worked, self.clock(), self.memory.evidence(key)

    async def _flush(self) -> None:
        """Write the endpoints that changed, one at a time, each as it is when written (so
        the last write of an endpoint is its latest lesson)."""
        while self._dirty:
            key = self._dirty.pop()
            try:
                await self.database.apply(sql.save_capability, key, *self._lesson(key))
            except Exception:
                log.exception("what an endpoint taught could not be kept", base_url=key[0])

    def _struck(self, key: tuple[str, str], mode: OutputMode, run: str) -> None:
        """A run's answers ignored `mode`: keep its strike, and demote the mode for every
        run when enough runs of every worker struck it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # outside a worker's loop: this process's own count decides
        task = loop.create_task(self._strike(key, mode, run))
        self._strikes.add(task)
        task.add_done_callback(self._strikes.discard)

    async def _strike(self, key: tuple[str, str], mode: OutputMode, run: str) -> None:
        now = self.clock()
        try:
            runs = await self.database.apply(
                sql.strike, key, mode, run, now=now, since=now - self.expiry
            )
        except Exception:
            log.exception("a run's strike of an output mode could not be kept", base_url=key[0])
            return
        if len(runs) >= self.memory.demote_runs:
            evidence = Evidence(
                cause="ignored",
                since=min(runs.values()),
                runs=tuple(sorted(runs, key=lambda run: runs[run])),
            )
            self.memory.demote(key, mode, evidence)

    async def settle(self) -> None:
        """Wait for the strikes and lessons being written (for tests and an orderly stop)."""
        while self._strikes:
            await asyncio.gather(*list(self._strikes), return_exceptions=True)
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def refresh(self) -> None:
        """Load what every worker learned (what this one is writing first)."""
        await self.settle()
        known = await self.database.apply(sql.capabilities, since=self.clock() - self.expiry)
        self.memory.load(
            {(c.base_url, c.model): (c.rejected, c.worked) for c in known},
            {(c.base_url, c.model): c.evidence for c in known},
        )


def share_capabilities(model: Any, memory: CapabilityMemory) -> None:
    """Make `model` (an `OpenAIChatModel`, or a model wrapping one) learn into `memory`."""
    while isinstance(model, Model):
        if isinstance(getattr(model, "capabilities", None), CapabilityMemory):
            model.capabilities = memory  # type: ignore[attr-defined]
            return
        model = getattr(model, "model", None)  # a wrapper's model (`RecordingModel`)
