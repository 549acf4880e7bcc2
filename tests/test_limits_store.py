"""Limits per model endpoint over every worker of a store, and what endpoints taught the
structured-output ladder kept in it: the store's side, with limiters of several "processes"
(holders) on one SQLite store and a clock of the test's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from minions.cli._app import app
from minions.models import CapabilityMemory, EndpointLimit, Limits
from minions.models._limits import EndpointWait
from minions.runs import RunStore
from minions.runs._async import AsyncDatabase
from minions.runs._db import Database
from minions.runs._limiter import StoreCapabilities, StoreLimiter

URL = "http://127.0.0.1:9/v1"
ENDPOINT = (URL, "m")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)
        await asyncio.sleep(0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[AsyncDatabase]:
    adapter = AsyncDatabase(Database(f"sqlite:///{tmp_path / 'runs.db'}", create=True))
    try:
        yield adapter
    finally:
        adapter.close()


def limiter(
    store: AsyncDatabase, clock: FakeClock | None, holder: str, **rule: Any
) -> StoreLimiter:
    """A process's limiter (`holder`), on the test's clock (`None`: the real one)."""
    limits = Limits(endpoints=(EndpointLimit(match=URL, **rule),))
    if clock is None:
        return StoreLimiter(store, limits, holder=holder, lease=10.0)
    return StoreLimiter(store, limits, holder=holder, lease=10.0, clock=clock, sleep=clock.sleep)


async def test_places_are_shared_by_the_limiters_of_every_process(store: AsyncDatabase) -> None:
    # The real clock: on the test's, the waiter's polls would move it past the place's lease.
    one, two = (limiter(store, None, holder, max_concurrent=1) for holder in ("p1", "p2"))
    held = await one.acquire(ENDPOINT, tokens=1)
    assert held is not None
    waits: list[EndpointWait] = []
    other = asyncio.create_task(two.acquire(ENDPOINT, tokens=1, on_wait=waits.append))
    for _ in range(50):
        await asyncio.sleep(0.01)
    assert not other.done()  # the other process's caller waits for the place
    assert [w.reason for w in waits] == ["max_concurrent"]
    one.release(held)
    await one.settle()
    assert await asyncio.wait_for(other, 20) is not None


async def test_a_killed_process_frees_its_places_when_their_lease_runs_out(
    store: AsyncDatabase,
) -> None:
    clock = FakeClock()
    killed, alive = (limiter(store, clock, holder, max_concurrent=1) for holder in ("k", "a"))
    assert await killed.acquire(ENDPOINT, tokens=1) is not None  # never given back nor renewed
    started = clock.now
    assert await asyncio.wait_for(alive.acquire(ENDPOINT, tokens=1), 20) is not None
    assert clock.now >= started + 10  # only once the lease ran out


async def test_a_renewed_place_stays_taken(store: AsyncDatabase) -> None:
    clock = FakeClock()  # the waiter's polls move it on, over many leases
    holder, other = (limiter(store, clock, name, max_concurrent=1) for name in ("h", "o"))
    assert await holder.acquire(ENDPOINT, tokens=1) is not None
    waiting = asyncio.create_task(other.acquire(ENDPOINT, tokens=1))
    for _ in range(30):  # the heartbeat renews it while the other waits, over many leases
        await asyncio.sleep(0.01)
        await asyncio.to_thread(holder.renew)
    assert not waiting.done()
    waiting.cancel()


async def test_requests_per_minute_hold_over_every_process(store: AsyncDatabase) -> None:
    clock = FakeClock()
    limiters = [limiter(store, clock, f"p{n}", requests_per_minute=4) for n in range(3)]
    sent: list[float] = []
    for n in range(12):
        chosen = limiters[n % 3]
        permit = await chosen.acquire(ENDPOINT, tokens=1)
        assert permit is not None
        sent.append(clock.now)
        chosen.release(permit)
        await chosen.settle()
    for start in sent:
        assert sum(start <= at < start + 60 for at in sent) <= 4
    assert sent[-1] - sent[0] >= 120


async def test_a_pause_holds_every_process(store: AsyncDatabase) -> None:
    clock = FakeClock()
    one, two = (limiter(store, clock, holder, max_concurrent=5) for holder in ("p1", "p2"))
    one.pause(ENDPOINT, 2.0)
    await one.settle()
    paused_at = clock.now
    waits: list[EndpointWait] = []
    assert await two.acquire(ENDPOINT, tokens=1, on_wait=waits.append) is not None
    assert clock.now >= paused_at + 2.0
    assert [w.reason for w in waits] == ["retry_after"]


async def test_the_line_is_first_come_first_served_over_processes(store: AsyncDatabase) -> None:
    limiters = [limiter(store, None, f"p{n}", max_concurrent=1) for n in range(3)]
    held = await limiters[0].acquire(ENDPOINT, tokens=1)
    assert held is not None
    order: list[int] = []

    async def take(n: int) -> None:
        permit = await limiters[n].acquire(ENDPOINT, tokens=1)
        assert permit is not None
        order.append(n)
        limiters[n].release(permit)

    second = asyncio.create_task(take(1))
    for _ in range(20):
        await asyncio.sleep(0.01)
    third = asyncio.create_task(take(2))
    for _ in range(20):
        await asyncio.sleep(0.01)
    limiters[0].release(held)
    await asyncio.wait_for(asyncio.gather(second, third), 20)
    assert order == [1, 2]


# -- what endpoints taught -----------------------------------------------------------------------


async def test_what_an_endpoint_taught_reaches_every_worker_and_expires(
    store: AsyncDatabase,
) -> None:
    clock = FakeClock()
    learner = StoreCapabilities(store, expiry=3600, clock=clock)
    key = ("http://h:1/v1", "small")
    learner.memory.reject(key, "tool")
    learner.memory.reject(key, "tools")
    learner.memory.record(key, "json_schema")
    other = StoreCapabilities(store, expiry=3600, clock=clock)
    await other.refresh()  # waits for nothing of its own; reads what the first one wrote
    await learner.refresh()
    await other.refresh()
    assert other.memory.learned(key) == (frozenset({"tool", "tools"}), "json_schema")
    assert other.memory.ladder(key, ("tool", "prompted_json")) == ("prompted_json",)
    clock.now += 3601
    await other.refresh()
    assert other.memory.learned(key) == (frozenset(), None)


def test_a_model_learns_into_the_shared_memory() -> None:
    from minions.models._recording import RecordingModel
    from minions.runs._limiter import share_capabilities
    from minions.testing import FakeOpenAIServer

    memory = CapabilityMemory()
    with FakeOpenAIServer() as server:
        model = server.model()
        share_capabilities(RecordingModel(model), memory)
    assert model.capabilities is memory


def test_endpoints_list_and_forget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def learn() -> None:
        store = AsyncDatabase(Database(url, create=True))
        learner = StoreCapabilities(store, expiry=3600)
        learner.memory.reject(("http://h:1/v1", "small"), "tool")
        learner.memory.record(("http://h:1/v1", "small"), "prompted_json")
        learner.memory.record(("http://h:1/v1", "big"), "json_schema")
        learner.memory.record(("http://other:2/v1", "x"), "tool")
        await learner.refresh()
        store.close()

    asyncio.run(learn())
    runner = CliRunner()
    listed = runner.invoke(app, ["endpoints", "list", "--json", "--database-url", url])
    assert listed.exit_code == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert [(e["base_url"], e["model"], e["output_mode"], e["rejected"]) for e in data] == [
        ("http://h:1/v1", "big", "json_schema", []),
        ("http://h:1/v1", "small", "prompted_json", ["tool"]),
        ("http://other:2/v1", "x", "tool", []),
    ]
    table = runner.invoke(app, ["endpoints", "list", "--database-url", url])
    assert "http://h:1/v1#small" in table.stdout
    forgot = runner.invoke(
        app, ["endpoints", "forget", "http://h:1/v1/#small", "--database-url", url]
    )
    assert forgot.exit_code == 0, forgot.stderr
    assert "forgot 1 endpoint at http://h:1/v1 (model small)" in forgot.stderr
    runner.invoke(app, ["endpoints", "forget", "http://h:1/v1", "--database-url", url])
    client = RunStore(url)
    left = asyncio.run(client.endpoints())
    client.close()
    assert [(e.base_url, e.model) for e in left] == [("http://other:2/v1", "x")]


def test_a_store_made_before_these_tables_gets_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    Database(url, create=True).close()
    engine = sa.create_engine(url)
    with engine.begin() as db:
        for table in (
            "minions_endpoint_gates",
            "minions_endpoint_calls",
            "minions_endpoint_waiters",
            "minions_capabilities",
        ):
            db.execute(sa.text(f"DROP TABLE {table}"))
    Database(url).close()
    with engine.connect() as db:
        names = set(sa.inspect(db).get_table_names())
    engine.dispose()
    assert {"minions_endpoint_calls", "minions_capabilities"} <= names
