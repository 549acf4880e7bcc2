"""The event log of runs: how a run is followed (its stored events, then new ones as they are
stored, until its end). What is stored, and what ends a log, is `minions.runs._events`.

One `EventLog` per store and process serves every follower: one feed per followed run reads
the store once for all of them, woken by the in-process worker's `LiveHub`, by Postgres
LISTEN/NOTIFY (one connection per process), or by a short poll. Token deltas are never
stored: followers in the worker's process get them live, through the hub, and followers of
any other process from the worker's `DeltaPublisher` (`minions.runs._streams`): on Postgres
on the same LISTEN connection, on SQLite through a FIFO of this process's own, open while it
follows a run.

A follower that falls more than `QUEUE_LIMIT` events behind its feed is given nothing more
(`_Mark.BEHIND`) until it has read what it missed from the store, from its last event; then
the feed gives it what it publishes again. A follower ends before its run does only when the
log stops (its store closes) or its feed fails (`_Mark.END`).

A database that goes away (it restarts, refuses connections, stays locked) is waited out by
every read of a follow once it has started, the feed's and each follower's own (`_waiting_out`):
they read on where they were once it is back. A feed that fails otherwise (a damaged store,
a bug) is logged once, ends each of its followers with a `StoreError` that names the run, and
is gone: the next follower of the run starts a feed of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Concatenate, ParamSpec, TypeVar

from minions._fold import TERMINAL_KINDS
from minions._log import configured_logger
from minions.errors import MinionsError, StoreError
from minions.events import Event
from minions.runs import _events as events
from minions.runs import _runs as runs
from minions.runs import _streams as streams
from minions.runs._async import AsyncDatabase
from minions.runs._db import DamagedStoreError, Database
from minions.runs._tables import TERMINAL

__all__ = ["EventLog", "LiveHub"]

PAGE = 500
QUEUE_LIMIT = 10_000
"""Events a follower may fall behind its feed by; a slower one reads what it missed from the
store, then from its feed again."""
LISTEN_WAIT = 5.0
"""Seconds a new follower waits at most for the LISTEN connection (Postgres)."""

P = ParamSpec("P")
T = TypeVar("T")


async def _waiting_out(read: Callable[[], Awaitable[T]], pause: Callable[[], Awaitable[None]]) -> T:
    """`read()`, again after each `pause()` while the database is away (it restarts, it
    stopped a while, it stays locked past its busy wait), until it is back: a follower waits,
    and reads on where it was (it used to be ended, as if the run had, or to fail). A
    damaged store is no outage: it raises."""
    while True:
        try:
            return await read()
        except DamagedStoreError:
            raise
        except StoreError:
            await pause()


def _what(cause: BaseException) -> str:
    """What went wrong, in a line: minions' own errors say it, others by their type too."""
    said = str(cause).strip()
    if isinstance(cause, MinionsError) and said:
        return said
    return f"{type(cause).__name__}: {said}" if said else type(cause).__name__


def _failure(run_id: str, cause: BaseException) -> StoreError:
    """What a follower of `run_id` raises when the run's feed failed with `cause`."""
    return StoreError(f"following run {run_id!r} failed: {_what(cause)}")


