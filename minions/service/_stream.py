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
then after each event one with the executions it changed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import anyio.lowlevel
from starlette.responses import Response

from minions._fold import RunStates
from minions.events import Event, event_to_json
from minions.runs import RunStore
from minions.service._models import StepStates

__all__: list[str] = []

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


def frame(event: Event) -> bytes:
    """One SSE message; a stored event's id is its sequence number (a token delta has none:
    it is not stored, so a client cannot resume from it)."""
    head = "" if event.kind == "token_delta" else f"id: {event.seq}\n"
    return f"{head}event: {event.kind}\ndata: {event_to_json(event)}\n\n".encode()


def states_frame(states: StepStates) -> bytes:
    """A `states` message: no id (it is not an event, and a client resumes from events)."""
    return f"event: states\ndata: {states.model_dump_json()}\n\n".encode()


class OpenStreams:
    """The event streams open in this process, counted (`/health` tells them)."""

    def __init__(self) -> None:
        self.open = 0


class EventStream(Response):
    """The stream of one client (the run exists, and has events after `after` or has not
    ended: the route answers 204 otherwise).

    Args:
        runs: the run store.
        run_id: the run.
        after: the last sequence number the client has.
        heartbeat: seconds of silence before a comment line.
        count: where open streams are counted.
        states: the state of the run's steps, its stored events folded (None: the client
            did not ask for them).
    """

    def __init__(
        self,
        runs: RunStore,
        run_id: str,
        *,
        after: int,
        heartbeat: float,
        count: OpenStreams,
        states: RunStates | None = None,
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

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=1000)

        async def pump() -> None:
            try:
                async for event in self.runs.follow(self.run_id, after=self.after):
                    await queue.put(event)
            finally:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)

        self.count.open += 1
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()  # the client went: stop following

                group.start_soon(watch)
                group.start_soon(pump)
                try:
                    await self._write(send, queue)
                finally:
                    group.cancel_scope.cancel()
        finally:
            self.count.open -= 1

    async def _write(
        self, send: Callable[[Message], Awaitable[None]], queue: asyncio.Queue[Event | None]
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
        while True:
            event: Event | None = None
            with anyio.move_on_after(self.heartbeat) as waited:
                event = await queue.get()
            if waited.cancelled_caught:
                await send({"type": "http.response.body", "body": KEEP_ALIVE, "more_body": True})
                continue
            if event is None:
                break  # the run's terminal event was sent: the stream ends
            body, retry = retry + frame(event), b""
            if states is not None and event.kind != "token_delta" and event.seq > states.seq:
                # Events the fold has not taken in yet (the stored ones it has come again).
                changed = states.fold(event)
                if changed:
                    body += states_frame(StepStates.of(self.run_id, states, changed))
            await send({"type": "http.response.body", "body": body, "more_body": True})
            # A connection lost on a write is closed by a callback of the loop: without a
            # yield here, a burst of queued events kept writing to it (asyncio logs each write
            # after the fifth: "socket.send() raised exception.").
            await anyio.lowlevel.checkpoint()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
