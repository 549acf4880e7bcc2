"""A run's events as Server-Sent Events: what is stored after the client's position, then what
comes, until the run's end; token deltas live; a comment line now and then so proxies keep
the connection open. The run is followed in a task of its own, so the stream can beat while
it waits, and the follow ends whenever the client goes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from minions.events import Event, event_to_json
from minions.runs import RunStore

__all__: list[str] = []


def frame(event: Event) -> bytes:
    """One SSE message; a stored event's id is its sequence number (a token delta has none:
    it is not stored, so a client cannot resume from it)."""
    head = "" if event.kind == "token_delta" else f"id: {event.seq}\n"
    return f"{head}event: {event.kind}\ndata: {event_to_json(event)}\n\n".encode()


async def sse_events(
    runs: RunStore, run_id: str, *, after: int, heartbeat: float
) -> AsyncIterator[bytes]:
    """The stream of one client (the run exists)."""
    yield b"retry: 1000\n\n"
    queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=1000)

    async def pump() -> None:
        try:
            async for event in runs.follow(run_id, after=after):
                await queue.put(event)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), heartbeat)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if event is None:
                return
            yield frame(event)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
