"""Faults while a run is followed (on SQLite: how a follow meets them does not depend on the
store):

- a database away during a follower's own first read (of the events stored so far) is
  waited out, as the feed's reads wait it out: the follower used to fail with `StoreError`;
- a feed that fails otherwise (a bug, a damaged store) ends each of its followers with a
  `StoreError` that names the run, chained to the cause, logged once; the next follower of
  the run gets a feed of its own. The followers used to stop as if the run had ended: an
  event stream closed as at the run's end, `runs events --follow` exited 0;
- a follower that falls more than `QUEUE_LIMIT` events behind its feed reads what it missed
  from the store and follows on to the run's end (it used to end there, as if the run had);
  the log's stop still ends it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import structlog
from runs_helpers import queued, until
from service_helpers import app_in_thread, auth, read_stream
from typer.testing import CliRunner

from minions.errors import StoreError
from minions.events import Event
from minions.runs import RunStore, _log
from minions.runs import _events as events
from minions.runs._async import AsyncDatabase
from minions.runs._db import DamagedStoreError
from minions.runs._log import _Feed
from minions.service import ServiceConfig, create_app

TOKEN = "t" * 40
FEED_FAILED = "a followed run's feed failed: its followers end with an error"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'minions.db'}"


@pytest.fixture
def failing_feed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Feeds whose next read of the run's events raises once they have N followers or more:
    put N, then the exceptions to raise, in the list returned (each raised once, in order)."""
    plan: list[Any] = []
    feeds: list[_Feed] = []
    made = _Feed.__init__
    apply = AsyncDatabase.apply

    def init(feed: _Feed, *args: Any) -> None:
        made(feed, *args)
        feeds.append(feed)

    async def applying(database: AsyncDatabase, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        feed = next((f for f in feeds if f.task is task), None)
        failing = fn is events.after and feed is not None and len(plan) > 1
        if failing and feed is not None and len(feed.subscribers) >= plan[0]:
            raise plan.pop(1)
        return await apply(database, fn, *args, **kwargs)

    monkeypatch.setattr(_Feed, "__init__", init)
    monkeypatch.setattr(AsyncDatabase, "apply", applying)
    return plan


# -- a store away during a follower's first read ----------------------------------------------


async def test_a_follower_waits_out_a_locked_store_at_its_first_read(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower's read of the events stored so far finds the database locked past its busy
    wait twice (as SQLite says it, through the store's own handling of a transient failure),
    then not: it reads them, and follows the run to its end."""
    run_id = await queued(url, tmp_path)
    store = RunStore(url, poll=0.01)
    try:
        await store.cancel(run_id)
        stored = await store.events(run_id)
        read = events.after
        refused: list[int] = []

        def locked(database: Any, run: str, *, after: int = 0, limit: int | None = None) -> Any:
            # The follower reads from its position (0); the feed from the run's last event.
            if after == 0 and len(refused) < 2:
                refused.append(after)
                raise sqlite3.OperationalError("database is locked")
            return read(database, run, after=after, limit=limit)

        monkeypatch.setattr(events, "after", locked)
        received = [e async for e in store.follow(run_id)]
        assert refused == [0, 0]
        assert received == stored
        assert [e.kind for e in received][-1] == "run_failed"
    finally:
        await store.aclose()


async def test_a_follower_still_fails_at_once_on_a_damaged_store(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged store is no outage: the follower's first read says so, it does not wait."""
    run_id = await queued(url, tmp_path)
    store = RunStore(url, poll=0.01)
    try:

        def damaged(*_: Any, **__: Any) -> Any:
            raise DamagedStoreError("an event of the run is not JSON")

        monkeypatch.setattr(events, "after", damaged)
        with pytest.raises(DamagedStoreError, match="not JSON"):
            async for _ in store.follow(run_id):
                pass
    finally:
        await store.aclose()


# -- a feed that fails ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [RuntimeError("a bug"), DamagedStoreError("the run store is damaged: event 7 is not JSON")],
    ids=["bug", "damaged"],
)
async def test_a_feed_that_fails_ends_its_followers_with_the_error(
    url: str, tmp_path: Path, failing_feed: list[Any], fault: Exception
) -> None:
    """Two followers share the run's feed, which fails: each gets a `StoreError` naming the run
    and what went wrong, chained to it; it is logged once; a third follower afterwards gets a
    feed of its own and follows the run to its end."""
    run_id = await queued(url, tmp_path)
    failing_feed[:] = [2, fault]
    store = RunStore(url, poll=0.01)
    try:

        async def follow() -> list[Event]:
            return [e async for e in store.follow(run_id)]

        with structlog.testing.capture_logs() as logs:
            results = await asyncio.wait_for(
                asyncio.gather(follow(), follow(), return_exceptions=True), 60
            )
        for result in results:
            assert isinstance(result, StoreError)
            assert str(result).startswith(f"following run {run_id!r} failed: ")
            assert str(fault) in str(result)
            assert result.__cause__ is fault
        assert str(results[0]) == str(results[1])
        if isinstance(fault, RuntimeError):
            assert "RuntimeError: a bug" in str(results[0])
        said = [entry for entry in logs if entry["event"] == FEED_FAILED]
        assert len(said) == 1
        assert said[0]["log_level"] == "error"
        assert said[0]["run_id"] == run_id
        assert said[0]["followers"] == 2
        # A bug's traceback, not a damaged store's.
        assert said[0].get("exc_info") is (fault if isinstance(fault, RuntimeError) else None)
        assert store.log.feeds() == 0  # the failed feed is gone

        third = asyncio.create_task(follow())
        await until(lambda: store.log.followers() == 1)
        await store.cancel(run_id)
        received = await asyncio.wait_for(third, 60)
        assert [e.kind for e in received] == ["run_failed"]
    finally:
        await store.aclose()


def test_an_event_stream_whose_feed_fails_ends_with_an_error_message(
    url: str, tmp_path: Path, failing_feed: list[Any]
) -> None:
    """The client of the run's event stream gets an `unavailable` message naming the run, and
    the stream ends cleanly: no traceback, nothing of the server's, and not as at the run's
    end (it used to close as if the run had ended)."""
    run_id = asyncio.run(queued(url, tmp_path))
    failing_feed[:] = [1, RuntimeError("a bug")]
    app = create_app(ServiceConfig(token=TOKEN, database_url=url))
    messages: list[dict[str, Any]] = []
    with structlog.testing.capture_logs() as logs, app_in_thread(app) as base:

        def read() -> None:
            with (
                httpx2.Client(base_url=base, headers=auth(TOKEN), timeout=120) as client,
                client.stream("GET", f"/runs/{run_id}/events/stream") as response,
            ):
                assert response.status_code == 200
                messages.extend(read_stream(response))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout=60)
        assert not reader.is_alive()
    assert [m["event"] for m in messages] == ["unavailable"]
    error = messages[0]["data"]["error"]
    assert error["type"] == "unavailable"
    assert run_id in error["message"]
    assert "a bug" not in error["message"]  # what failed stays in the server's log
    # The feed's failure with its traceback once; the stream's end as the API logs a store's
    # errors, in a line; no failed request (a traceback of the stream's own).
    assert [e["run_id"] for e in logs if e["event"] == FEED_FAILED] == [run_id]
    [ended] = [e for e in logs if e["event"] == "run store error"]
    assert ended["run_id"] == run_id
    assert "RuntimeError: a bug" in ended["error"]
    assert not [e for e in logs if e["event"] == "request failed"]


def test_runs_events_follow_whose_feed_fails_says_so(
    url: str, tmp_path: Path, failing_feed: list[Any]
) -> None:
    """`minions runs events RUN --follow`: an error naming the run on stderr, exit code 2,
    no traceback (it used to exit 0, as if the run had ended)."""
    from minions.cli import app

    run_id = asyncio.run(queued(url, tmp_path))
    failing_feed[:] = [1, RuntimeError("a bug")]
    result = CliRunner().invoke(app, ["runs", "events", run_id, "--follow", "--database-url", url])
    assert result.exit_code == 2, result.output
    assert f"error: following run {run_id!r} failed: RuntimeError: a bug" in result.stderr
    assert "Traceback" not in result.output


# -- a follower that falls behind -----------------------------------------------------------------


class SlowFollower:
    """A follower of a queued run, in a store whose followers' queues hold 2 events: it got
    the run's first event, and its caller reads no more until the test asks."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.events = store.follow(run_id)
        self.feed: _Feed | None = None

    async def more_events(self, count: int) -> None:
        """`count` more events of the run, each a `run_failed` (cancelled, then resumed:
        queued again, nobody runs it)."""
        for _ in range(count):
            await self.store.cancel(self.run_id)
            await self.store.resume(self.run_id)

    async def published(self, seq: int) -> None:
        """Until the run's feed published its events up to `seq` (or stopped)."""
        feed = self.feed
        assert feed is not None
        await until(lambda: feed.last >= seq or feed.task is None or feed.task.done())


@pytest.fixture
async def slow_follower(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SlowFollower]:
    monkeypatch.setattr(_log, "QUEUE_LIMIT", 2)
    run_id = await queued(url, tmp_path)
    store = RunStore(url, poll=0.01)
    try:
        follower = SlowFollower(store, run_id)
        await follower.more_events(1)
        assert (await anext(follower.events)).seq == 1
        follower.feed = store.log._feeds[run_id]
        yield follower
    finally:
        await store.aclose()


async def test_a_follower_that_falls_behind_reads_what_it_missed_and_follows_on(
    slow_follower: SlowFollower,
) -> None:
    """Its caller reads nothing while the run's feed publishes more events than the follower's
    queue holds: the follower reads what it missed from the store, from the last event it
    gave, then gets the run's next event from the feed, which it never left: every event once,
    in order, to the run's end. It used to end there, as if the run had."""
    follower, store = slow_follower, slow_follower.store
    await follower.more_events(5)
    await follower.published(6)  # while its caller read nothing
    caught_up = [await anext(follower.events) for _ in range(5)]
    assert [e.seq for e in caught_up] == [2, 3, 4, 5, 6]
    assert store.log._feeds[follower.run_id] is follower.feed
    assert store.log.followers() == 1
    await store.cancel(follower.run_id)  # the run's end, event 7
    rest = [e async for e in follower.events]
    assert [(e.seq, e.kind) for e in rest] == [(7, "run_failed")]


@pytest.mark.parametrize("behind", [False, True], ids=["up-to-date", "behind"])
async def test_a_follower_still_ends_when_the_log_stops(
    slow_follower: SlowFollower, behind: bool
) -> None:
    """The log stops (its store closes) while the run is followed: the follow ends there,
    without an error (its caller resumes from its last event); one that fell behind reads
    nothing more from the store."""
    follower, store = slow_follower, slow_follower.store
    if behind:
        await follower.more_events(5)
        await follower.published(6)
    await store.log.stop()
    assert [e.seq async for e in follower.events] == []
    assert store.log.followers() == 0
