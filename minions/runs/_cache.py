"""The step cache table: the outputs of steps that say `cache`, in the run store, so every
worker (and every foreground run given the store) shares them. An entry is keyed by the
rendered step (see `minions._step.cache`); a newer one replaces it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import sqlalchemy as sa

from minions._step.cache import CachedStep
from minions.runs._db import dumps
from minions.runs._tables import step_cache_table

if TYPE_CHECKING:
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database

__all__: list[str] = []


def entry_of(database: Database, key: str) -> CachedStep | None:
    """The entry of `key` (None: there is none)."""
    with database.read() as db:
        row = db.execute(
            sa.select(step_cache_table).where(step_cache_table.c.key == key)
        ).one_or_none()
    if row is None:
        return None
    return CachedStep(
        output=json.loads(row.output),
        next_step=row.next_step,
        usage=json.loads(row.usage),
        step_id=row.step_id,
        created_at=row.created_at,
    )


def keep(database: Database, key: str, entry: CachedStep, *, now: float) -> None:
    """Keep `entry` under `key`, made at `now` (a newer one replaces it)."""
    values = {
        "key": key,
        "step_id": entry.step_id,
        "output": dumps(entry.output),
        "next_step": entry.next_step,
        "usage": dumps(dict(entry.usage)),
        "created_at": now,
    }
    with database.begin() as db:
        db.execute(database.upsert(step_cache_table, values, key=["key"]))


class StoreStepCache:
    """A `StepCache` in the run store's ``minions_step_cache`` table.

    Args:
        database: the store's database.
        clock: the time (``time.time``; tests give their own to make entries expire).
    """

    def __init__(self, database: AsyncDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self.database = database
        self.clock = clock

    async def get(self, key: str, *, ttl: float | None) -> CachedStep | None:
        found = await self.database.apply(entry_of, key)
        if found is None or (ttl is not None and self.clock() - found.created_at > ttl):
            return None
        return found

    async def put(self, key: str, entry: CachedStep) -> None:
        await self.database.apply(keep, key, entry, now=self.clock())
