"""A holder's hold on a run: its lease on the run's row (the holder, an epoch, until when), and
every write the holder makes under it.

A worker claims a run under a new epoch, which fences every earlier holder out; from then on
each of its writes names the epoch, and one made after the run moved on (the holder was
declared dead, the run was cancelled from outside, a second worker took the id) writes
nothing and says `LeaseLost`: the holder stands down. Its events, a finished step's
checkpoint and the run's new values go in one commit (`append`), on Postgres one statement.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa

from minions.errors import StoreError, UnknownRunError
from minions.runs import _approvals as approvals
from minions.runs import _runs as runs
from minions.runs._checkpoints import COLUMNS as CHECKPOINT_COLUMNS
from minions.runs._db import dumps
from minions.runs._events import COLUMNS as EVENT_COLUMNS
from minions.runs._events import driver_rows as events_driver_rows
from minions.runs._queue import status_table
from minions.runs._runs import RerunPlan
from minions.runs._snapshot import RecipeSnapshot
from minions.runs._streams import CHANNEL as DELTAS_CHANNEL
from minions.runs._streams import NOTIFY as DELTAS_NOTIFY
from minions.runs._tables import ACTIVE, ACTIVE_SQL, HELD, TERMINAL, runs_table

if TYPE_CHECKING:
    from minions.runs._approvals import ApprovalRecord, Deadlines
    from minions.runs._checkpoints import Checkpoint
    from minions.runs._db import Database
    from minions.runs._events import EventRow
    from minions.runs._runs import RunRecord

__all__: list[str] = []


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A worker's hold on a run: every write of the holder names its epoch."""

    run_id: str
    holder: str
    epoch: int
    attempt: int


class LeaseLost(Exception):
    """The run is no longer this holder's (its epoch moved on): the holder stands down."""


@dataclass(frozen=True, kw_only=True)
class Start:
    """What a worker needs to start (or go on with) a run it claimed, read in the claim."""

    lease: Lease
    record: RunRecord
    snapshot: RecipeSnapshot
    last_seq: int
    """The number of the run's last stored event (its events go on after it)."""
    rerun: RerunPlan | None = None
    """For a rerun: its plan (the parent, the steps it reuses, the outputs set by hand)."""


Refusal = Literal["held", "stale", "ended"]
"""Why a claim was refused: another holder's lease is alive; the attempt is not the run's
current one (a stale delivery); the run has ended."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Watch:
    """What the holder of a run watches while it runs."""

    epoch: int
    """The run's epoch now: another than the lease's, and the run is someone else's."""
    cancel_requested: bool
    """A client asked to cancel it."""
    workflow_status: str | None
    """DBOS's status of the attempt's workflow (``CANCELLED``: an operator cancelled it
    through DBOS); None when DBOS has no such workflow."""


def claim(
    database: Database,
    run_id: str,
    *,
    attempt: int,
    holder: str,
    executor_id: str,
    lease_until: float,
    now: float,
) -> Start | Refusal:
    """Take the run for `holder`: attempt `attempt` is the current one, it has not ended,
    and nobody holds it (or the holder's lease ran out). A new epoch fences every earlier
    holder out."""
    given = {"attempt": attempt, "holder": holder, "executor_id": executor_id}
    with database.statement() as db:
        row = claimed_row(db, run_id, **given, lease_until=lease_until, now=now)
    return start_of(database, run_id, row, attempt=attempt, holder=holder)


def claimed_row(db: sa.Connection, run_id: str, **claiming: Any) -> Any:
    """The claim's statement (see `claim`; `claiming`: its keyword arguments but the
    database), in the caller's transaction: the run's row as claimed, or None."""
    return db.execute(_CLAIM, {"run_id": run_id, **claiming}).one_or_none()


def start_of(
    database: Database, run_id: str, row: Any, *, attempt: int, holder: str
) -> Start | Refusal:
    """What a claim that gave `row` (None: it took nothing) starts, or why it was refused."""
    if row is None:
        with database.read() as db:
            found = runs.row(db, run_id)
        if found.status not in ACTIVE:
            return "ended"
        return "stale" if found.attempt != attempt else "held"
    return Start(
        lease=Lease(run_id=run_id, holder=holder, epoch=row.epoch, attempt=attempt),
        record=runs.record(row),
        snapshot=RecipeSnapshot.from_row(row),
        last_seq=int(row.last_seq),
        rerun=None
        if row.rerun is None
        else RerunPlan.from_data(json.loads(row.rerun), run_id=run_id),
    )


