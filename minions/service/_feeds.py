"""Runs' events for many streaming clients at once: one feed per followed run reads the store
once for all its subscribers, woken by the in-process worker's live hub, by Postgres
LISTEN/NOTIFY, or by a short poll; token deltas come from the hub only (they are never
stored)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from minions.runs._runner import LiveHub
from minions.runs._store import Store

__all__: list[str] = []

TERMINAL_KINDS = frozenset({"run_completed", "run_failed"})
QUEUE_LIMIT = 10_000
"""Events a subscriber may fall behind by; a slower client is dropped (it resumes)."""

END = {"kind": "__end__"}
"""Put in a subscriber's queue when it must stop (the feed ended or the client fell behind)."""


@dataclass(eq=False)
class Subscription:
    """One client's place in a feed: what the feed published since the client joined."""

    run_id: str
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=lambda: asyncio.Queue(QUEUE_LIMIT))

    def put(self, event: dict[str, Any]) -> bool:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            return False
        return True


class _Feed:
    def __init__(self, feeds: Feeds, run_id: str) -> None:
        self.feeds = feeds
        self.run_id = run_id
        self.last = 0
        self.expected = 0
        self.expected_at = 0.0
        """The highest sequence number the hub told of (it may not be stored yet)."""
        self.subscribers: set[Subscription] = set()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.unsubscribe_hub: Any = None

    def publish(self, event: dict[str, Any]) -> None:
        for subscription in list(self.subscribers):
            if not subscription.put(event):
                self.subscribers.discard(subscription)
                with contextlib.suppress(asyncio.QueueFull):
                    subscription.queue.get_nowait()
                subscription.queue.put_nowait(END)

    def on_live(self, event: dict[str, Any]) -> None:
        """From the hub, in the event loop's thread."""
        if event.get("kind") == "token_delta":
            self.publish(event)
            return
        if self.feeds.notified:
            return  # Postgres tells of the commit itself: no need to look before it
        self.expected = max(self.expected, int(event.get("seq", 0)))
        self.expected_at = time.monotonic()
        self.wake.set()

    async def run(self) -> None:
        store = self.feeds.store
        self.last = await asyncio.to_thread(store.last_seq, self.run_id)
        self.ready.set()
        poll = self.feeds.poll
        try:
            while self.subscribers:
                # Cleared before the read: a wake-up during the read is not lost.
                self.wake.clear()
                batch = await asyncio.to_thread(
                    store.events, self.run_id, after=self.last, limit=500
                )
                for event in batch:
                    self.last = event["seq"]
                    self.publish(event)
                if batch:
                    continue
                # The hub told of an event still on its way to the store: look again soon
                # (for a while: a worker that stopped before its commit never stores it).
                soon = self.expected > self.last and time.monotonic() - self.expected_at < 2
                timeout = 0.01 if soon else poll
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout)
        finally:
            self.feeds._ended(self)


class Feeds:
    """The feeds of one service process.

    Args:
        store: the run store's tables.
        hub: the in-process worker's live hub (None without one).
        poll: seconds between reads of a run's events when nothing woke its feed.
    """

    def __init__(self, store: Store, *, hub: LiveHub | None = None, poll: float = 0.1) -> None:
        self.store = store
        self.hub = hub
        self.poll = poll
        self._feeds: dict[str, _Feed] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: asyncio.Task[None] | None = None
        self.notified = False
        """Woken by the database at each commit (Postgres LISTEN/NOTIFY)."""

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.store.engine.dialect.name == "postgresql":
            self.poll = max(self.poll, 1.0)  # a safety net: NOTIFY wakes the feeds
            self.notified = True
            self._listener = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        for feed in list(self._feeds.values()):
            if feed.task is not None:
                feed.task.cancel()
                await asyncio.gather(feed.task, return_exceptions=True)

    async def _listen(self) -> None:
        """One LISTEN connection for the whole process; reconnects after a failure."""
        import psycopg

        url = self.store.url
        while True:
            try:
                connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
                async with connection:
                    await connection.execute("LISTEN minions_events")
                    async for note in connection.notifies():
                        feed = self._feeds.get(note.payload)
                        if feed is not None:
                            feed.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database went away: feeds poll until it is back
                await asyncio.sleep(1.0)

    @contextlib.asynccontextmanager
    async def subscribe(self, run_id: str) -> AsyncIterator[Subscription]:
        """A subscription to everything stored after the feed's position when it was made,
        and to the run's token deltas."""
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = _Feed(self, run_id)
            if self.hub is not None and self._loop is not None:
                loop = self._loop

                def live(event: dict[str, Any], feed: _Feed = feed) -> None:
                    loop.call_soon_threadsafe(feed.on_live, event)

                feed.unsubscribe_hub = self.hub.subscribe(run_id, live)
        subscription = Subscription(run_id)
        feed.subscribers.add(subscription)
        if feed.task is None:
            feed.task = asyncio.create_task(feed.run())
        await feed.ready.wait()
        try:
            yield subscription
        finally:
            feed.subscribers.discard(subscription)

    def _ended(self, feed: _Feed) -> None:
        if self._feeds.get(feed.run_id) is feed:
            del self._feeds[feed.run_id]
        if feed.unsubscribe_hub is not None:
            feed.unsubscribe_hub()
        for subscription in feed.subscribers:
            subscription.put(END)
