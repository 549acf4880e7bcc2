"""A rerun and a prune of its parent, raced at every point, on SQLite and Postgres: the prune
lands before each of the rerun's reads and writes in turn (deterministically: the store's
database is wrapped, nothing sleeps), and the rerun is either refused with nothing queued or
queued with every seed it reuses; never queued without them (a "reused" step run live)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from runs_helpers import TOOLS, run_here, until

from minions.errors import UnknownRunError
from minions.runs import RunStore
from minions.runs import _prune as prune

pytestmark = pytest.mark.slow

CHAIN = """\
id: chain
tools: [tools]
steps:
  - {id: fetch, tool: mark, params: {run: a, step: fetch}}
  - {id: draft, depends_on: [fetch], tool: mark, params: {run: a, step: draft}}
  - {id: ship, depends_on: [draft], tool: mark, params: {run: a, step: ship}}
"""
REUSED = {"draft": ["fetch"], "ship": ["fetch", "draft"]}
"""What a rerun from each step reuses."""


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger.txt"))
    (tmp_path / "tools.py").write_text(TOOLS)
    path = tmp_path / "chain.yaml"
    path.write_text(CHAIN)
    return path


class PruneAt:
    """The store's database calls, with a prune of every cancelled run done in full just
    before call number `at` (none when `at` is None); counts the calls."""

    def __init__(self, store: RunStore) -> None:
        self.database: Any = store._database
        self.original = self.database.apply
        self.at: int | None = None
        self.calls = 0
        self.pruned = False
        setattr(self.database, "apply", self.apply)  # noqa: B010 (typed as a method)

    async def apply(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self.calls == self.at:
            await self.original(
                prune.prune, before=time.time() + 60, statuses=("cancelled",), pause=0
            )
            self.pruned = True
        self.calls += 1
        return await self.original(fn, *args, **kwargs)


async def ended_parent(store: RunStore, done: str) -> str:
    """A fresh ended run to rerun: a rerun of `done` from `ship` (it reuses fetch and
    draft), cancelled before it ran."""
    plan = await store.rerun(done, from_step="ship")
    await store.cancel(plan.run_id)
    return plan.run_id


async def test_a_prune_at_any_point_of_a_rerun_leaves_it_refused_or_seeded(
    url: str, recipe: Path
) -> None:
    store = RunStore(url, create=True)
    try:
        done, _ = await store.submit(recipe)
        await run_here(url, done)
        assert (await store.get(done)).status == "completed"
        hook = PruneAt(store)
        # How many calls a rerun makes: the prune lands before each of them, and after all.
        parent = await ended_parent(store, done)
        hook.calls = 0
        await store.rerun(parent, from_step="ship")
        total = hook.calls
        assert total >= 3  # the run, its snapshot, the insert
        outcomes = set()
        for from_step, reused in REUSED.items():
            for at in range(total + 1):
                hook.at = None
                parent = await ended_parent(store, done)
                # What a prune of the cancelled runs leaves.
                kept = {
                    r.run_id for r in await store.list_runs(limit=500) if r.status != "cancelled"
                }
                # Before call `at` of the rerun; `total`: after its last (its reads below).
                hook.calls, hook.at, hook.pruned = 0, at, False
                try:
                    plan = await store.rerun(parent, from_step=from_step)
                except UnknownRunError:
                    hook.at = None
                    # Refused: nothing was queued.
                    after = {r.run_id for r in await store.list_runs(limit=500)}
                    assert after == kept, (from_step, at)
                    outcomes.add("refused")
                    continue
                rerun = await store.get(plan.run_id)
                hook.at = None
                assert hook.pruned
                assert parent not in {r.run_id for r in await store.list_runs(limit=500)}
                assert rerun.status == "queued"
                assert set(reused) <= set(plan.reused)
                seeded = {s.step_id: s.status for s in rerun.steps}
                # Every step it says it reuses and its parent completed has its seed.
                assert seeded == dict.fromkeys(reused, "reused"), (from_step, at, seeded)
                outcomes.add("seeded")
                await store.cancel(plan.run_id)
        # The prune landed both before the rerun's insert (refused) and after it.
        assert outcomes == {"refused", "seeded"}
    finally:
        await store.aclose()


async def test_a_prune_holding_the_parent_makes_the_rerun_wait_then_refuse(
    postgres: str, recipe: Path
) -> None:
    """Postgres, where a prune runs beside the rerun: a prune that deleted the parent but has
    not committed yet makes the rerun's insert wait for it, then refuse."""
    import sqlalchemy as sa
    from postgres import fresh_database

    url = fresh_database(postgres, f"racing{uuid.uuid4().hex[:8]}")
    store = RunStore(url, create=True)
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        done, _ = await store.submit(recipe)
        await run_here(url, done)
        parent = await ended_parent(store, done)
        hook = PruneAt(store)
        insert_started = threading.Event()
        original = hook.original

        async def apply(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            if getattr(fn, "__name__", "") == "insert":
                insert_started.set()
            return await original(fn, *args, **kwargs)

        setattr(hook.database, "apply", apply)  # noqa: B010 (typed as a method)
        with engine.connect() as pruning:
            deleted = pruning.execute(
                sa.text("DELETE FROM minions_runs WHERE run_id = :id"), {"id": parent}
            ).rowcount
            assert deleted == 1
            rerun = asyncio.create_task(store.rerun(parent, from_step="ship"))
            # The rerun waits on the parent's row (a lock wait seen by Postgres, not a sleep).
            await until(
                lambda: (
                    rerun.done() or (insert_started.is_set() and waiting_on_a_lock(engine, pruning))
                )
            )
            assert not rerun.done()
            pruning.commit()
        with pytest.raises(UnknownRunError):
            await rerun
        assert [r.run_id for r in await store.list_runs()] == [done]
    finally:
        engine.dispose()
        await store.aclose()


async def test_a_prune_meeting_a_held_parent_waits_for_the_rerun(
    postgres: str, recipe: Path
) -> None:
    """Postgres, the other order: a prune that comes while the rerun's insert holds the
    parent waits for its commit (a lock wait seen by Postgres), then deletes the parent; the
    rerun has every seed."""
    import sqlalchemy as sa
    from postgres import fresh_database

    from minions.runs._db import Database

    url = fresh_database(postgres, f"racing{uuid.uuid4().hex[:8]}")
    store = RunStore(url, create=True)
    other = Database(url)
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        done, _ = await store.submit(recipe)
        await run_here(url, done)
        parent = await ended_parent(store, done)
        hook = PruneAt(store)
        original = hook.original
        pruned: list[int] = []

        def prune_beside() -> None:
            pruned.append(
                prune.prune(other, before=time.time() + 60, statuses=("cancelled",), pause=0).runs
            )

        async def apply(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            if getattr(fn, "__name__", "") != "insert":
                return await original(fn, *args, **kwargs)
            seeds = kwargs["seeds"]

            def holding(db: Any) -> Any:
                found = seeds(db)  # the parent is held from here to the commit
                pid = db.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
                thread = threading.Thread(target=prune_beside)
                thread.start()
                give_up = time.monotonic() + 60
                with engine.connect() as watch:
                    while not watch.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_stat_activity "
                            "WHERE :pid = ANY(pg_blocking_pids(pid))"
                        ),
                        {"pid": pid},
                    ).scalar_one():
                        assert thread.is_alive(), "the prune did not wait for the rerun"
                        assert time.monotonic() < give_up, "the prune never met the held parent"
                threads.append(thread)
                return found

            return await original(fn, *args, **{**kwargs, "seeds": holding})

        threads: list[threading.Thread] = []
        setattr(hook.database, "apply", apply)  # noqa: B010 (typed as a method)
        plan = await store.rerun(parent, from_step="ship")
        setattr(hook.database, "apply", original)  # noqa: B010 (typed as a method)
        await asyncio.to_thread(threads[0].join)
        assert pruned == [1]  # the parent, once the rerun had committed
        rerun = await store.get(plan.run_id)
        assert {s.step_id: s.status for s in rerun.steps} == {"fetch": "reused", "draft": "reused"}
        assert parent not in {r.run_id for r in await store.list_runs()}
    finally:
        engine.dispose()
        other.close()
        await store.aclose()


def waiting_on_a_lock(engine: Any, holder: Any) -> bool:
    """Whether a session waits for a lock that `holder`'s session holds."""
    import sqlalchemy as sa

    pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    with engine.connect() as db:
        return bool(
            db.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
                ),
                {"pid": pid},
            ).scalar_one()
        )
