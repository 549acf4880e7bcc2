"""Limits per model endpoint over every worker of a store, and what endpoints taught the
structured-output ladder kept in it: the store's side, with limiters of several "processes"
(holders) on one SQLite store and a clock of the test's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from minions.cli._app import app
from minions.models import CapabilityMemory, EndpointLimit, Limits
from minions.models._learning import LEARNING_RUN
from minions.models._limits import EndpointWait
from minions.runs import RunStore, _endpoints
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
    data = json.loads(listed.stdout)["endpoints"]
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


# -- pauses: bounded, attributed, lifted ---------------------------------------------------------


async def test_a_shared_pause_is_capped_and_says_which_run_set_it(store: AsyncDatabase) -> None:
    """A 429 asking for a day pauses every worker for the limits' `max_pause` (5 minutes by
    default), and the store keeps the run it answered and what it asked."""
    clock = FakeClock()
    one = limiter(store, clock, "p1", max_concurrent=5)
    assert one.pause(ENDPOINT, 86400.0, by="run-1") == 300.0
    await one.settle()
    paused = await store.apply(_endpoints.pauses, now=clock.now)
    assert [(p.endpoint, p.until, p.paused_by, p.asked, p.paused_at) for p in paused] == [
        (URL, clock.now + 300.0, "run-1", 86400.0, clock.now)
    ]
    waits: list[EndpointWait] = []
    two = limiter(store, clock, "p2", max_concurrent=5)
    assert await two.acquire(ENDPOINT, tokens=1, on_wait=waits.append) is not None
    assert [(w.reason, w.until) for w in waits] == [("retry_after", paused[0].until)]


@pytest.mark.parametrize("hint", [float("inf"), float("nan"), -5.0, 0, "60", True, 10**400])
async def test_a_hint_that_is_no_number_of_seconds_pauses_nothing(
    store: AsyncDatabase, hint: Any
) -> None:
    clock = FakeClock()
    one = limiter(store, clock, "p1", max_concurrent=5)
    assert one.pause(ENDPOINT, hint, by="run-1") == 0.0
    await one.settle()
    assert await store.apply(_endpoints.pauses, now=clock.now) == []


async def test_a_worker_obeys_a_longer_pause_only_up_to_its_own_bound(
    store: AsyncDatabase,
) -> None:
    """A pause written by a worker with a longer bound (or by a minions of before) holds a
    worker at most its own `max_pause` from when it was set."""
    clock = FakeClock()
    await store.apply(
        _endpoints.pause, URL, clock.now + 86400, by="r", asked=86400.0, now=clock.now
    )
    rules = Limits(endpoints=(EndpointLimit(match=URL, max_concurrent=5),), max_pause=60)
    bounded = StoreLimiter(store, rules, holder="p", clock=clock, sleep=clock.sleep)
    waits: list[EndpointWait] = []
    started = clock.now
    assert await bounded.acquire(ENDPOINT, tokens=1, on_wait=waits.append) is not None
    assert [(w.reason, w.until) for w in waits] == [("retry_after", started + 60)]
    assert clock.now < started + 120


def test_endpoints_list_shows_a_pause_and_forget_lifts_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    database = Database(url, create=True)
    now = time.time()
    _endpoints.pause(database, "http://h:1/v1#small", now + 200, by="r-7", asked=9e9, now=now)
    _endpoints.pause(database, "http://other:2/v1", now + 200, by="r-8", asked=200.0, now=now)
    database.close()
    runner = CliRunner()
    listed = runner.invoke(app, ["endpoints", "list", "--json", "--database-url", url])
    assert listed.exit_code == 0, listed.stderr
    pauses = json.loads(listed.stdout)["pauses"]
    assert [(p["endpoint"], p["paused_by"], p["asked"]) for p in pauses] == [
        ("http://h:1/v1#small", "r-7", 9e9),
        ("http://other:2/v1", "r-8", 200.0),
    ]
    table = runner.invoke(app, ["endpoints", "list", "--database-url", url])
    assert "paused after a 429" in table.stdout
    assert "r-7" in table.stdout
    forgot = runner.invoke(app, ["endpoints", "forget", "http://h:1/v1", "--database-url", url])
    assert forgot.exit_code == 0, forgot.stderr
    assert "lifted 1 pause" in forgot.stderr
    client = RunStore(url)
    left = asyncio.run(client.pauses())
    client.close()
    assert [p.endpoint for p in left] == ["http://other:2/v1"]


@pytest.mark.parametrize("given", ["", "nothing", "ftp://h/v1", "#model"])
def test_endpoints_forget_refuses_what_is_no_endpoint(tmp_path: Path, given: str) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    Database(url, create=True).close()
    forgot = CliRunner().invoke(app, ["endpoints", "forget", given, "--database-url", url])
    assert forgot.exit_code == 2, forgot.output
    assert "is not an endpoint" in forgot.stderr


def test_a_store_of_schema_5_gets_pauses_attributed_and_lessons_with_evidence(
    tmp_path: Path,
) -> None:
    """Opening a store of schema 5 adds the columns, and lifts its pauses (unbounded then,
    and nobody's)."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    Database(url, create=True).close()
    engine = sa.create_engine(url)
    with engine.begin() as db:
        for column in ("paused_by", "paused_at", "pause_asked"):
            db.execute(sa.text(f"ALTER TABLE minions_endpoint_gates DROP COLUMN {column}"))
        db.execute(sa.text("ALTER TABLE minions_capabilities DROP COLUMN evidence"))
        db.execute(sa.text("DROP TABLE minions_capability_strikes"))
        db.execute(sa.text("UPDATE minions_meta SET value = '5' WHERE key = 'schema_version'"))
        db.execute(sa.text("INSERT INTO minions_endpoint_gates VALUES ('http://h:1/v1', 1e300)"))
        db.execute(
            sa.text(
                "INSERT INTO minions_capabilities VALUES ('http://h:1/v1', 'm', '[\"tool\"]', "
                f"NULL, {time.time()})"
            )
        )
    engine.dispose()
    client = RunStore(url)
    assert asyncio.run(client.pauses()) == []
    [record] = asyncio.run(client.endpoints())
    client.close()
    assert [(lesson.feature, lesson.cause) for lesson in record.lessons] == [("tool", "unknown")]


def test_a_limits_file_bounds_pauses_and_demotions(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("max_pause: 10m\ndemote_after_runs: 5\n")
    limits = Limits.load(path)
    assert (limits.max_pause, limits.demote_after_runs) == (600.0, 5)
    assert (Limits().max_pause, Limits().demote_after_runs) == (300.0, 3)


# -- lessons: several runs, or the wire ----------------------------------------------------------

KEY = ("http://h:1/v1", "small")


def ignored_twice(memory: CapabilityMemory, run: str) -> bool:
    """Two answers of `run` that ignored ``json_schema``: whether that demoted it (for the
    run, at least)."""
    token = LEARNING_RUN.set(run)
    try:
        memory.ignored(KEY, "json_schema")
        return memory.ignored(KEY, "json_schema")
    finally:
        LEARNING_RUN.reset(token)


def ladder_of(memory: CapabilityMemory, run: str) -> tuple[str, ...]:
    token = LEARNING_RUN.set(run)
    try:
        return memory.ladder(KEY, ("json_schema", "tool", "prompted_json"))
    finally:
        LEARNING_RUN.reset(token)


async def test_one_runs_prose_demotes_the_mode_for_that_run_only(store: AsyncDatabase) -> None:
    """A prompt that makes the model answer prose twice demotes ``json_schema`` for its run:
    not for the next run, nor for the store's other workers."""
    clock = FakeClock()
    worker = StoreCapabilities(store, expiry=3600, clock=clock)
    assert ignored_twice(worker.memory, "run-1")
    assert ladder_of(worker.memory, "run-1") == ("tool", "prompted_json")
    assert ladder_of(worker.memory, "run-2") == ("json_schema", "tool", "prompted_json")
    await worker.refresh()
    other = StoreCapabilities(store, expiry=3600, clock=clock)
    await other.refresh()
    assert other.memory.learned(KEY) == (frozenset(), None)
    assert await store.apply(_endpoints.learned, expiry=3600, now=clock.now) == []


async def test_runs_of_several_workers_demote_the_mode_for_every_run_with_their_evidence(
    store: AsyncDatabase,
) -> None:
    clock = FakeClock()
    one, two = (StoreCapabilities(store, expiry=3600, clock=clock) for _ in range(2))
    first = clock.now
    ignored_twice(one.memory, "run-1")
    await one.settle()
    clock.now += 10
    ignored_twice(two.memory, "run-2")
    ignored_twice(two.memory, "run-2")  # one run counts once
    await two.settle()
    assert "json_schema" not in two.memory.rejected(KEY)
    clock.now += 10
    ignored_twice(one.memory, "run-3")
    await one.settle()
    assert "json_schema" in one.memory.rejected(KEY)
    [record] = await store.apply(_endpoints.learned, expiry=3600, now=clock.now)
    [lesson] = record.lessons
    assert (lesson.feature, lesson.cause, lesson.since, lesson.runs) == (
        "json_schema",
        "ignored",
        first,
        ("run-1", "run-2", "run-3"),
    )
    assert lesson.expires_at == first + 3600
    await two.refresh()
    assert ladder_of(two.memory, "run-4") == ("tool", "prompted_json")


async def test_strikes_older_than_the_expiry_do_not_count(store: AsyncDatabase) -> None:
    clock = FakeClock()
    worker = StoreCapabilities(store, expiry=3600, clock=clock)
    for run in ("run-1", "run-2"):
        ignored_twice(worker.memory, run)
    await worker.settle()
    clock.now += 3601
    fresh = StoreCapabilities(store, expiry=3600, clock=clock)
    ignored_twice(fresh.memory, "run-3")
    await fresh.settle()
    assert "json_schema" not in fresh.memory.rejected(KEY)


async def test_a_refusal_on_the_wire_is_every_runs_at_once_and_expires(
    store: AsyncDatabase,
) -> None:
    clock = FakeClock()
    worker = StoreCapabilities(store, expiry=3600, clock=clock)
    token = LEARNING_RUN.set("run-1")
    try:
        worker.memory.reject(KEY, "json_schema", detail="response_format is not supported")
    finally:
        LEARNING_RUN.reset(token)
    await worker.settle()
    [record] = await store.apply(_endpoints.learned, expiry=3600, now=clock.now)
    assert [(x.feature, x.cause, x.detail, x.since) for x in record.lessons] == [
        ("json_schema", "refused", "response_format is not supported", clock.now)
    ]
    assert ladder_of(worker.memory, "run-2") == ("tool", "prompted_json")
    # The endpoint keeps teaching (its working mode is written again later): the refusal
    # still expires an hour (the expiry) after it was learned.
    clock.now += 3000
    worker.memory.record(KEY, "tool")
    await worker.settle()
    clock.now += 1000
    [record] = await store.apply(_endpoints.learned, expiry=3600, now=clock.now)
    assert (record.rejected, record.output_mode) == ((), "tool")


async def test_a_damaged_lesson_row_teaches_nothing_instead_of_failing(
    store: AsyncDatabase,
) -> None:
    clock = FakeClock()
    with store.database.begin() as db:
        db.execute(
            sa.text(
                "INSERT INTO minions_capabilities VALUES "
                f"('http://h:1/v1', 'a', 'not json', 'tool', {clock.now}, '{{broken'), "
                f"('http://h:1/v1', 'b', '{{\"x\": 1}}', NULL, {clock.now}, '[1, 2]'), "
                f"('http://h:1/v1', 'c', '[\"tool\"]', NULL, {clock.now}, "
                '\'{"tool": {"cause": "refused"}, "x": 5}\')'
            )
        )
    records = await store.apply(_endpoints.learned, expiry=3600, now=clock.now)
    assert [(r.model, r.rejected, [x.cause for x in r.lessons]) for r in records] == [
        ("a", (), []),
        ("b", (), []),
        ("c", ("tool",), ["unknown"]),
    ]
