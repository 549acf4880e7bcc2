"""The runs table: each run's record (its recipe snapshot, inputs, status, result, lineage), and
the state changes its clients make, each a compare-and-set on the run's row: queue it (stored
and queued in one transaction), ask to cancel it, end it while nobody runs it, queue its next
attempt. What the holder of a run writes under its lease is `minions.runs._leases`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import sqlalchemy as sa

from minions._item import ItemId
from minions.errors import IdempotencyConflictError, RunStateError, UnknownRunError
from minions.runs import _approvals as approvals
from minions.runs import _audit
from minions.runs import _checkpoints as checkpoints
from minions.runs import _events as events
from minions.runs._db import dumps, loads
from minions.runs._snapshot import RecipeNode, RecipeSnapshot, recipe_graph
from minions.runs._tables import ACTIVE, HELD, TERMINAL, runs_table

if TYPE_CHECKING:
    from minions.events import Event
    from minions.runs._approvals import ApprovalRecord
    from minions.runs._checkpoints import Checkpoint, StepRecord
    from minions.runs._db import Database
    from minions.runs._events import EventRow

__all__ = ["RerunPlan", "RunRecord", "Submitted"]

Enqueue = Callable[[sa.Connection, str, int], None]
"""Queues attempt `n` of run `run_id` in the caller's transaction (DBOS's enqueue)."""


class Submitted(NamedTuple):
    """What a submit (`RunStore.submit`, `RunStore.submit_yaml`) returns: the run, and
    whether this submit queued it. Read it by name, or unpack it as a pair::

        submitted = await store.submit("recipe.yaml", idempotency_key="k1")
        print(submitted.run_id, submitted.created)
        run_id, created = await store.submit("recipe.yaml", idempotency_key="k1")

    Attributes:
        run_id: the run's id.
        created: True when this submit stored and queued the run; False when its
            `idempotency_key` named the same request before, and this is that request's
            run (nothing was queued).
    """

    run_id: str
    created: bool


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A run as stored.

    Attributes:
        attempt: 1, then one more each time the run was resumed, taken over from a worker
            that died, or handed back by a busy worker to one with a place free.
        executor_id: the worker that runs it (or ran it last).
    """

    run_id: str
    recipe_id: str
    status: str
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    recipe_path: str | None = None
    recipe_hash: str = ""
    executor_id: str | None = None
    cancel_requested: bool = False
    attempt: int = 1
    schedule: str | None = None
    """The schedule that fired it (None: submitted)."""
    slot: float | None = None
    """The slot of `schedule` it was fired for (a Unix time)."""
    steps: tuple[StepRecord, ...] = ()
    approvals: tuple[ApprovalRecord, ...] = ()
    parent_run_id: str | None = None
    """For a rerun: the run it reran."""
    from_step: str | None = None
    """For a rerun: the step it reran from."""
    queued_by: str | None = None
    """Who queued its current attempt (submitted, reran or resumed it): a key's name,
    ``token``, ``cli:USER``, ``schedule:NAME`` (None: a worker's takeover, or not known)."""
    cancelled_by: str | None = None
    """Who asked for its cancel."""
    project: str = "default"
    """Its project: a key sees the runs of its projects only."""
    held_back: str | None = None
    """Why it waits queued with no worker's attempt (its project is at a limit:
    ``max_runs_in_flight``, ``tokens_per_day``); a worker queues it when there is room."""
    rejected_by: str | None = None
    """For a failed run in which a person rejected a call: who (the latest rejection;
    ``''`` when who is not known). None otherwise."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def completed_steps(self) -> frozenset[str]:
        """The steps it completed (or a rerun reused): those whose output a rerun may set."""
        return frozenset(s.step_id for s in self.steps if s.status in checkpoints.DONE)

    @property
    def rerun_from(self) -> tuple[str, ...]:
        """The steps a rerun of it is offered from: none before it ends; then those that ran
        in it (completed, failed or reused, or a call of theirs waited for a person's
        decision), in the order they did."""
        if not self.terminal:
            return ()
        ran = [s.step_id for s in self.steps if s.status != "skipped"]
        ran += [ItemId.parse(a.step_id).step for a in self.approvals]
        return tuple(dict.fromkeys(ran))

    @property
    def outcome(self) -> str:
        """How the run stands for a person: its `status`, except ``rejected`` for a run that
        failed after a person rejected one of its calls (its status stays ``failed``)."""
        return (
            "rejected" if self.status == "failed" and self.rejected_by is not None else self.status
        )


@dataclass(frozen=True, kw_only=True)
class RunFilter:
    """Which runs a listing gives: each field given narrows it (all of them at once).

    Attributes:
        created_after: created at or after this time (Unix seconds).
        created_before: created before this time.
        id_prefix: run ids that start with this.
        schedule: fired by this schedule.
        projects: of one of these projects (None: of any).
    """

    status: str | None = None
    recipe: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    id_prefix: str | None = None
    schedule: str | None = None
    projects: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class RerunPlan:
    """What a rerun reuses of its parent and what it executes again, and why.

    Attributes:
        reused: the steps whose recorded results are reused (as recorded, or as `outputs`
            sets them); a step the parent never finished runs live.
        rerun: the steps executed again.
        changed: steps executed again for a reason of their own besides being downstream of
            `from_step`: ``"inputs"`` (their rendered templates change with the new inputs)
            or ``"definition"`` (the new recipe version changed them).
        cache: the steps executed again may answer from the step cache (asked for; by
            default they never do: each runs, and its entry replaces the cached one).
        editable: the reused steps whose output `outputs` may set (those the parent
            completed), as the plan was made (a plan read back from the store: none).
    """

    parent_run_id: str
    from_step: str
    run_id: str = ""
    """The rerun's id (once it is queued)."""
    reused: tuple[str, ...]
    rerun: tuple[str, ...]
    changed: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, Any] = field(default_factory=dict)
    cache: bool = False
    created: bool = True
    """False: an idempotency key named an earlier rerun, and this is its plan."""
    editable: tuple[str, ...] = ()

    def to_data(self) -> dict[str, Any]:
        """The plan as JSON data (what the rerun stores, and its worker reads)."""
        return {
            "parent_run_id": self.parent_run_id,
            "from_step": self.from_step,
            "reused": list(self.reused),
            "rerun": list(self.rerun),
            "changed": dict(self.changed),
            "outputs": dict(self.outputs),
            "cache": self.cache,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any], *, run_id: str = "") -> RerunPlan:
        """A plan stored by `to_data` (of the rerun `run_id`)."""
        return cls(
            parent_run_id=data["parent_run_id"],
            from_step=data["from_step"],
            run_id=run_id,
            reused=tuple(data["reused"]),
            rerun=tuple(data["rerun"]),
            changed=dict(data.get("changed", {})),
            outputs=dict(data.get("outputs", {})),
            cache=bool(data.get("cache", False)),
        )


