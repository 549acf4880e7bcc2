"""The seam durable runs use inside a step: the finished items of a loop, each a checkpoint,
and the state of a step that waited at a call when its run parked.

A loop item that completed is handed to `save_item`; when the run goes on after a crash or a
resume, `restore_item` gives it back and the item is not run again (its usage counts, nothing
of it is emitted again). Only the items of a run's own loop steps are checkpointed (not those
of a loop inside another loop or inside a sub-recipe, which run again with their step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from minions._step.execution import StepExecution

__all__: list[str] = []


class ItemCheckpoints(Protocol):
    parks: bool
    """The run parks while a call waits for a decision (a durable run's worker): its steps
    that may wait keep their state at the call (`minions._step.resume`)."""

    def resume_at(self, scope: str) -> Mapping[str, Any] | str | None:
        """What the step execution `scope` kept when its run parked at one of its calls (the
        data of a `StepState`), to go on there; why it starts again from its start instead
        (its state was not kept); or None (nothing waited in it). Asked once, as the step's
        executor is made, and only when `parks`."""
        ...

    async def before_call(self) -> None:
        """Awaited before each tool call starts. A durable run confirms that its worker still
        holds the run (one frozen past its lease, or cut off from its store, must not start a
        side effect in a run another worker took over); it raises `asyncio.CancelledError`
        (the run's task is being cancelled) when it does not."""
        ...

    async def restore_item(self, name: str, visit: int) -> StepExecution | None:
        """The finished execution of loop item `name` (``step[index]``) in `visit`."""
        ...

    async def save_item(
        self, execution: StepExecution, item: int, announce: Callable[[], None]
    ) -> None:
        """Keep a completed loop item's execution for a later `restore_item`, and call
        `announce` (which emits the item's `StepCompleted`) so that its event is stored with
        the checkpoint, never without it."""
        ...
