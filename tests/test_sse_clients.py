"""A run's stream read by a common SSE client as it is, with no special case: httpx-sse
against a real `minions serve` (issue 25: the `retry:` block read as an empty event broke
`json.loads(sse.data)`)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import httpx2
from httpx_sse import connect_sse
from service_helpers import TOKEN, auth, server, submit, write_recipes


def test_httpx_sse_reads_a_runs_stream_as_it_is(tmp_path: Path) -> None:
    folder = write_recipes(tmp_path / "recipes")
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with server(tmp_path, url, "--recipes", str(folder), LEDGER=str(tmp_path / "l.txt")) as s:
        with httpx2.Client(base_url=s.base, headers=auth()) as client:
            run_id = submit(client, "ledger", tag="sse")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with (
            httpx.Client(base_url=s.base, headers=headers, timeout=60) as reader,
            connect_sse(reader, "GET", f"/runs/{run_id}/events/stream") as source,
        ):
            received = [(sse.id, sse.event, json.loads(sse.data)) for sse in source.iter_sse()]
    assert [int(i) for i, _, _ in received] == list(range(1, len(received) + 1))
    assert all(kind == data["kind"] for _, kind, data in received)
    assert received[-1][1] == "run_completed"
    assert source.response.status_code == 200


async def test_a_token_delta_reaches_followers_after_the_event_it_follows(tmp_path: Path) -> None:
    """A worker's live token delta can reach the service before the stored event it follows
    (its model call's start, still on its way to the store): followers get them in order."""
    import asyncio

    from runs_helpers import insert_run, until

    from minions.events import ModelCallStarted, StepStarted, TokenDelta
    from minions.runs import LiveHub, RunStore, _leases
    from minions.runs._db import Database
    from minions.runs._events import row_of

    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = Database(url, create=True)
    insert_run(store, "r")
    start = _leases.claim(
        store, "r", attempt=1, holder="h", executor_id="e", lease_until=1e12, now=0.0
    )
    assert isinstance(start, _leases.Start)
    first = StepStarted(run_id="r", step_id="a", seq=1, timestamp=1.0)
    _leases.append(store, start.lease, after=0, events=[row_of(first)])
    hub = LiveHub()
    runs = RunStore(url, hub=hub, poll=0.01)
    received: list[str] = []

    async def follow() -> None:
        async for event in runs.follow("r"):
            received.append(f"{event.kind} {event.seq}")
            if event.kind == "token_delta":
                return

    follower = asyncio.create_task(follow())
    await until(lambda: runs.log.feeds() > 0 and bool(received))
    started = ModelCallStarted(run_id="r", step_id="a", seq=2, timestamp=2.0)
    hub.publish(started)
    hub.publish(TokenDelta(run_id="r", step_id="a", seq=2, timestamp=2.1, text="Hi"))
    await asyncio.sleep(0.05)  # the delta waits for event 2, which is not stored yet
    assert received == ["step_started 1"]
    _leases.append(store, start.lease, after=1, events=[row_of(started)])
    await asyncio.wait_for(follower, 30)
    assert received == ["step_started 1", "model_call_started 2", "token_delta 2"]
    await runs.aclose()