ANY_RUN = RunFilter()
"""No filter: every run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Head:
    """A run's status and the number of its last stored event: what a follower looks at."""

    status: str
    last_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Expired:
    """A run held by nobody alive (its holder's lease ran out)."""

    run_id: str
    epoch: int
    recoveries: int
    """How often it was taken over from dead workers so far."""
    executor_id: str | None
    """The worker that held it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """A queued run's current attempt and epoch."""

    attempt: int
    epoch: int


# -- queuing -------------------------------------------------------------------------------------


def queued_row(
    snapshot: RecipeSnapshot,
    *,
    run_id: str,
    idempotency_key: str | None,
    rerun: RerunPlan | None = None,
    **values: Any,
) -> dict[str, Any]:
    """A new queued run's row: its snapshot, its idempotency key, for a rerun its plan
    (its parent and the step it reran from are columns too), `values` (a schedule's run:
    its schedule and slot), and the rest as a run starts."""
    row = {
        **snapshot.columns(),
        "run_id": run_id,
        "idempotency_key": idempotency_key,
        "status": "queued",
        "created_at": time.time(),
        "cancel_requested": False,
        "starts": 0,
        "epoch": 0,
        "attempt": 1,
        "recoveries": 0,
        "last_seq": 0,
        **values,
    }
    if rerun is not None:
        row.update(
            parent_run_id=rerun.parent_run_id,
            from_step=rerun.from_step,
            rerun=dumps(rerun.to_data()),
        )
    return row


