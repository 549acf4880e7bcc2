"""A run's events as Server-Sent Events: what is stored after the client's position, then what
comes, until the run's terminal event; token deltas live; a comment line now and then so
proxies keep the connection open."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from minions.runs._store import TERMINAL, Store
from minions.service._feeds import END, TERMINAL_KINDS, Feeds

__all__: list[str] = []

PAGE = 500


def frame(event: dict[str, Any]) -> bytes:
    """One SSE message; a stored event's id is its sequence number (a token delta has none:
    it is not stored, so a client cannot resume from it)."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    head = "" if event.get("kind") == "token_delta" else f"id: {event['seq']}\n"
    return f"{head}event: {event['kind']}\ndata: {data}\n\n".encode()


async def _ends_here(store: Store, run_id: str, event: dict[str, Any]) -> bool:
    """A terminal event ends the stream when nothing follows it and the run has ended (a run
    resumed after failing goes on after its `run_failed`)."""
    if event["kind"] not in TERMINAL_KINDS:
        return False
    record = await asyncio.to_thread(store.get_run, run_id, details=False)
    if record.status not in TERMINAL:
        return False
    last: int = await asyncio.to_thread(store.last_seq, run_id)
    return last == int(event["seq"])


async def sse_events(
    store: Store, feeds: Feeds, run_id: str, *, after: int, heartbeat: float
) -> AsyncIterator[bytes]:
    """The stream of one client (the run exists)."""
    yield b"retry: 1000\n\n"
    last = after
    async with feeds.subscribe(run_id) as subscription:
        # What is stored already (the feed publishes what comes after its start, so nothing
        # falls between the two; a duplicate is dropped by its sequence number).
        while True:
            batch = await asyncio.to_thread(store.events, run_id, after=last, limit=PAGE)
            for event in batch:
                last = event["seq"]
                yield frame(event)
                if await _ends_here(store, run_id, event):
                    return
            if len(batch) < PAGE:
                break
        record = await asyncio.to_thread(store.get_run, run_id, details=False)
        if record.terminal and await asyncio.to_thread(store.last_seq, run_id) <= last:
            return  # the client has seen the end already
        while True:
            try:
                event = await asyncio.wait_for(subscription.queue.get(), heartbeat)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if event is END:
                return  # the client fell behind or the service stops: it resumes from `last`
            if event["kind"] == "token_delta":
                yield frame(event)
                continue
            if event["seq"] <= last:
                continue
            if event["seq"] > last + 1:  # never expected; read the gap from the store
                missed = await asyncio.to_thread(
                    store.events, run_id, after=last, limit=event["seq"] - last - 1
                )
                for earlier in missed:
                    last = earlier["seq"]
                    yield frame(earlier)
            last = event["seq"]
            yield frame(event)
            if await _ends_here(store, run_id, event):
                return
