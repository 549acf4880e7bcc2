"""A follower whose position is past the end of a running run (an SSE client's `Last-Event-ID`
beyond the run's last event) is told nothing it claims to have, and its stream still ends when
the run ends, on SQLite and Postgres: it used to wait forever."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx2
import pytest
from runs_helpers import queued, run_here, until
from service_helpers import app_in_thread, auth, read_stream

from minions.events import Event
from minions.runs import RunStore
from minions.service import ServiceConfig, create_app

pytestmark = pytest.mark.slow

TOKEN = "t" * 40
PAST = 1000
"""A position past the end of the run's log (it has a handful of events)."""


async def test_a_follower_past_the_end_stops_when_the_run_ends(url: str, tmp_path: Path) -> None:
    run_id = await queued(url, tmp_path)
    store = RunStore(url)
    try:
        received: list[Event] = []

        async def follow() -> None:
            async for event in store.follow(run_id, after=PAST):
                received.append(event)

        following = asyncio.create_task(follow())
        await until(lambda: store.log.feeds() == 1)  # subscribed while the run is queued
        await run_here(url, run_id)
        assert (await store.get(run_id)).status == "completed"
        await asyncio.wait_for(following, timeout=60)
        assert received == []  # every event of the run is before its position
    finally:
        await store.aclose()


def test_an_event_stream_past_the_end_closes_when_the_run_ends(url: str, tmp_path: Path) -> None:
    run_id = asyncio.run(queued(url, tmp_path))
    app = create_app(ServiceConfig(token=TOKEN, database_url=url))
    messages: list[dict[str, Any]] = []
    with app_in_thread(app) as base:

        def read() -> None:
            with (
                httpx2.Client(base_url=base, headers=auth(TOKEN), timeout=120) as client,
                client.stream(
                    "GET",
                    f"/runs/{run_id}/events/stream",
                    headers={"Last-Event-ID": str(PAST)},
                ) as response,
            ):
                assert response.status_code == 200
                messages.extend(read_stream(response))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        asyncio.run(until(lambda: app.state.runs.log.feeds() == 1))  # the stream follows
        asyncio.run(run_here(url, run_id))
        reader.join(timeout=60)
        assert not reader.is_alive(), "the stream did not close when the run ended"
    assert messages == []
