"""The checkpoints table (``minions_steps``): each finished step execution and loop item of a
run, so that a run goes on after a crash from its last one and a rerun starts with the steps
it reuses. This module is their only codec: what a checkpoint stores (its execution as
`StepExecution.to_data` writes it, its routing, and for a step a rerun reused, where it came
from) is read and written here, and nowhere else.

A checkpoint is written by its run's holder with the events that tell of it, in one commit
(`minions.runs._leases.append`), or, for a rerun, copied from its parent when the rerun is
queued (`minions.runs._rerun.seeds`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from minions._step.execution import StepExecution
from minions.runs._db import dumps
from minions.runs._tables import steps_table

if TYPE_CHECKING:
    from minions._routing.selection import Routing
    from minions.runs._db import Database

__all__ = ["StepRecord"]

COLUMNS = ("step_id", "visit", "status", "execution", "routing", "saved_at", "item")
"""The columns of a checkpoint after its run's id, in the order of `Checkpoint.row`."""
DONE: frozenset[str] = frozenset({"completed", "reused"})
"""The statuses of a step record whose result stands: it completed, in this run or (for a
step a rerun reused) in the run it comes from."""


@dataclass(frozen=True, kw_only=True)
class Reuse:
    """Where the recorded result of a step a rerun reused comes from.

    Attributes:
        run_id: the run that executed it (a rerun of a rerun names the first).
        usage: what its execution there cost (the reused step itself costs nothing).
        edited: its output was set by hand.
    """

    run_id: str
    usage: Mapping[str, int] = field(default_factory=dict)
    edited: bool = False


_KEEP: Any = object()
"""`Checkpoint.reused`: the recorded output stays."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A finished step execution or loop item, as its run keeps it.

    Attributes:
        name: the step's id, or a loop item's (``step[index]``).
        visit: the step's visit.
        status: the execution's status, or ``reused`` (a rerun's copy of its parent's).
        data: the execution as `StepExecution.to_data` wrote it (with the note of where a
            reused one comes from): read it through the properties.
        routing: what the step's transitions chose (None for a loop item).
        item: a loop item's index.
        saved_at: when it was saved (the order `minions runs show` lists steps in).
    """

    name: str
    visit: int
    status: str
    data: Mapping[str, Any]
    routing: Routing | None = None
    item: int | None = None
    saved_at: float = 0.0

    @classmethod
    def of(
        cls,
        execution: StepExecution,
        *,
        routing: Routing | None = None,
        item: int | None = None,
        saved_at: float,
    ) -> Checkpoint:
        """The checkpoint of a finished execution (a loop item's when `item` is given)."""
        return cls(
            name=execution.step_id,
            visit=execution.visit,
            status=execution.status.value,
            data=execution.to_data(),
            routing=routing,
            item=item,
            saved_at=saved_at,
        )

    @property
    def execution(self) -> StepExecution:
        """The execution, restored (its calls are not kept: the event log has them)."""
        return StepExecution.from_data(self.data)

    @property
    def output(self) -> Any:
        return self.data.get("output")

    @property
    def completed(self) -> bool:
        """The execution completed (a reused one did, in the run it comes from)."""
        return self.data.get("status") == "completed"

    @property
    def reuse(self) -> Reuse | None:
        """Where a reused step comes from (None: this run executed it)."""
        note = self.data.get("reused")
        if note is None:
            return None
        return Reuse(
            run_id=note["run_id"], usage=note.get("usage", {}), edited=bool(note.get("edited"))
        )

    @property
    def usage(self) -> dict[str, int]:
        return dict(self.data.get("usage", {}))

    def reused(
        self, parent_run_id: str, *, now: float, saved_at: float, output: Any = _KEEP
    ) -> Checkpoint:
        """This checkpoint as a rerun of its run reuses it: status ``reused``, no calls and
        no new usage, with the note of the run that executed it and what that cost (a
        checkpoint its run reused already keeps its note); `output` replaces the recorded
        output (set by hand)."""
        earlier = self.reuse
        data = dict(self.data)
        edited = output is not _KEEP
        if edited:
            data["output"] = output
        data.update(usage={}, model_calls=0, tool_calls=0, started_at=now, finished_at=now)
        data["reused"] = {
            "run_id": parent_run_id if earlier is None else earlier.run_id,
            "usage": self.usage if earlier is None else dict(earlier.usage),
            "edited": edited,
        }
        return dataclasses.replace(self, status="reused", data=data, saved_at=saved_at)

    def record(self) -> StepRecord:
        """The checkpoint as `minions runs show` lists it."""
        return _record(self.data, status=self.status)

    def row(self, run_id: str) -> tuple[Any, ...]:
        """The checkpoint's row of run `run_id` (the run's id, then `COLUMNS`)."""
        routing = None if self.routing is None else dumps(self.routing.to_data())
        return (
            run_id,
            self.name,
            self.visit,
            self.status,
            dumps(self.data),
            routing,
            self.saved_at,
            self.item,
        )


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """A finished step execution as stored: what `minions runs show` lists.

    Attributes:
        attempts: the model calls' first attempts (a retried call counts once).
        items: how many loop items the step ran (0: not a loop).
        started_at: when the step started (Unix seconds; ``None`` for a skipped step).
        finished_at: when it ended.
        model_calls: the model calls it made, retries included.
        tool_calls: the tool calls it made.
        loop_items: its loop items' executions, in item order (``step[0]``, ``step[1]``...).
    """

    step_id: str
    visit: int
    status: str
    output: Any = None
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    attempts: int = 1
    items: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    model_calls: int = 0
    tool_calls: int = 0
    loop_items: tuple[StepRecord, ...] = ()
    duration: float | None = None
    waited: float = 0.0
    """Seconds of `duration` it waited (for its endpoint's limits, for approvals) rather than
    worked."""
    reused_from: str | None = None
    """For a step a rerun reused (status ``reused``): the run that executed it."""
    reused_usage: dict[str, int] = field(default_factory=dict)
    """For a reused step: the usage of its original execution (its own `usage` is zero)."""


