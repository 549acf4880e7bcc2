"""Decisions on the calls that wait for a person, and what they do to a run parked while it
waits (`minions.runs._leases.park`: `waiting`, held by nobody, its worker place given back).

A person's decision (`decide`) and a timeout's (`expire`) each queue the parked run's next
attempt in the transaction that decides, so that it resumes at the waiting call from its
checkpoints; a timeout that fails the run ends it there instead. An escalation (`escalate`)
writes the run's `approval_escalated` event. Each locks the run's row first, as a park does:
of a park and a decision at once one sees the other, and of a person's decision and a
timeout (or two workers' sweeps) one wins, by the call's compare-and-set.

Timeouts and escalations need no worker holding the run: every worker's schedules thread
sweeps the due ones (`sweep`), each done once whoever races it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import structlog

from minions._duration import spoken
from minions.events import ApprovalEscalated
from minions.runs import _approvals as approvals
from minions.runs import _audit
from minions.runs import _events as events
from minions.runs import _runs as runs
from minions.runs._tables import ACTIVE, approvals_table, runs_table

if TYPE_CHECKING:
    from minions.runs._approvals import ApprovalRecord
    from minions.runs._db import Database
    from minions.runs._runs import Enqueue

__all__: list[str] = []

log = structlog.get_logger(__name__)

TIMEOUT_ACTOR = "timeout"
"""Who decided a call that timed out (its `decided_by`, its `approval_resolved` event's
`actor`)."""

BATCH = 100
"""Due calls one sweep handles at most (the next sweep comes at once for the rest)."""


def decide(
    database: Database,
    run_id: str,
    call_id: str,
    *,
    approved: bool,
    reason: str | None,
    actor: str | None,
    enqueue: Enqueue,
    audit: Mapping[str, Any] | None = None,
) -> ApprovalRecord | None:
    """Decide a waiting call as `actor` (compare-and-set: undecided, and the run has not
    ended), with its `audit` entry, and, when the run is parked, queue it again in the same
    transaction. None when the call was decided already or the run ended."""
    with database.begin() as db:
        if not _lock(db, run_id):
            return None
        decided = approvals.decide(
            db, run_id, call_id, approved=approved, reason=reason, actor=actor, audit=audit
        )
        if decided is not None:
            runs.unpark(db, run_id, enqueue=enqueue, actor=actor)
        return decided


@dataclass(frozen=True, slots=True, kw_only=True)
class Due:
    """A call of a parked run whose timeout or escalation is due."""

    run_id: str
    call_id: str


def sweep(
    database: Database, *, enqueue: Enqueue, now: float | None = None, by: str | None = None
) -> float | None:
    """Escalate and time out the calls of parked runs that are due (each once, whoever races
    this), and say when the next one is due (None: nothing waits with a deadline). `by`: the
    worker sweeping (where the audit log says a timeout came from)."""
    now = time.time() if now is None else now
    for call in due(database, now):
        escalate(database, call.run_id, call.call_id, now=now)
        expire(database, call.run_id, call.call_id, enqueue=enqueue, now=now, by=by)
    return next_due(database)


def due(database: Database, now: float) -> list[Due]:
    """The calls of parked runs due for their escalation or their timeout, the oldest first."""
    a, r = approvals_table.c, runs_table.c
    with database.read() as db:
        return [
            Due(run_id=row.run_id, call_id=row.call_id)
            for row in db.execute(
                sa.select(a.run_id, a.call_id)
                .join(runs_table, r.run_id == a.run_id)
                .where(*_parked(), sa.or_(a.due_at <= now, _escalation() & (a.escalate_at <= now)))
                .order_by(a.requested_at)
                .limit(BATCH)
            )
        ]


def next_due(database: Database) -> float | None:
    """When the next deadline of a parked run's call comes (None: none)."""
    a, r = approvals_table.c, runs_table.c
    with database.read() as db:
        found = db.execute(
            sa.select(
                sa.func.min(a.due_at),
                sa.func.min(sa.case((_escalation(), a.escalate_at), else_=None)),
            )
            .join(runs_table, r.run_id == a.run_id)
            .where(*_parked())
        ).one()
    times = [t for t in found if t is not None]
    return min(times) if times else None