class LiveHub:
    """In-process subscribers of runs' events as they are emitted, token deltas included
    (which are never stored): a service with a worker in its own process streams them live.
    Thread-safe enough for one publisher thread and callbacks that hand over to a loop."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Callable[[Event], None]]] = {}
        self.origin = uuid.uuid4().hex[:12]
        """What the token deltas of this process's worker say they come from (sent to other
        processes too): the followers here get them through the hub, not twice."""

    def subscribe(self, run_id: str, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call `callback` with each event of the run; returns the unsubscribe function."""
        self._subscribers.setdefault(run_id, []).append(callback)

        def unsubscribe() -> None:
            callbacks = self._subscribers.get(run_id, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._subscribers.pop(run_id, None)

        return unsubscribe

    def publish(self, event: Event) -> None:
        for callback in list(self._subscribers.get(event.run_id, ())):
            callback(event)

    def subscriptions(self) -> int:
        return sum(len(c) for c in self._subscribers.values())


class _Mark(enum.Enum):
    """What a follower's queue says besides events."""

    BEHIND = "behind"
    """The follower fell more than `QUEUE_LIMIT` events behind its feed: nothing more was
    put in its queue after this. It reads what it missed from the store, and goes on."""
    END = "end"
    """The follower must stop: the log stops (its store closes), or the feed failed
    (`_Subscription.failure`)."""


@dataclass(eq=False)
class _Subscription:
    queue: asyncio.Queue[Event | _Mark] = field(default_factory=lambda: asyncio.Queue(QUEUE_LIMIT))
    behind: bool = False
    """It fell behind (`_Mark.BEHIND` is in its queue): the feed puts nothing in it until the
    follower reads again (`rejoin`)."""
    ended: bool = False
    """`_Mark.END` is in its queue: it stops there (a follower behind reads nothing more)."""
    failure: BaseException | None = None
    """What the feed failed with, once it has (the follower raises `StoreError` from it)."""

    def offer(self, event: Event) -> None:
        """`event` for the follower, unless it fell behind (it reads the stored ones again)."""
        if self.behind:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.behind = True
            self._last(_Mark.BEHIND)

    def rejoin(self) -> None:
        """The follower reads again: the feed puts what it publishes from now on in its queue
        (the follower reads what came meanwhile from the store)."""
        self.behind = False

    def end(self, failure: BaseException | None = None) -> None:
        """Tell the follower to stop (`failure`: with an error)."""
        self.ended, self.failure = True, failure
        self._last(_Mark.END)

    def _last(self, mark: _Mark) -> None:
        """`mark` in the queue even when it is full: its oldest event makes room (the follower
        reads what it missed from the store)."""
        try:
            self.queue.put_nowait(mark)
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
            self.queue.put_nowait(mark)


class _Feed:
    def __init__(self, log: EventLog, run_id: str) -> None:
        self.log = log
        self.run_id = run_id
        self.last = 0
        self.expected = 0
        self.expected_at = 0.0
        """The highest number the hub told of (it may not be stored yet), and when."""
        self.subscribers: set[_Subscription] = set()
        self.deltas: list[Event] = []
        """Token deltas that arrived before the stored event they follow."""
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.unsubscribe_hub: Callable[[], None] | None = None
        self.failure: BaseException | None = None
        """What the feed failed with (None: it has not, or it stopped)."""

    def publish(self, event: Event) -> None:
        for subscription in list(self.subscribers):
            subscription.offer(event)

    def on_live(self, event: Event) -> None:
        """From the hub, in the event loop's thread."""
        if event.kind == "token_delta":
            # A delta follows the stored event it carries the number of (its model call's
            # start): held until that event is published, so followers read them in order.
            # One that comes after a later event (a worker's stream lagging behind its
            # commits) is dropped: its call's answer is stored already, and a follower that
            # resumes from the number of what it read last must never go back.
            if event.seq == self.last:
                self.publish(event)
            elif event.seq < self.last:
                return
            elif len(self.deltas) < QUEUE_LIMIT:
                self.deltas.append(event)
            return
        if self.log.notified:
            return  # Postgres tells of the commit itself: no need to look before it
        self.expected = max(self.expected, event.seq)
        self.expected_at = time.monotonic()
        self.wake.set()

    async def pause(self) -> None:
        """Until the feed is woken, or for the time between two reads."""
        # The hub told of an event still on its way to the store: look again soon (for a
        # while: a worker that stopped before its commit never stores it).
        soon = self.expected > self.last and time.monotonic() - self.expected_at < 2
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.01 if soon else self.log.poll):
                await self.wake.wait()
        self.wake.clear()

    async def run(self) -> None:
        database = self.log.database
        try:
            head = await _waiting_out(lambda: database.apply(runs.head, self.run_id), self.pause)
            self.last = head.last_seq
            self.ready.set()
            while self.subscribers:
                # Cleared before the read: a wake-up during the read is not lost.
                self.wake.clear()
                batch = await _waiting_out(
                    lambda: database.apply(events.after, self.run_id, after=self.last, limit=PAGE),
                    self.pause,
                )
                for event in batch:
                    self.last = event.seq
                    self.publish(event)
                    while self.deltas and self.deltas[0].seq <= self.last:
                        self.publish(self.deltas.pop(0))
                if not batch:
                    await self.pause()
        except Exception as exc:
            # Not an outage (that is waited out): a damaged store, a bug. Its followers end
            # with it, each with an error (they used to stop as if the run had ended), and
            # the next follower of the run starts a feed of its own.
            self.failure = exc
            log = configured_logger(__name__)
            if log is not None:  # the library logs only where the application set it up
                # A bug's traceback, once for all the followers; a damaged store says it all.
                traceback = {} if isinstance(exc, StoreError) else {"exc_info": exc}
                log.error(
                    "a followed run's feed failed: its followers end with an error",
                    run_id=self.run_id,
                    followers=len(self.subscribers),
                    error=_what(exc),
                    **traceback,
                )
        finally:
            self.ready.set()
            self.log._ended(self)