def _record(data: Mapping[str, Any], *, status: str | None = None) -> StepRecord:
    """A stored execution as a record; its loop items too."""
    items = data.get("items", [])
    reused = data.get("reused") or {}
    started, finished = data.get("started_at"), data.get("finished_at")
    return StepRecord(
        step_id=data["step_id"],
        visit=data.get("visit", 1),
        status=status or data["status"],
        output=data.get("output"),
        error=data.get("error"),
        usage=data.get("usage", {}),
        attempts=data.get("attempts", 1),
        items=len(items),
        started_at=started,
        finished_at=finished,
        model_calls=data.get("model_calls", 0),
        tool_calls=data.get("tool_calls", 0),
        loop_items=tuple(_record(item) for item in items),
        duration=None if started is None or finished is None else finished - started,
        waited=data.get("waited", 0.0),
        reused_from=reused.get("run_id"),
        reused_usage=reused.get("usage", {}),
    )


def _checkpoint(row: Any) -> Checkpoint:
    from minions._routing.selection import Routing  # the runner's: loaded with the agent layer

    return Checkpoint(
        name=row.step_id,
        visit=row.visit,
        status=row.status,
        data=json.loads(row.execution),
        routing=None if row.routing is None else Routing.from_data(json.loads(row.routing)),
        item=row.item,
        saved_at=row.saved_at,
    )


# -- reads ---------------------------------------------------------------------------------------


def saved(database: Database, run_id: str) -> dict[tuple[str, int], Checkpoint]:
    """Every checkpoint of the run, steps and loop items, by name and visit, in the order
    they were saved (one query)."""
    with database.read() as db:
        return saved_in(db, run_id)


# -- in a caller's transaction -------------------------------------------------------------------


def saved_in(db: sa.Connection, run_id: str) -> dict[tuple[str, int], Checkpoint]:
    """`saved`, in the caller's transaction."""
    rows = db.execute(
        sa.select(steps_table)
        .where(steps_table.c.run_id == run_id)
        .order_by(steps_table.c.saved_at)
    )
    return {(r.step_id, r.visit): _checkpoint(r) for r in rows}


def records(db: sa.Connection, run_id: str) -> tuple[StepRecord, ...]:
    """The run's finished steps (their loop items inside them), in the order they were
    saved."""
    return tuple(
        _record(json.loads(row.execution), status=row.status)
        for row in db.execute(
            sa.select(steps_table.c.execution, steps_table.c.status)
            .where(steps_table.c.run_id == run_id, steps_table.c.item.is_(None))
            .order_by(steps_table.c.saved_at)
        )
    )


def usage(db: sa.Connection, run_id: str) -> dict[str, int]:
    """The usage of the run's finished steps, together."""
    total: dict[str, int] = {}
    for row in db.execute(
        sa.select(steps_table.c.execution).where(
            steps_table.c.run_id == run_id, steps_table.c.item.is_(None)
        )
    ):
        for key, value in json.loads(row.execution).get("usage", {}).items():
            total[key] = total.get(key, 0) + int(value)
    return total


def insert(db: sa.Connection, run_id: str, checkpoints: Sequence[Checkpoint]) -> None:
    """Store these checkpoints of the run (a rerun's, copied from its parent)."""
    if checkpoints:
        db.execute(
            steps_table.insert(),
            [dict(zip(("run_id", *COLUMNS), c.row(run_id), strict=True)) for c in checkpoints],
        )


def forget(db: sa.Connection, run_ids: Sequence[str]) -> None:
    """Delete the checkpoints of these runs (pruning)."""
    db.execute(steps_table.delete().where(steps_table.c.run_id.in_(list(run_ids))))