def escalate(database: Database, run_id: str, call_id: str, *, now: float) -> bool:
    """Say once that call `call_id` of the parked run waited past its escalation: its
    `approval_escalated` event. True when this call said it."""
    with database.begin() as db:
        if not _lock(db, run_id, parked=True):
            return False
        if not approvals.mark_escalated(db, run_id, call_id, now=now):
            return False
        found = approvals.get_in(db, run_id, call_id)
        assert found is not None
        # Nobody holds the run (it is parked): nobody else writes its log.
        seq = runs.take_seq(db, run_id)
        event = ApprovalEscalated(
            run_id=run_id,
            seq=seq,
            timestamp=now,
            step_id=found.step_id,
            call_id=call_id,
            name=found.tool,
            waited=now - found.requested_at,
            due_at=found.due_at,
        )
        events.insert(db, run_id, [events.row_of(event)])
        events.notify(database, db, run_id)
    log.info("approval escalated", run_id=run_id, call_id=call_id)
    return True


def expire(
    database: Database,
    run_id: str,
    call_id: str,
    *,
    enqueue: Enqueue,
    now: float,
    by: str | None = None,
) -> bool:
    """Time out call `call_id` of the parked run, undecided past its deadline: reject it
    (the model is told why) and queue the run again, or fail the run, as its request says;
    the audit log records an ``approval.reject`` by ``timeout`` (from worker `by`). True
    when this call did (a person's decision, or another worker, may have come first)."""
    with database.begin() as db:
        if not _lock(db, run_id, parked=True):
            return False
        found = approvals.get_in(db, run_id, call_id)
        if found is None or found.due_at is None or found.due_at > now:
            return False
        waited = spoken(found.due_at - found.requested_at)
        reason = (
            f"nobody decided within {waited} (the recipe's approval timeout); the call was not made"
        )
        audit = _audit.entry(
            "approval.reject",
            run_id,
            _audit.Actor(name=TIMEOUT_ACTOR, address=by),
            call=call_id,
            tool=found.tool,
            reason=reason,
            on_timeout=found.on_timeout,
        )
        decided = approvals.decide(
            db,
            run_id,
            call_id,
            approved=False,
            reason=reason,
            actor=TIMEOUT_ACTOR,
            now=now,
            audit=audit,
        )
        if decided is None:
            return False
        if found.on_timeout == "fail":
            error = f"call {call_id!r} ({found.tool}) waited {waited} for a decision: timed out"
            runs.end_in(
                database,
                db,
                run_id,
                status="failed",
                error=error,
                event=events.run_failed_row(run_id, error, TIMEOUT_ACTOR),
                when="parked",
                now=now,
            )
        else:
            runs.unpark(db, run_id, enqueue=enqueue, actor=None)
    log.info("approval timed out", run_id=run_id, call_id=call_id, on_timeout=found.on_timeout)
    return True


# -- in a transaction ------------------------------------------------------------------------------


def _lock(db: sa.Connection, run_id: str, *, parked: bool = False) -> bool:
    """Lock the run's row until the transaction ends (a park locks it too): it has not
    ended (`parked`: it is parked). False when it is not so (or unknown)."""
    r = runs_table.c
    condition: list[Any] = [r.status.in_(ACTIVE)]
    if parked:
        condition += [r.status == "waiting", r.holder.is_(None)]
    return runs.lock(db, run_id, *condition)


def _parked() -> tuple[Any, ...]:
    a, r = approvals_table.c, runs_table.c
    return (a.decided_at.is_(None), r.status == "waiting", r.holder.is_(None))


def _escalation() -> Any:
    a = approvals_table.c
    return a.escalate_at.is_not(None) & a.escalated_at.is_(None)
