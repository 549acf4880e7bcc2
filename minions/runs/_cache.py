"""The step cache of durable runs: entries in the run store, so every worker (and every
foreground run given the store) shares them."""

from __future__ import annotations

import time
from collections.abc import Callable

from minions._step.cache import CachedStep
from minions.runs._async import AsyncStore

__all__: list[str] = []


class StoreStepCache:
    """A `StepCache` in the run store's ``minions_step_cache`` table.

    Args:
        store: the store.
        clock: the time (``time.time``; tests give their own to make entries expire).
    """

    def __init__(self, store: AsyncStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def get(self, key: str, *, ttl: float | None) -> CachedStep | None:
        found = await self.store.call(self.store.store.cached_step, key)
        if found is None:
            return None
        step_id, output, next_step, usage, created_at = found
        if ttl is not None and self.clock() - created_at > ttl:
            return None
        return CachedStep(
            output=output, next_step=next_step, usage=usage, step_id=step_id, created_at=created_at
        )

    async def put(self, key: str, entry: CachedStep) -> None:
        await self.store.call(
            self.store.store.cache_step,
            key,
            step_id=entry.step_id,
            output=entry.output,
            next_step=entry.next_step,
            usage=entry.usage,
            now=self.clock(),
        )