def watch(database: Database, run_id: str, workflow_id: str) -> Watch:
    """What the holder of a run watches while it runs: the run's epoch, whether a cancel
    was asked (here, or by an operator through DBOS: ``dbos workflow cancel``), and DBOS's
    status of the workflow.

    Raises:
        UnknownRunError: no run has this id (it was pruned).
    """
    dbos = status_table(database.postgres)
    with database.read() as db:
        row = db.execute(
            sa.text(
                "SELECT r.epoch, r.cancel_requested, w.status FROM minions_runs r "
                f"LEFT JOIN {dbos} w ON w.workflow_uuid = :workflow WHERE r.run_id = :run"
            ),
            {"run": run_id, "workflow": workflow_id},
        ).one_or_none()
    if row is None:
        raise UnknownRunError(run_id)
    return Watch(
        epoch=int(row.epoch),
        cancel_requested=bool(row.cancel_requested),
        workflow_status=row.status,
    )


def append(
    database: Database,
    lease: Lease,
    *,
    after: int,
    events: Sequence[EventRow],
    checkpoint: Checkpoint | None = None,
    run: Mapping[str, Any] | None = None,
    deltas: Sequence[str] = (),
) -> None:
    """Store the holder's events (numbered after `after`, the log's head it knows), a
    finished step's checkpoint and the run's new values, in one commit, if the lease
    still holds; on Postgres, notify `deltas` (token deltas before the events,
    `minions.runs._streams`) on their channel in it.

    A commit whose answer was lost (the connection dropped) may be tried again: one that
    was done already is recognized by the head it moved.

    Raises:
        LeaseLost: the run's epoch moved on: nothing was written.
    """
    new = events[-1].seq if events else after
    values = _encoded(dict(run or {}))
    if values.get("status") in TERMINAL:
        values.update(holder=None, lease_until=None)
    values["last_seq"] = new
    rows = events_driver_rows(lease.run_id, events)
    step_row = None if checkpoint is None else checkpoint.row(lease.run_id)
    # On Postgres the commit is one statement (a transaction of its own) unless thousands
    # of events go in chunks.
    with database.statement() if len(rows) <= _CHUNK else database.begin() as db:
        # The step loop waits on this commit, so its statements go straight to the driver
        # (SQLAlchemy's compiled statements cost as much as the commit itself).
        cursor = db.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            if database.postgres:
                done = _append_postgres(cursor, lease, after, values, rows, step_row, deltas)
            else:
                done = _append_sqlite(cursor, lease, after, values, rows, step_row)
        finally:
            cursor.close()
    if not done:
        _append_refused(database, lease, after=after, new=new)


def _append_refused(database: Database, lease: Lease, *, after: int, new: int) -> None:
    with database.read() as db:
        row = db.execute(
            sa.select(runs_table.c.epoch, runs_table.c.last_seq).where(
                runs_table.c.run_id == lease.run_id
            )
        ).one_or_none()
    if row is None or row.epoch != lease.epoch:
        raise LeaseLost(lease.run_id)
    if row.last_seq == new and new > after:
        return  # this very commit went through before its answer was lost
    raise StoreError(
        f"the event log of run {lease.run_id} is at {row.last_seq}, not at {after} as its "
        "holder believes"
    )


def renew(database: Database, lease: Lease, *, lease_until: float) -> None:
    """Renew one lease, if it still holds (a holder unsure of it, before a side effect).

    Raises:
        LeaseLost: the run is no longer this holder's.
    """
    _held_update(database, lease, lease_until=lease_until)


def _held_update(database: Database, lease: Lease, **values: Any) -> None:
    """Set `values` on the run while `lease` holds it (its epoch is the run's).

    Raises:
        LeaseLost: the run is no longer this holder's.
    """
    with database.statement() as db:
        updated = db.execute(
            runs_table.update()
            .where(
                runs_table.c.run_id == lease.run_id,
                runs_table.c.epoch == lease.epoch,
                runs_table.c.status.in_(HELD),
            )
            .values(**values)
        ).rowcount
    if not updated:
        raise LeaseLost(lease.run_id)


