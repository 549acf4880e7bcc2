"""The seam durable runs use: a store of finished step executions, asked before each step.

A run given `StepCheckpoints` asks it, before a step runs, for a finished execution of that
step and visit: one found is used as it is (its output, usage and the routing it chose), and
the step does not run again; nothing else of it is emitted again. A step that completes is
handed to `save` before the run moves on, and each completed item of its loop steps to
`save_item` (`minions._step.checkpoints`). A run that `resumed` does not say `RunStarted`
again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from minions._routing.selection import Routing
from minions._step.checkpoints import ItemCheckpoints
from minions._step.execution import StepExecution

__all__: list[str] = []


class StepCheckpoints(ItemCheckpoints, Protocol):
    @property
    def resumed(self) -> bool:
        """The run goes on from stored work (it started before): `RunStarted` is not said
        again."""
        ...

    @property
    def attempt(self) -> int | None:
        """Which attempt of a durable run this execution is (its spans say so); None for a
        run that has no attempts."""
        ...

    async def restore(
        self, step_id: str, visit: int
    ) -> tuple[StepExecution, Routing | None] | None:
        """The finished execution of `step_id`'s `visit` and its routing, if saved."""
        ...

    async def save(
        self, execution: StepExecution, routing: Routing | None, announce: Callable[[], None]
    ) -> None:
        """Keep a completed execution (and the routing it chose) for a later restore, and call
        `announce` (which emits the step's `StepCompleted`) so that its event is stored with
        the checkpoint, never without it."""
        ...
