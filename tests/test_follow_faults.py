"""Faults while a run is followed (on SQLite: how a follow meets them does not depend on the
store): a database away during a follower's own first read (of the events stored so far) is
waited out, as the feed's reads wait it out (the follower used to fail with `StoreError`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from runs_helpers import queued

from minions.runs import RunStore
from minions.runs import _events as events
from minions.runs._db import DamagedStoreError


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'minions.db'}"


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
