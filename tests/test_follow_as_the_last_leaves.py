"""A follower that comes just as the last follower of the same run leaves follows the run to
its end, on SQLite and Postgres: it joined the feed the leaver was stopping, was ended with it
at once, and its follow stopped as if the run had ended."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from runs_helpers import until

from minions.events import Event
from minions.runs import RunStore
from minions.runs import _runs as runs


async def test_a_follower_that_comes_as_the_last_one_leaves_follows_to_the_end(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "s.yaml").write_text("id: s\nsteps:\n  - {id: one, goal: Say hi.}\n")
    store = RunStore(url, create=True, poll=1.0)  # its feeds wait between reads
    try:
        run_id, _ = await store.submit(tmp_path / "s.yaml")
        # The newcomer's first read of the store answers at once, without a turn of the
        # loop: it subscribes in the very turn the leaver's feed is stopping (otherwise a
        # matter of which thread answers first).
        database = store.log.database
        apply = database.apply
        at_once: set[asyncio.Task[Any] | None] = set()

        async def answering(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            if fn is runs.head and asyncio.current_task() in at_once:
                at_once.discard(asyncio.current_task())
                return fn(database.database, *args, **kwargs)
            return await apply(fn, *args, **kwargs)

        monkeypatch.setattr(database, "apply", answering)

        async def leaving() -> None:
            async for _ in store.follow(run_id):
                pass

        received: list[Event] = []

        async def coming() -> None:
            async for event in store.follow(run_id):
                received.append(event)

        first = asyncio.create_task(leaving())
        await until(lambda: store.log.followers() == 1)
        first.cancel()
        second = asyncio.create_task(coming())  # it runs as `first` stops its feed
        at_once.add(second)
        await asyncio.gather(first, return_exceptions=True)
        assert store.log.followers() == 1  # `second`, on a feed of its own
        await store.cancel(run_id)
        async with asyncio.timeout(30):
            await second
        assert [e.kind for e in received] == ["run_failed"]
    finally:
        await store.aclose()
