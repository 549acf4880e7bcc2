"""A run's events as Server-Sent Events: what is stored after the client's position, then what
comes, until the run's end; token deltas live; a comment line now and then so proxies keep
the connection open.

The answer is an ASGI application of its own, which owns the follow of the run: the follow
runs in a task of the answer's task group, so the stream can beat while it waits, and it is
cancelled on every way out (the run's end, the client gone at any moment, a failed write,
the server stopping), releasing its subscription at once rather than when a garbage
collector finds it.

Asked for them (``?states=true``: the console), the stream also tells the state of the run's
steps, folded on the server (`minions._fold`): a `states` message with every execution first,
then after each event one with the executions it changed.

A stream opened with a named key lasts only as long as the key: the key is looked up again at
every heartbeat and before each batch of events is written (a batch of token deltas alone, at
most once a second: they come many times a second), and a revoked key's stream ends with a
`revoked` message.

A follow that fails (a damaged store, a failure of the run's feed) ends the stream with an
`unavailable` message, logged as the API logs a store's errors (what failed stays in the
server's log); the client resumes from the last event it has, as after a dropped connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import anyio
import anyio.lowlevel
import structlog
from starlette.responses import Response

from minions._fold import RunStates
from minions.errors import StoreError
from minions.events import Event, event_to_json
from minions.runs import ScopedRuns
from minions.service._models import StepStates

__all__: list[str] = []

log = structlog.get_logger(__name__)

Message = MutableMapping[str, Any]
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
RETRY = b"retry: 1000\n"
"""Sent in the first event's block (a block of its own reads as an empty event to some
clients, httpx-sse among them)."""
KEEP_ALIVE = b": keep-alive\n\n"
RECHECK = 1.0
"""While only token deltas flow, seconds between looks at whether the stream's key still
works (each heartbeat and each batch with a stored event look)."""
BATCH = 200
"""The most events written at once."""


def revoked_frame(name: str) -> bytes:
    """The last message of a stream whose key was revoked."""
    message = f"key {name!r} was revoked: this stream ends"
    data = json.dumps({"error": {"type": "unauthorized", "message": message}})
    return f"event: revoked\ndata: {data}\n\n".encode()


def unavailable_frame(run_id: str) -> bytes:
    """The last message of a stream whose follow failed."""
    message = (
        f"following run {run_id!r} failed on the server (see its log); resume from the last "
        "event received"
    )
    data = json.dumps({"error": {"type": "unavailable", "message": message}})
    return f"event: unavailable\ndata: {data}\n\n".encode()


def frame(event: Event) -> bytes:
    """One SSE message; a stored event's id is its sequence number (a token delta has none:
    it is not stored, so a client cannot resume from it)."""
    head = "" if event.kind == "token_delta" else f"id: {event.seq}\n"
    return f"{head}event: {event.kind}\ndata: {event_to_json(event)}\n\n".encode()


def states_frame(states: StepStates) -> bytes:
    """A `states` message: no id (it is not an event, and a client resumes from events)."""
    return f"event: states\ndata: {states.model_dump_json()}\n\n".encode()


class OpenStreams:
    """The event streams open in this process, counted (`/health` tells them), and ended
    together when the server stops (`stop`)."""

    def __init__(self) -> None:
        self.open = 0
        self.stopping = False
        self._ends: set[asyncio.Event] = set()

    def stop(self) -> None:
        """End every stream now, cleanly (their clients resume from their last event, in
        another API process or this one restarted), and any opened from now on (call it in
        the streams' event loop)."""
        self.stopping = True
        for end in self._ends:
            end.set()

    @contextlib.contextmanager
    def opened(self) -> Iterator[asyncio.Event]:
        """A stream open: counted, and its end, set when the server stops."""
        end = asyncio.Event()
        if self.stopping:
            end.set()
        self._ends.add(end)
        self.open += 1
        try:
            yield end
        finally:
            self.open -= 1
            self._ends.discard(end)


class EventStream(Response):
    """The stream of one client (the run exists, and has events after `after` or has not
    ended: the route answers 204 otherwise).

    Args:
        runs: the run store as the caller sees it.
        run_id: the run.
        after: the last sequence number the client has.
        heartbeat: seconds of silence before a comment line.
        count: where open streams are counted.
        states: the state of the run's steps, its stored events folded (None: the client
            did not ask for them).
        key: the name of the key the stream was opened with, and what tells whether it
            still works (None: the server's token, which lasts as long as the server).
    """

    def __init__(
        self,
        runs: ScopedRuns,
        run_id: str,
        *,
        after: int,
        heartbeat: float,
        count: OpenStreams,
        states: RunStates | None = None,
        key: tuple[str, Callable[[], Awaitable[bool]]] | None = None,
    ) -> None:
        # A response of no declared length, whose body is written by `__call__`.
        self.status_code = 200
        self.background = None
        self.raw_headers = list(HEADERS)
        self.runs = runs
        self.run_id = run_id
        self.after = after
        self.heartbeat = heartbeat
        self.count = count
        self.states = states
        self.key = key
        self._checked = time.monotonic()

    async def _revoked(self, *, now: bool) -> bool:
        """Whether the stream's key was revoked (looked up when `now`, else at most once a
        `RECHECK`)."""
        if self.key is None:
            return False
        if not now and time.monotonic() - self._checked < RECHECK:
            return False
        self._checked = time.monotonic()
        return not await self.key[1]()

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=1000)
        failed: list[StoreError] = []

        async def pump() -> None:
            try:
                async for event in self.runs.follow(self.run_id, after=self.after):
                    await queue.put(event)
            except StoreError as exc:
                failed.append(exc)  # said to the client, after what it was sent
            # The end, after every event (waited for: a full queue has room once the writer
            # takes from it, and a writer that is gone cancels this task).
            await queue.put(None)

        with self.count.opened() as end:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()  # the client went: stop following

                async def stopping() -> None:
                    await end.wait()
                    with contextlib.suppress(asyncio.QueueFull):  # full: the writer is busy
                        queue.put_nowait(None)  # the writer looks up now

                group.start_soon(watch)
                group.start_soon(pump)
                group.start_soon(stopping)
                try:
                    await self._write(send, queue, end, failed)
                finally:
                    group.cancel_scope.cancel()

    async def _write(
        self,
        send: Callable[[Message], Awaitable[None]],
        queue: asyncio.Queue[Event | None],
        end: asyncio.Event,
        failed: list[StoreError],
    ) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        retry = RETRY
        states = self.states
        if states is not None:
            told = StepStates.of(self.run_id, states)
            await send(
                {
                    "type": "http.response.body",
                    "body": retry + states_frame(told),
                    "more_body": True,
                }
            )
            retry = b""
        ended = False
        while not ended:
            event: Event | None = None
            with anyio.move_on_after(self.heartbeat) as waited:
                event = await queue.get()
            if end.is_set():
                ended = True  # the server stops: the stream ends whole, nothing more written
                break
            if waited.cancelled_caught:
                if await self._revoked(now=True):
                    break
                await send({"type": "http.response.body", "body": KEEP_ALIVE, "more_body": True})
                continue
            batch = [event]
            while batch[-1] is not None and len(batch) < BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            stored = any(e is not None and e.kind != "token_delta" for e in batch)
            if await self._revoked(now=stored):
                break
            body = b""
            for item in batch:
                if item is None:
                    ended = True  # the run's terminal event was sent: the stream ends
                    if failed:  # or the follow failed
                        log.error("run store error", run_id=self.run_id, error=str(failed[0]))
                        body, retry = body + retry + unavailable_frame(self.run_id), b""
                    break
                body, retry = body + retry + frame(item), b""
                if states is not None and item.kind != "token_delta" and item.seq > states.seq:
                    # Events the fold has not taken in yet (the stored ones it has come again).
                    changed = states.fold(item)
                    if changed:
                        body += states_frame(StepStates.of(self.run_id, states, changed))
            if not body:
                continue
            await send({"type": "http.response.body", "body": body, "more_body": True})
            # A connection lost on a write is closed by a callback of the loop: without a
            # yield here, a burst of queued events kept writing to it (asyncio logs each write
            # after the fifth: "socket.send() raised exception.").
            await anyio.lowlevel.checkpoint()
        last = revoked_frame(self.key[0]) if self.key is not None and not ended else b""
        await send({"type": "http.response.body", "body": last, "more_body": False})