def insert_in(
    database: Database,
    db: sa.Connection,
    row: dict[str, Any],
    *,
    enqueue: Enqueue,
    seeds: Callable[[sa.Connection], Sequence[Checkpoint]] | None = None,
    audit: Callable[[str], Mapping[str, Any]] | None = None,
) -> bool:
    """`insert` in the caller's transaction (a schedule's tick, which moves its cursor in
    it): store the queued run only when its idempotency key is new (a concurrent insert
    with the same key waits on the row, then inserts nothing), its `seeds`, queue it and
    write its `audit` entry. Whether it was stored."""
    run_id = row["run_id"]
    # A write, before any read of the transaction (see `minions.runs._db`).
    inserted = db.execute(
        database.insert_ignoring_conflicts(runs_table, row).returning(runs_table.c.run_id)
    ).first()
    if inserted is None:
        return False
    if seeds is not None:
        checkpoints.insert(db, run_id, seeds(db))
    enqueue(db, run_id, 1)
    _audit.write(db, audit and audit(run_id))
    return True


def insert(
    database: Database,
    row: dict[str, Any],
    *,
    enqueue: Enqueue,
    seeds: Callable[[sa.Connection], Sequence[Checkpoint]] | None = None,
    audit: Callable[[str], Mapping[str, Any]] | None = None,
) -> Submitted:
    """Store a queued run (`queued_row`) and queue it, in one transaction: both happen or
    neither. `seeds`: reads, in that transaction, the checkpoints it starts with (a
    rerun's: the steps it reuses of its parent, which it holds until the commit); what it
    raises stores nothing. `audit(run_id)`: the audit entry of a run stored, written in the
    transaction. The run, created; with an idempotency key used before, the earlier run,
    not created.

    Raises:
        IdempotencyConflictError: the key was used for another request.
    """
    run_id, key = row["run_id"], row["idempotency_key"]
    with database.begin() as db:
        if insert_in(database, db, row, enqueue=enqueue, seeds=seeds, audit=audit):
            return Submitted(run_id, created=True)
        found = db.execute(
            sa.select(runs_table.c.run_id, runs_table.c.request_hash, runs_table.c.project).where(
                runs_table.c.idempotency_key == key
            )
        ).one()
    if found.project != row.get("project", "default"):
        # Another project's run: neither its id nor its state is this caller's to learn.
        raise IdempotencyConflictError(key, None)
    if found.request_hash is not None and found.request_hash != row["request_hash"]:
        raise IdempotencyConflictError(key, found.run_id)
    return Submitted(str(found.run_id), created=False)


# -- reading -------------------------------------------------------------------------------------


def get(database: Database, run_id: str, *, details: bool = True) -> RunRecord:
    """The run (with its finished steps and approvals when `details`).

    Raises:
        UnknownRunError: no run has this id.
    """
    with database.read() as db:
        found = row(db, run_id)
        if not details:
            return record(found)
        return record(found, checkpoints.records(db, run_id), approvals.of_run(db, run_id))


def snapshot(database: Database, run_id: str) -> RecipeSnapshot:
    """The recipe snapshot the run was queued with (its YAML, file and inputs).

    Raises:
        UnknownRunError: no run has this id.
    """
    with database.read() as db:
        return RecipeSnapshot.from_row(row(db, run_id))


def graph(database: Database, run_id: str) -> tuple[RecipeNode, ...]:
    """The steps of the recipe the run was queued with (see `recipe_graph`: parsed once per
    recipe text, none when it does not parse).

    Raises:
        UnknownRunError: no run has this id.
    """
    return recipe_graph(snapshot(database, run_id).yaml)


def rerun_plan(database: Database, run_id: str) -> RerunPlan | None:
    """The plan the run was queued with (None: it is not a rerun).

    Raises:
        UnknownRunError: no run has this id.
    """
    with database.read() as db:
        stored = row(db, run_id).rerun
    return None if stored is None else RerunPlan.from_data(loads(stored), run_id=run_id)