def request_approval(
    database: Database,
    lease: Lease,
    *,
    call_id: str,
    step_id: str,
    tool: str,
    arguments: Any,
    deadlines: Deadlines | None = None,
) -> ApprovalRecord:
    """Record a request once (a step run again asks the same call again), as the holder,
    with its `deadlines`, and what is recorded of it (its decision, when it was decided
    before).

    Raises:
        LeaseLost: the run is no longer this holder's.
    """
    with database.begin() as db:
        if not runs.lock(db, lease.run_id, runs_table.c.epoch == lease.epoch):
            raise LeaseLost(lease.run_id)
        return approvals.request(
            database,
            db,
            lease.run_id,
            call_id=call_id,
            step_id=step_id,
            tool=tool,
            arguments=arguments,
            deadlines=deadlines,
        )


def park(
    database: Database, lease: Lease, *, call_id: str, resume: str | None = None
) -> ApprovalRecord | None:
    """Give the run back while call `call_id` waits for a decision: it stays `waiting`,
    held by nobody, under a new epoch (the holder is fenced out: its execution ends here)
    and a new attempt that is not queued (a delivery of this one is stale); a decision
    queues that attempt (`minions.runs._decisions`). `resume` (`Resume.text`: what the
    waiting step keeps to go on at the call; None: nothing) is kept at the call in the same
    transaction: a run is never parked without it, nor is it kept for a run not parked. The
    decision itself when one came first (the run is not parked: the holder goes on with it).

    The run's row is locked before the call is read, as a decision locks it before it
    decides: of a park and a decision at once, the decision sees the run parked (and
    queues it), or the park sees the decision.

    Raises:
        LeaseLost: the run is no longer this holder's.
    """
    held = (runs_table.c.epoch == lease.epoch, runs_table.c.status.in_(HELD))
    with database.begin() as db:
        if not runs.lock(db, lease.run_id, *held):
            raise LeaseLost(lease.run_id)
        found = approvals.get_in(db, lease.run_id, call_id)
        if found is None:
            raise StoreError(f"run {lease.run_id} has no request of call {call_id!r}")
        if found.decided_at is not None:
            return found
        approvals.keep(db, lease.run_id, call_id, resume)
        _parked(db, lease.run_id)
    return None


def _parked(db: sa.Connection, run_id: str) -> None:
    """The run's row as parked: `waiting`, held by nobody, its next attempt not queued."""
    runs = runs_table.c
    db.execute(
        runs_table.update()
        .where(runs.run_id == run_id)
        .values(
            status="waiting",
            holder=None,
            lease_until=None,
            epoch=runs.epoch + 1,
            attempt=runs.attempt + 1,
        )
    )


def release(database: Database, holder: str, run_ids: Sequence[str] = ()) -> None:
    """A stopping worker lets go of its runs (of `run_ids`, or all): any live worker takes
    them over at once, from their last checkpoint."""
    query = runs_table.update().where(runs_table.c.holder == holder, runs_table.c.status.in_(HELD))
    if run_ids:
        query = query.where(runs_table.c.run_id.in_(list(run_ids)))
    with database.begin() as db:
        db.execute(query.values(lease_until=0.0))


def renew_held(
    db: sa.Connection, holder: str, run_ids: Sequence[str], lease_until: float
) -> set[str]:
    """Renew the leases `holder` has of `run_ids` (a worker's heartbeat, in its
    transaction): the runs it still holds."""
    if not run_ids:
        return set()
    mine = (
        runs_table.c.holder == holder,
        runs_table.c.run_id.in_(list(run_ids)),
        runs_table.c.status.in_(HELD),
    )
    db.execute(runs_table.update().where(*mine).values(lease_until=lease_until))
    return set(db.execute(sa.select(runs_table.c.run_id).where(*mine)).scalars())


# -- statements ----------------------------------------------------------------------------------

_STEP_COLUMNS = f"(run_id, {', '.join(CHECKPOINT_COLUMNS)})"
_RUN_VALUES = frozenset(
    {"status", "finished_at", "output", "error", "usage", "last_seq", "holder", "lease_until"}
)
"""The run's values its holder writes."""


def _encoded(values: dict[str, Any]) -> dict[str, Any]:
    """Run values as stored: the output and the usage as JSON text."""
    for key in ("output", "usage"):
        if key in values:
            values[key] = dumps(values[key])
    return values


def _set_clause(values: Mapping[str, Any], placeholder: str) -> tuple[str, list[Any]]:
    unknown = set(values) - _RUN_VALUES
    if unknown:
        raise ValueError(f"not a run value a holder writes: {sorted(unknown)}")
    return ", ".join(f"{k} = {placeholder}" for k in values), list(values.values())


