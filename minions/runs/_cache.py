"""The step cache table: the outputs of steps that say `cache`, in the run store, so every
worker (and every foreground run given the store) shares them. An entry is keyed by the
rendered step and its world (see `minions._step.cache`); a newer one replaces it. An entry
belongs to the run that made it (a sub-recipe's, to its outer run): pruning the run deletes
it; `minions cache clear` deletes entries by recipe, or all."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from minions._step.cache import CachedStep
from minions.runs import _audit
from minions.runs._db import dumps
from minions.runs._tables import step_cache_table

if TYPE_CHECKING:
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database

__all__ = ["CacheEntry"]


@dataclass(frozen=True, kw_only=True)
class CacheEntry:
    """An entry of the store's step cache: its key and what it keeps."""

    key: str
    step: CachedStep
    """The cached step: its output, the step, the run that made it (pruned with it), its
    recipe, when, and what each hit saves."""


def entry_of(database: Database, key: str) -> CachedStep | None:
    """The entry of `key` (None: there is none)."""
    with database.read() as db:
        row = db.execute(
            sa.select(step_cache_table).where(step_cache_table.c.key == key)
        ).one_or_none()
    return None if row is None else _entry(row)


def _entry(row: Any) -> CachedStep:
    return CachedStep(
        output=json.loads(row.output),
        next_step=row.next_step,
        usage=json.loads(row.usage),
        step_id=row.step_id,
        created_at=row.created_at,
        run_id=row.run_id or "",
        recipe_id=row.recipe_id or "",
    )


def owner(run_id: str) -> str:
    """The stored run an entry made by run `run_id` belongs to: a sub-recipe's inner run
    (``RUN.step``) belongs to its outer run."""
    return run_id.partition(".")[0]


def keep(database: Database, key: str, entry: CachedStep, *, now: float) -> None:
    """Keep `entry` under `key`, made at `now` (a newer one replaces it)."""
    values = {
        "key": key,
        "step_id": entry.step_id,
        "output": dumps(entry.output),
        "next_step": entry.next_step,
        "usage": dumps(dict(entry.usage)),
        "created_at": now,
        "run_id": owner(entry.run_id) or None,
        "recipe_id": entry.recipe_id or None,
    }
    with database.begin() as db:
        db.execute(database.upsert(step_cache_table, values, key=["key"]))


def listed(database: Database, *, recipe: str | None = None, limit: int = 100) -> list[CacheEntry]:
    """Entries (of `recipe`'s runs), newest first."""
    query = sa.select(step_cache_table).order_by(step_cache_table.c.created_at.desc())
    if recipe is not None:
        query = query.where(step_cache_table.c.recipe_id == recipe)
    with database.read() as db:
        return [CacheEntry(key=row.key, step=_entry(row)) for row in db.execute(query.limit(limit))]


def count(database: Database, *, recipe: str | None = None) -> int:
    """How many entries there are (of `recipe`'s runs)."""
    query = sa.select(sa.func.count()).select_from(step_cache_table)
    if recipe is not None:
        query = query.where(step_cache_table.c.recipe_id == recipe)
    with database.read() as db:
        return int(db.execute(query).scalar_one())


def clear(
    database: Database, *, recipe: str | None = None, audit: Mapping[str, Any] | None = None
) -> int:
    """Delete every entry (of `recipe`'s runs); how many. `audit`: its entry, written with
    that count in the same transaction."""
    query = step_cache_table.delete()
    if recipe is not None:
        query = query.where(step_cache_table.c.recipe_id == recipe)
    with database.begin() as db:
        cleared = int(db.execute(query).rowcount)
        _audit.write(db, audit and _audit.told(audit, cleared=cleared))
        return cleared


def forget(db: sa.Connection, run_ids: Sequence[str]) -> None:
    """Delete the entries these runs made (pruning them), in the caller's transaction."""
    db.execute(step_cache_table.delete().where(step_cache_table.c.run_id.in_(list(run_ids))))


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