def listed(
    database: Database,
    which: RunFilter = ANY_RUN,
    *,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> list[RunRecord]:
    """Newest first; `before` (created_at, run_id) continues after a page's last run."""
    query = _filtered(_with_rejection(), which).order_by(
        runs_table.c.created_at.desc(), runs_table.c.run_id.desc()
    )
    if before is not None:
        created, run_id = before
        query = query.where(
            sa.or_(
                runs_table.c.created_at < created,
                sa.and_(runs_table.c.created_at == created, runs_table.c.run_id < run_id),
            )
        )
    with database.read() as db:
        return [record(r) for r in db.execute(query.limit(limit))]


def count(database: Database, which: RunFilter = ANY_RUN) -> int:
    """How many runs `listed` gives with this filter, every page together."""
    query = _filtered(sa.select(sa.func.count()).select_from(runs_table), which)
    with database.read() as db:
        return int(db.execute(query).scalar_one())


def project_of(database: Database, run_id: str) -> str:
    """The run's project (one indexed read).

    Raises:
        UnknownRunError: no run has this id.
    """
    with database.read() as db:
        found = db.execute(
            sa.select(runs_table.c.project).where(runs_table.c.run_id == run_id)
        ).scalar_one_or_none()
    if found is None:
        raise UnknownRunError(run_id)
    return str(found)


def projects(database: Database) -> set[str]:
    """The projects of the store's runs, schedules and evals. The runs' are read through
    their index one project at a time, each the least above the one before (a recursive
    query: a read per project, never one per run)."""
    from minions.runs._tables import evals_table, schedules_table

    project = runs_table.c.project
    found = sa.select(sa.func.min(project).label("project")).cte("found", recursive=True)
    found = found.union_all(
        sa.select(
            sa.select(sa.func.min(project)).where(project > found.c.project).scalar_subquery()
        ).where(found.c.project.is_not(None))
    )
    with database.read() as db:
        names = {p for p in db.execute(sa.select(found.c.project)).scalars() if p is not None}
        for table in (schedules_table, evals_table):
            names.update(db.execute(sa.select(table.c.project).distinct()).scalars())
    return names


def head(database: Database, run_id: str) -> Head:
    """The run's status and the number of its last stored event (one indexed read).

    Raises:
        UnknownRunError: no run has this id.
    """
    with database.read() as db:
        found = db.execute(
            sa.select(runs_table.c.status, runs_table.c.last_seq).where(
                runs_table.c.run_id == run_id
            )
        ).one_or_none()
    if found is None:
        raise UnknownRunError(run_id)
    return Head(status=str(found.status), last_seq=int(found.last_seq))


def expired(database: Database, now: float) -> list[Expired]:
    """Runs held by nobody alive (a parked run is held by nobody, on purpose)."""
    runs = runs_table.c
    with database.read() as db:
        return [
            Expired(
                run_id=r.run_id,
                epoch=r.epoch,
                recoveries=r.recoveries,
                executor_id=r.executor_id,
            )
            for r in db.execute(
                sa.select(runs.run_id, runs.epoch, runs.recoveries, runs.executor_id).where(
                    runs.status.in_(HELD),
                    runs.holder.is_not(None),  # a parked run waits for a decision, not a worker
                    sa.or_(runs.lease_until.is_(None), runs.lease_until < now),
                )
            )
        ]


def count_finished(database: Database, statuses: Sequence[str], before: float) -> int:
    """How many runs in one of `statuses` finished before `before` (what pruning may
    delete)."""
    runs = runs_table.c
    with database.read() as db:
        return int(
            db.execute(
                sa.select(sa.func.count()).where(
                    runs.status.in_(list(statuses)), runs.finished_at < before
                )
            ).scalar_one()
        )


def oldest_finished(
    database: Database, statuses: Sequence[str], before: float, *, limit: int
) -> list[str]:
    """The ids of the first `limit` runs in one of `statuses` that finished before
    `before`, the oldest first (the next batch pruning deletes)."""
    runs = runs_table.c
    with database.read() as db:
        return list(
            db.execute(
                sa.select(runs.run_id)
                .where(runs.status.in_(list(statuses)), runs.finished_at < before)
                .order_by(runs.finished_at, runs.run_id)
                .limit(limit)
            ).scalars()
        )


def oldest_created(database: Database) -> float | None:
    """When the oldest stored run was created (None: no run)."""
    with database.read() as db:
        oldest = db.execute(sa.select(sa.func.min(runs_table.c.created_at))).scalar()
    return None if oldest is None else float(oldest)


def queued_attempts(database: Database, run_ids: Sequence[str]) -> dict[str, Attempt]:
    """The current attempt and epoch of those of `run_ids` that are queued."""
    runs = runs_table.c
    with database.read() as db:
        return {
            r.run_id: Attempt(attempt=r.attempt, epoch=r.epoch)
            for r in db.execute(
                sa.select(runs.run_id, runs.attempt, runs.epoch).where(
                    runs.run_id.in_(list(run_ids)), runs.status == "queued"
                )
            )
        }


# -- the clients' state changes ------------------------------------------------------------------


def request_cancel(
    database: Database,
    run_id: str,
    *,
    actor: str | None = None,
    audit: Mapping[str, Any] | None = None,
) -> RunRecord:
    """Ask the run's holder to cancel it (compare-and-set: the run has not ended), for
    `actor`, with its `audit` entry.

    Raises:
        UnknownRunError: no run has this id.
        RunStateError: the run has ended already.
    """
    with database.begin() as db:
        updated = db.execute(
            runs_table.update()
            .where(runs_table.c.run_id == run_id, runs_table.c.status.in_(ACTIVE))
            .values(cancel_requested=True, cancelled_by=actor)
        ).rowcount
        found = row(db, run_id)
        if updated:
            _audit.write(db, audit, project=found.project)
    if not updated:
        raise RunStateError(
            f"run {run_id} is {found.status}: there is nothing to cancel", status=found.status
        )
    return record(found)


def end_unheld(
    database: Database,
    run_id: str,
    *,
    status: Literal["cancelled", "failed"],
    error: str,
    event: Callable[[int], EventRow],
    when: Literal["queued", "unheld", "any"],
    now: float,
) -> bool:
    """End a run nobody is running (`when`: it is queued; or its holder's lease ran out, or
    it is parked; or whatever its holder is doing: the holder is fenced out), with its
    terminal event `event(seq)` appended after its log's head. True when this call ended
    it."""
    with database.begin() as db:
        return end_in(
            database, db, run_id, status=status, error=error, event=event, when=when, now=now
        )


def end_in(
    database: Database,
    db: sa.Connection,
    run_id: str,
    *,
    status: Literal["cancelled", "failed"],
    error: str,
    event: Callable[[int], EventRow],
    when: Literal["queued", "unheld", "parked", "any"],
    now: float,
) -> bool:
    """`end_unheld` in the caller's transaction (`when` ``parked``: the run is `waiting`
    with no holder)."""
    runs = runs_table.c
    condition: list[Any] = [runs.run_id == run_id, runs.status.in_(ACTIVE)]
    if when == "queued":
        condition.append(runs.status == "queued")
    elif when == "parked":
        condition += [runs.status == "waiting", runs.holder.is_(None)]
    elif when == "unheld":
        condition.append(
            sa.or_(
                runs.status == "queued",
                runs.holder.is_(None),
                runs.lease_until.is_(None),
                runs.lease_until < now,
            )
        )
    ended = db.execute(
        runs_table.update()
        .where(*condition)
        .values(
            status=status,
            error=error,
            finished_at=now,
            epoch=runs.epoch + 1,
            holder=None,
            lease_until=None,
            **_taking_seq(),
        )
        .returning(runs.last_seq)
    ).one_or_none()
    if ended is None:
        return False
    events.insert(db, run_id, [event(int(ended.last_seq))])
    # The usage of the steps it finished (what a holder that ended it would have said
    # of them; the calls of a step in flight when it was fenced out are not known).
    usage = checkpoints.usage(db, run_id)
    db.execute(runs_table.update().where(runs.run_id == run_id).values(usage=dumps(usage)))
    events.notify(database, db, run_id)
    return True


def requeue(
    database: Database,
    run_id: str,
    *,
    statuses: Sequence[str],
    epoch: int | None,
    recovery: bool,
    enqueue: Enqueue,
    attempt: int | None = None,
    actor: str | None = None,
    event: Callable[[int], Event] | None = None,
    audit: Mapping[str, Any] | None = None,
) -> RunRecord | None:
    """Queue the run's next attempt (compare-and-set: its status is one of `statuses`, its
    epoch is `epoch` and its current attempt `attempt` when given), and enqueue it in the
    same transaction; `actor` queued it (None: a worker, taking it over). `event` makes the
    event that says why, given the attempt queued: it is appended to the run's log in the
    same transaction. The attempt keeps the run's place in the queue (its first enqueue).
    None when the run was not in that state."""
    runs = runs_table.c
    condition = [runs.run_id == run_id, runs.status.in_(list(statuses))]
    if epoch is not None:
        condition.append(runs.epoch == epoch)
    if attempt is not None:
        condition.append(runs.attempt == attempt)
    values: dict[str, Any] = {
        "status": "queued",
        "attempt": runs.attempt + 1,
        "epoch": runs.epoch + 1,
        "holder": None,
        "lease_until": None,
        "cancel_requested": False,
        "finished_at": None,
        "error": None,
        "queued_by": actor,
        "cancelled_by": None,
    }
    if recovery:
        values["recoveries"] = runs.recoveries + 1
    if event is not None:
        values.update(_taking_seq())
    with database.begin() as db:
        found = db.execute(
            runs_table.update().where(*condition).values(**values).returning(*runs_table.c)
        ).one_or_none()
        if found is None:
            return None
        if event is not None:
            said = dataclasses.replace(
                event(int(found.attempt)),
                run_id=run_id,
                seq=int(found.last_seq),
                timestamp=time.time(),
            )
            events.insert(db, run_id, [events.row_of(said)])
            events.notify(database, db, run_id)
        enqueue(db, run_id, int(found.attempt))
        _audit.write(db, audit, project=found.project)
    return record(found)


def unpark(
    db: sa.Connection, run_id: str, *, enqueue: Enqueue, actor: str | None
) -> RunRecord | None:
    """Queue a parked run's next attempt (it was `waiting` with no holder: a decision came),
    in the caller's transaction, as `actor`. None when it was not parked."""
    runs = runs_table.c
    found = db.execute(
        runs_table.update()
        .where(runs.run_id == run_id, runs.status == "waiting", runs.holder.is_(None))
        .values(status="queued", epoch=runs.epoch + 1, queued_by=actor)
        .returning(*runs_table.c)
    ).one_or_none()
    if found is None:
        return None
    enqueue(db, run_id, int(found.attempt))
    return record(found)


# -- in the caller's transaction -------------------------------------------------------------------


def lock(db: sa.Connection, run_id: str, *condition: Any) -> bool:
    """Lock the run's row until the caller's transaction ends, when it meets `condition`:
    a write that changes nothing (on SQLite it takes the writer's turn; on Postgres the
    row's lock, and READ COMMITTED checks `condition` again once a concurrent change of the
    row commits), the first statement of a compare-and-set that reads after it. False
    when the run does not meet it (or is unknown)."""
    runs = runs_table.c
    return bool(
        db.execute(
            runs_table.update().where(runs.run_id == run_id, *condition).values(epoch=runs.epoch)
        ).rowcount
    )


def _taking_seq() -> dict[str, Any]:
    """The value of a run's row that takes its log's next event number (the head, one
    more), in the update that says why: returning ``last_seq`` gives the number taken. The
    writer of the log owns the row then: nobody holds the run, or the update fences its
    holder out."""
    return {"last_seq": runs_table.c.last_seq + 1}


def take_seq(db: sa.Connection, run_id: str) -> int:
    """Take the number after the run's log's head, in the caller's transaction (see
    `_taking_seq`)."""
    return int(
        db.execute(
            runs_table.update()
            .where(runs_table.c.run_id == run_id)
            .values(**_taking_seq())
            .returning(runs_table.c.last_seq)
        ).scalar_one()
    )


def hold_back(db: sa.Connection, run_id: str, *, attempt: int, why: str) -> bool:
    """Hold the queued run back (`RunRecord.held_back`: `why`, its project is at a limit)
    with no attempt queued, in the caller's transaction (compare-and-set: `attempt` is its
    current one, and nobody holds it). True when this call held it back."""
    runs = runs_table.c
    return bool(
        db.execute(
            runs_table.update()
            .where(
                runs.run_id == run_id,
                runs.attempt == attempt,
                runs.status == "queued",
                runs.holder.is_(None),
            )
            .values(parked=why)
        ).rowcount
    )


def let_go(db: sa.Connection, run_id: str) -> int | None:
    """Let the held-back run go, as its next attempt, in the caller's transaction (which
    queues that attempt): the attempt (None: it was not held back)."""
    runs = runs_table.c
    moved = db.execute(
        runs_table.update()
        .where(runs.run_id == run_id, runs.parked.is_not(None))
        .values(parked=None, attempt=runs.attempt + 1)
        .returning(runs.attempt)
    ).one_or_none()
    return None if moved is None else int(moved.attempt)


def let_go_ended(db: sa.Connection, project: str) -> None:
    """Forget why the project's held-back runs that ended meanwhile (cancelled) were held
    back: they wait for nothing (in the caller's transaction)."""
    runs = runs_table.c
    db.execute(
        runs_table.update()
        .where(runs.project == project, runs.parked.is_not(None), runs.status != "queued")
        .values(parked=None)
    )


# -- rows ----------------------------------------------------------------------------------------


def row(db: sa.Connection, run_id: str) -> Any:
    """The run's row.

    Raises:
        UnknownRunError: no run has this id.
    """
    found = db.execute(_with_rejection().where(runs_table.c.run_id == run_id)).one_or_none()
    if found is None:
        raise UnknownRunError(run_id)
    return found


def hold_ended(db: sa.Connection, run_id: str, *, attempt: int) -> None:
    """Hold the ended run `run_id` until the caller's transaction ends (a rerun reading its
    seeds): a prune deleting it waits for that, or has deleted it already. It must still
    be ended at `attempt` (the attempt a rerun was planned on).

    Raises:
        UnknownRunError: no run has this id (any more: pruned meanwhile).
        RunStateError: it was resumed since (not ended, or ended again at a later attempt).
    """
    runs = runs_table.c
    if lock(db, run_id, runs.status.in_(TERMINAL), runs.attempt == attempt):
        return
    found = row(db, run_id)
    raise RunStateError(
        f"run {run_id} was resumed while the rerun was planned (it is {found.status}, attempt "
        f"{found.attempt}); rerun it again once it has ended",
        status=found.status,
    )


def record(
    found: Any,
    steps: tuple[StepRecord, ...] = (),
    approvals: tuple[ApprovalRecord, ...] = (),
) -> RunRecord:
    """The run of a row (with its finished steps and approvals, when given)."""
    return RunRecord(
        run_id=found.run_id,
        recipe_id=found.recipe_id,
        status=found.status,
        created_at=found.created_at,
        started_at=found.started_at,
        finished_at=found.finished_at,
        inputs=loads(found.inputs, {}, what=f"run {found.run_id}'s inputs"),
        output=loads(found.output, what=f"run {found.run_id}'s output"),
        error=found.error,
        usage=loads(found.usage, {}, what=f"run {found.run_id}'s usage"),
        recipe_path=found.recipe_path,
        recipe_hash=found.recipe_hash,
        executor_id=found.executor_id,
        cancel_requested=bool(found.cancel_requested),
        attempt=found.attempt,
        schedule=found.schedule,
        slot=found.slot,
        steps=steps,
        approvals=approvals,
        parent_run_id=found.parent_run_id,
        from_step=found.from_step,
        queued_by=found.queued_by,
        cancelled_by=found.cancelled_by,
        project=found.project,
        held_back=found.parked,
        rejected_by=getattr(found, "rejected_by", None) if found.status == "failed" else None,
    )


def _with_rejection() -> sa.Select[Any]:
    """The runs table's columns and `rejected_by` (see `RunRecord.rejected_by`)."""
    return sa.select(runs_table, approvals.rejection().label("rejected_by"))


def forget(db: sa.Connection, run_ids: Sequence[str], statuses: Sequence[str]) -> list[Any]:
    """Delete these runs, those still in one of `statuses` (pruning, a compare-and-set:
    a run resumed meanwhile stays): their ids and attempts."""
    runs = runs_table.c
    return list(
        db.execute(
            runs_table.delete()
            .where(runs.run_id.in_(list(run_ids)), runs.status.in_(list(statuses)))
            .returning(runs.run_id, runs.attempt)
        ).all()
    )


def _filtered(query: sa.Select[Any], which: RunFilter) -> sa.Select[Any]:
    """`query` on the runs table, narrowed to the runs `which` lets through."""
    if which.status is not None:
        query = query.where(runs_table.c.status == which.status)
    if which.recipe is not None:
        query = query.where(runs_table.c.recipe_id == which.recipe)
    if which.created_after is not None:
        query = query.where(runs_table.c.created_at >= which.created_after)
    if which.created_before is not None:
        query = query.where(runs_table.c.created_at < which.created_before)
    if which.id_prefix:
        query = query.where(runs_table.c.run_id.startswith(which.id_prefix, autoescape=True))
    if which.schedule is not None:
        query = query.where(runs_table.c.schedule == which.schedule)
    if which.projects is not None:
        query = query.where(runs_table.c.project.in_(which.projects))
    return query