def _append_sqlite(
    cursor: Any,
    lease: Lease,
    after: int,
    values: Mapping[str, Any],
    rows: Sequence[tuple[Any, ...]],
    step_row: tuple[Any, ...] | None,
) -> bool:
    clause, params = _set_clause(values, "?")
    cursor.execute(
        f"UPDATE minions_runs SET {clause} WHERE run_id = ? AND epoch = ? AND last_seq = ?",
        [*params, lease.run_id, lease.epoch, after],
    )
    if cursor.rowcount != 1:
        return False
    if rows:
        cursor.executemany(
            f"INSERT INTO minions_events {EVENT_COLUMNS} VALUES (?, ?, ?, ?, ?)", rows
        )
    if step_row is not None:
        cursor.execute(
            f"INSERT INTO minions_steps {_STEP_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", step_row
        )
    return True


_CHUNK = 1000
"""Events a statement inserts at most (a statement holds at most 65,535 parameters)."""


def _append_postgres(
    cursor: Any,
    lease: Lease,
    after: int,
    values: Mapping[str, Any],
    rows: Sequence[tuple[Any, ...]],
    step_row: tuple[Any, ...] | None,
    deltas: Sequence[str] = (),
) -> bool:
    # One statement, one round trip: the fenced update of the run, the inserts as data-modifying
    # CTEs that happen only when it did, and the notice to followers (they LISTEN, and learn of
    # new events at this commit), after the token deltas before those events.
    clause, params = _set_clause(values, "%s")
    parts = [
        f"r AS (UPDATE minions_runs SET {clause} WHERE run_id = %s AND epoch = %s "
        "AND last_seq = %s RETURNING 1)"
    ]
    params += [lease.run_id, lease.epoch, after]
    *before, last = [rows[i : i + _CHUNK] for i in range(0, len(rows), _CHUNK)] or [[]]
    if before:  # thousands of events at once (a big loop): a statement holds at most 65,535
        # parameters; the earlier chunks go first, fenced by the same condition
        cursor.execute(
            "SELECT 1 FROM minions_runs WHERE run_id = %s AND epoch = %s AND last_seq = %s "
            "FOR UPDATE",
            [lease.run_id, lease.epoch, after],
        )
        if cursor.fetchone() is None:
            return False
        for chunk in before:
            cursor.executemany(
                f"INSERT INTO minions_events {EVENT_COLUMNS} VALUES (%s, %s, %s, %s, %s)", chunk
            )
    if last:
        typed = "(%s::text, %s::integer, %s::text, %s::text, %s::text)"
        parts.append(
            f"e AS (INSERT INTO minions_events {EVENT_COLUMNS} SELECT * FROM (VALUES "
            f"{', '.join([typed] * len(last))}) AS v WHERE EXISTS (SELECT 1 FROM r))"
        )
        params += [value for row in last for value in row]
    if step_row is not None:
        parts.append(
            f"s AS (INSERT INTO minions_steps {_STEP_COLUMNS} SELECT %s::text, %s::text, "
            "%s::integer, %s::text, %s::text, %s::text, %s::double precision, %s::integer "
            "WHERE EXISTS (SELECT 1 FROM r))"
        )
        params += step_row
    told = ""
    if deltas:
        parts.append(f"d AS ({DELTAS_NOTIFY})")
        params += [DELTAS_CHANNEL, list(deltas)]
        told = "(SELECT * FROM d), "
    params.append(lease.run_id)
    cursor.execute(
        f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM r), {told}"
        "pg_notify('minions_events', %s)",
        params,
    )
    found = cursor.fetchone()
    return bool(found and found[0])


_CLAIM = sa.text(
    # Written out once (every run's start pays for it; SQLAlchemy's expression of it cost a
    # millisecond of CPU to build and compile each time). Never the same holder again: a
    # second delivery of a run its holder runs already would fence out the execution in
    # flight after its effects.
    # A run waiting for a person's decision is parked (held by nobody, its attempt not
    # queued) until the decision queues it: no claim finds it `waiting` and undecided.
    "UPDATE minions_runs SET holder = :holder, epoch = epoch + 1, lease_until = :lease_until, "
    "status = 'running', executor_id = :executor_id, "
    "started_at = coalesce(started_at, :now), claimed_at = :now, starts = starts + 1, "
    "finished_at = NULL, error = NULL "
    f"WHERE run_id = :run_id AND attempt = :attempt AND status IN ({ACTIVE_SQL}) "
    "AND (holder IS NULL OR lease_until IS NULL OR lease_until < :now) "
    f"RETURNING {', '.join(c.name for c in runs_table.c)}"
).columns(*runs_table.c)