class EventLog:
    """The events of the runs of one store, for the followers of one process.

    Args:
        database: the store's database.
        hub: the live events of a worker in this process (None without one).
        poll: seconds between reads of a followed run's events when nothing woke its feed
            (on Postgres, a safety net under LISTEN/NOTIFY: at least 1 s).
    """

    def __init__(
        self, database: AsyncDatabase, *, hub: LiveHub | None = None, poll: float = 0.1
    ) -> None:
        self.database = database
        self.hub = hub
        self.notified = database.postgres
        """Woken by the database at each commit (Postgres LISTEN/NOTIFY)."""
        self.poll = max(poll, 1.0) if self.notified else poll
        self._feeds: dict[str, _Feed] = {}
        self._listener: asyncio.Task[None] | None = None
        self._fifo: streams.FifoReader | None = None
        self._listening_now = asyncio.Event()
        """The LISTEN connection listens (Postgres): token deltas reach this process."""
        self._pinned = False
        self.origin = hub.origin if hub is not None else uuid.uuid4().hex[:12]
        """The name in this process's follow notes (its hub's: the worker in this process
        sends nothing for the followers here, who get its deltas through the hub)."""
        self._announcer: asyncio.Task[None] | None = None
        self._announced: set[str] = set()
        """The runs the workers were last told this process follows (Postgres)."""
        self._announce = asyncio.Event()
        """Wakes the announcer: a run followed or left, or a worker asked."""
        self._told = asyncio.Condition()
        """Notified after each of the announcer's rounds."""
        self._asked = True
        """Tell the workers of every run followed (not only of the new ones) next round."""
        self._closing = False
        self._quieting: asyncio.Event | None = None
        """Set once the LISTEN connection being closed now is closed (None: none is)."""

    async def start(self) -> None:
        """Keep the LISTEN connection open until `stop` (a service); followers start it
        themselves otherwise, and the last one to leave closes it."""
        self._pinned = True
        self._listen()

    async def stop(self) -> None:
        self._pinned = False
        for feed in list(self._feeds.values()):
            if feed.task is not None:
                feed.task.cancel()
                await asyncio.gather(feed.task, return_exceptions=True)
        await self._unlisten()

    def feeds(self) -> int:
        """Runs followed now (each with one feed, whatever its followers)."""
        return len(self._feeds)

    def followers(self) -> int:
        """Followers now, of every run (those of a run share its feed)."""
        return sum(len(feed.subscribers) for feed in self._feeds.values())

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The run's stored events after number `after`, then new ones as they are stored
        (and its token deltas, from the worker of any process), until the terminal event that
        ends it: the last of a run that has ended. A run resumed after failing goes on after
        its `run_failed`, and so does the follower.

        A token delta carries the number of the stored event before it, and none comes
        after a later stored event (text that lags behind its call's end is dropped): the
        number of the last event received, delta or not, is always a place to resume from.

        A follower that falls more than `QUEUE_LIMIT` events behind the run (its caller
        reads slower than the run's events come) reads what it missed from the store, from
        the last event it gave, then follows on: every event once, in order, to the end.

        Once the follow has started, a database that goes away (it restarts, refuses
        connections, stays locked) is waited for: the follow goes on where it was once the
        database is back. It ends before the run's end only when the log stops (its store
        closes), or with an error.

        Raises:
            UnknownRunError: no run has this id.
            StoreError: the store cannot be used as the follow starts, or is damaged; or
                the run's feed failed (the message names the run and says what went wrong,
                and the error is chained to the cause).
        """
        head = await self.database.apply(runs.head, run_id)
        if head.status in TERMINAL and head.last_seq <= after:
            return  # the follower has seen the end already
        async with self._subscribe(run_id) as subscription:
            while True:
                # What is stored after `after`: at the start, and again after the follower
                # fell behind. The feed publishes what comes after (its start, or the
                # follower's rejoin) to its queue, so nothing falls between the two; a
                # duplicate is dropped by its number.
                while True:
                    batch = await self._read(events.after, run_id, after=after, limit=PAGE)
                    for event in batch:
                        after = event.seq
                        yield event
                        if await self.ends(event):
                            return
                    if len(batch) < PAGE:
                        break
                head = await self._read(runs.head, run_id)
                if head.status in TERMINAL and head.last_seq <= after:
                    return
                while True:
                    received = await subscription.queue.get()
                    if received is _Mark.END:
                        if subscription.failure is not None:
                            raise _failure(run_id, subscription.failure) from subscription.failure
                        return  # the log stops: a follower resumes from `after`
                    if received is _Mark.BEHIND:
                        if subscription.ended:
                            continue  # it stops (`_Mark.END` comes next): nothing to catch up
                        subscription.rejoin()
                        break  # what it missed is read from the store
                    event = received
                    if event.kind == "token_delta":
                        if event.seq >= after:  # not the text of a call it has seen end
                            yield event
                        continue
                    if event.seq <= after:
                        if await self.ends(event):
                            return  # the follower's position is past the run's end
                        continue
                    if event.seq > after + 1:  # never expected; read the gap from the store
                        for earlier in await self._read(
                            events.after, run_id, after=after, limit=event.seq - after - 1
                        ):
                            after = earlier.seq
                            yield earlier
                    after = event.seq
                    yield event
                    if await self.ends(event):
                        return

    async def ends(self, event: Event) -> bool:
        """Whether `event` ends its run's log: a terminal event, the last one, of a run that
        has ended (a run resumed after failing goes on after its `run_failed`)."""
        if event.kind not in TERMINAL_KINDS:
            return False
        head = await self._read(runs.head, event.run_id)
        return head.status in TERMINAL and head.last_seq == event.seq

    async def _read(
        self, fn: Callable[Concatenate[Database, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`fn` applied to the store for a follower, the database's outages waited out as
        its feed waits them out (trying again after `poll` seconds)."""
        return await _waiting_out(
            lambda: self.database.apply(fn, *args, **kwargs), lambda: asyncio.sleep(self.poll)
        )

    @contextlib.asynccontextmanager
    async def _subscribe(self, run_id: str) -> AsyncIterator[_Subscription]:
        while self._quieting is not None:
            # The last follower closes the LISTEN connection: one that comes meanwhile opens
            # it again once it is closed (it found it open, and followed on without it).
            await self._quieting.wait()
        self._listen()
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = _Feed(self, run_id)
            if self.hub is not None:
                loop = asyncio.get_running_loop()

                def live(event: Event, feed: _Feed = feed) -> None:
                    loop.call_soon_threadsafe(feed.on_live, event)

                feed.unsubscribe_hub = self.hub.subscribe(run_id, live)
        subscription = _Subscription()
        feed.subscribers.add(subscription)
        try:
            if feed.task is None:
                feed.task = asyncio.create_task(feed.run())
            await feed.ready.wait()
            if self.notified:
                # The deltas sent before the LISTEN would be lost (stored events are read
                # again once it listens), and the workers send none before they know the
                # run is followed; a database that does not answer is not waited for. (Not
                # `wait_for`: on Python 3.11 it loses a cancel that comes as its wait ends,
                # and a follower cancelled then would follow on, unread, for ever.)
                self._announce.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LISTEN_WAIT):
                        await self._announced_for(run_id)
            yield subscription
        finally:
            feed.subscribers.discard(subscription)
            if not feed.subscribers and feed.task is not None and not feed.task.done():
                # The last follower left: nobody reads this run now. A follower that comes
                # while the feed stops starts a feed of its own (it joined this one, and was
                # ended with it, as if the run had ended).
                self._forget(feed)
                feed.task.cancel()
                await asyncio.gather(feed.task, return_exceptions=True)
            if not self._feeds and not self._pinned:
                await self._unlisten()

    async def _announced_for(self, run_id: str) -> None:
        await self._listening_now.wait()
        async with self._told:
            await self._told.wait_for(
                lambda: run_id in self._announced or run_id not in self._feeds
            )

    def _forget(self, feed: _Feed) -> None:
        """No new follower joins `feed` (it stops)."""
        if self._feeds.get(feed.run_id) is feed:
            del self._feeds[feed.run_id]
            if self.notified:
                self._announce.set()  # the workers are told it is followed no more

    def _ended(self, feed: _Feed) -> None:
        self._forget(feed)
        if feed.unsubscribe_hub is not None:
            feed.unsubscribe_hub()
            feed.unsubscribe_hub = None
        for subscription in feed.subscribers:
            subscription.end(feed.failure)

    # -- LISTEN/NOTIFY -------------------------------------------------------------------------

    def _listen(self) -> None:
        if self.notified and self._listener is None:
            # Made with its listener, on the loop that follows now (a store may be followed
            # from one event loop, then from another).
            self._listening_now = asyncio.Event()
            self._announce = asyncio.Event()
            self._told = asyncio.Condition()
            self._asked, self._closing = True, False
            self._listener = asyncio.create_task(self._listening())
            self._announcer = asyncio.create_task(self._announcing())
        folder = streams.streams_folder(self.database.url)
        if folder is not None and self._fifo is None:
            try:
                self._fifo = streams.FifoReader(folder)
            except OSError:
                return  # a read-only folder: the followers here get no deltas from elsewhere
            asyncio.get_running_loop().add_reader(self._fifo.descriptor, self._read_fifo)

    async def _unlisten(self) -> None:
        if self._quieting is not None:
            await self._quieting.wait()  # another caller closes it
            return
        quieting = self._quieting = asyncio.Event()
        try:
            await self._close_listening()
        finally:
            self._quieting = None
            quieting.set()

    async def _close_listening(self) -> None:
        announcer, self._announcer = self._announcer, None
        if announcer is not None:
            # Its last round tells the workers this process follows nothing now.
            self._closing = True
            self._announce.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LISTEN_WAIT):
                    await asyncio.shield(announcer)
            announcer.cancel()
            await asyncio.gather(announcer, return_exceptions=True)
            self._announced = set()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            self._listening_now.clear()
        fifo, self._fifo = self._fifo, None
        if fifo is not None:
            asyncio.get_running_loop().remove_reader(fifo.descriptor)
            fifo.close()

    def _read_fifo(self) -> None:
        if self._fifo is not None:
            for message in self._fifo.read():
                self._deltas(message)

    def _deltas(self, message: str) -> None:
        """Token deltas from a worker's process (`minions.runs._streams`), to the feed of
        their run if this process follows it."""
        if message == streams.ASK:
            self._asked = True  # a worker (re)connected: it is told what this process follows
            self._announce.set()
            return
        origin, _, rest = message.partition(" ")
        origin = origin.partition(".")[0]
        feed = self._feeds.get(rest.partition(" ")[0])
        if feed is None or (self.hub is not None and origin == self.hub.origin):
            return  # nobody follows the run here, or the hub told of them already
        decoded = streams.decode(message)
        if decoded is not None:
            for delta in decoded.deltas:
                feed.on_live(delta)

    async def _listening(self) -> None:
        """One LISTEN connection for the whole process; reconnects after a failure."""
        import psycopg

        while True:
            try:
                connection = await psycopg.AsyncConnection.connect(
                    self.database.url, autocommit=True, connect_timeout=10
                )
                async with connection:
                    await connection.execute("LISTEN minions_events")
                    await connection.execute(f"LISTEN {streams.CHANNEL}")
                    self._listening_now.set()
                    # Workers that asked while nobody listened are told what is followed.
                    self._asked = True
                    self._announce.set()
                    for feed in list(self._feeds.values()):
                        feed.wake.set()  # what was committed while nobody listened
                    async for note in connection.notifies():
                        if note.channel == streams.CHANNEL:
                            self._deltas(note.payload)
                            continue
                        woken = self._feeds.get(note.payload)
                        if woken is not None:
                            woken.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database went away: feeds poll until it is back
                self._listening_now.clear()
                await asyncio.sleep(1.0)

    async def _announcing(self) -> None:
        """Tells the store's workers which runs this process follows (Postgres): the new ones
        at once, all of them every `streams.REFRESH` seconds or when a worker asks, those
        left once left, and everything left when the log stops listening. Woken by
        `_announce` (the LISTEN connection sets it when it listens)."""
        refresh_at = 0.0
        while True:
            wait = max(0.0, refresh_at - time.monotonic()) if self._announced else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._announce.wait()
            self._announce.clear()
            if not self._closing and not self._listening_now.is_set():
                continue  # deltas sent now would not reach this process: told once it listens
            # A round started before the log began closing tells what was followed then: the
            # closing round (that tells everything left) comes after it.
            closing = self._closing
            wanted = set() if closing else set(self._feeds)
            now = time.monotonic()
            every = self._asked or now >= refresh_at
            notes = streams.follow_notes(
                self.origin, wanted if every else wanted - self._announced, self._announced - wanted
            )
            self._asked = False
            if notes:
                try:
                    await self.database.apply(streams.announce, notes)
                except Exception:  # the database is away: told again once it is back
                    if closing:
                        return
                    self._asked = True
                    await asyncio.sleep(1.0)
                    self._announce.set()
                    continue
            if every:
                refresh_at = now + streams.REFRESH
            self._announced = wanted
            async with self._told:
                self._told.notify_all()
            if closing:
                return
