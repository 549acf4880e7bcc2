"""The seam durable runs use inside a step: the finished items of a loop, each a checkpoint.

A loop item that completed is handed to `save_item`; when the run goes on after a crash or a
resume, `restore_item` gives it back and the item is not run again (its usage counts, nothing
of it is emitted again). Only the items of a run's own loop steps are checkpointed (not those
of a loop inside another loop or inside a sub-recipe, which run again with their step).
"""

from __future__ import annotations

from typing import Protocol

from minions._step.execution import StepExecution

__all__: list[str] = []


class ItemCheckpoints(Protocol):
    async def restore_item(self, name: str, visit: int) -> StepExecution | None:
        """The finished execution of loop item `name` (``step[index]``) in `visit`."""
        ...

    async def save_item(self, execution: StepExecution, item: int) -> None:
        """Keep a completed loop item's execution for a later `restore_item`."""
        ...
