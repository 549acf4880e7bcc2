"""The approvals table: the calls of a run that wait (or waited) for a person's decision.

A request is recorded once, by the run's holder under its lease (a step run again asks the
same call again: `minions.runs._leases.request_approval`); a call is decided once, by
compare-and-set (undecided, and its run has not ended): of concurrent decisions one wins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
import structlog

from minions.errors import RunStateError
from minions.runs import _audit, _events
from minions.runs._db import dumps
from minions.runs._tables import ACTIVE, approvals_table, runs_table

if TYPE_CHECKING:
    from minions.runs._db import Database

__all__ = ["ApprovalRecord"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class ApprovalRecord:
    """A call that waits (or waited) for a person's decision."""

    call_id: str
    step_id: str
    tool: str
    arguments: dict[str, Any]
    requested_at: float
    decided_at: float | None = None
    approved: bool | None = None
    reason: str | None = None
    decided_by: str | None = None
    """Who decided: a key's name, ``token``, ``cli:USER``, ``timeout`` (None: undecided, or
    not known)."""
    due_at: float | None = None
    """When the call times out undecided (the recipe's ``approval.timeout``; None: never)."""
    on_timeout: str | None = None
    """What its timeout does: ``reject`` the call, or ``fail`` the run."""
    escalate_at: float | None = None
    """When an undecided call is escalated (``approval.escalate_after``; None: never)."""
    escalated_at: float | None = None
    """When it was escalated (its `approval_escalated` event was written)."""


OnTimeout = Literal["reject", "fail"]
"""What an approval's timeout does: reject the call (the model is told why), or fail the run."""


@dataclass(frozen=True, kw_only=True)
class Deadlines:
    """How long a run's calls wait for a decision (a recipe's ``approval:``), in seconds."""

    timeout: float | None = None
    """Undecided this long, a call times out (None: it waits as long as it takes)."""
    on_timeout: OnTimeout = "reject"
    escalate_after: float | None = None
    """Undecided this long, a call is escalated: an `approval_escalated` event."""


@dataclass(frozen=True, kw_only=True)
class Resume:
    """What the step that waits at a call of a parked run kept, to go on at the call when
    the run goes on (the call's `resume` column)."""

    scope: str
    """The step execution that waits (``step#visit``...)."""
    seq: int
    """The number of the run's last event when it parked: a log that ended after it (the
    run ended, then was resumed by hand) makes it stale."""
    state: Mapping[str, Any] | None = None
    """The step's state (the data of a `minions._step.resume.StepState`)."""
    restarted: str | None = None
    """Why no state was kept (the step starts again from its start), instead."""

    def text(self) -> str:
        """As the column keeps it."""
        kept: dict[str, Any] = {"scope": self.scope, "seq": self.seq}
        if self.state is not None:
            kept["state"] = self.state
        if self.restarted is not None:
            kept["restarted"] = self.restarted
        return dumps(kept)


def get(database: Database, run_id: str, call_id: str) -> ApprovalRecord | None:
    with database.read() as db:
        return _get(db, run_id, call_id)


def decide(
    db: sa.Connection,
    run_id: str,
    call_id: str,
    *,
    approved: bool,
    reason: str | None,
    actor: str | None = None,
    now: float | None = None,
    audit: Mapping[str, Any] | None = None,
) -> ApprovalRecord | None:
    """Decide a waiting call as `actor`, in the caller's transaction (compare-and-set:
    undecided, and the run has not ended), with its `audit` entry. None when it was decided
    already or the run ended."""
    updated = db.execute(
        approvals_table.update()
        .where(
            approvals_table.c.run_id == run_id,
            approvals_table.c.call_id == call_id,
            approvals_table.c.decided_at.is_(None),
            sa.exists().where(runs_table.c.run_id == run_id, runs_table.c.status.in_(ACTIVE)),
        )
        .values(
            decided_at=time.time() if now is None else now,
            approved=approved,
            reason=reason,
            decided_by=actor,
        )
    ).rowcount
    if not updated:
        return None
    if audit is not None:
        project = db.execute(
            sa.select(runs_table.c.project).where(runs_table.c.run_id == run_id)
        ).scalar_one()
        _audit.write(db, audit, project=project)
    return _get(db, run_id, call_id)


def mark_escalated(db: sa.Connection, run_id: str, call_id: str, *, now: float) -> bool:
    """Mark the undecided call escalated at `now`, in the caller's transaction
    (compare-and-set: not escalated yet, its escalation due by `now`). True when this call
    marked it."""
    table = approvals_table.c
    return bool(
        db.execute(
            approvals_table.update()
            .where(
                table.run_id == run_id,
                table.call_id == call_id,
                table.decided_at.is_(None),
                table.escalated_at.is_(None),
                table.escalate_at <= now,
            )
            .values(escalated_at=now)
        ).rowcount
    )


# -- what a person may decide -------------------------------------------------------------------


def the_waiting_call(run_id: str, status: str, asked: Sequence[ApprovalRecord]) -> str:
    """The one call of the run (in `status`, with the requests `asked`) that waits for a
    decision.

    Raises:
        RunStateError: no call waits, or several do.
    """
    waiting = [a for a in asked if a.decided_at is None]
    if not waiting:
        past = [a for a in asked if a.decided_at is not None]
        last = max(past, key=lambda a: a.decided_at or 0.0) if past else None
        told = (
            ""
            if last is None
            else f" (call {last.call_id!r} was "
            f"{'approved' if last.approved else 'rejected'} already)"
        )
        raise RunStateError(
            f"run {run_id} is {status} and waits for no approval{told}", status=status
        )
    if len(waiting) > 1:
        calls = ", ".join(a.call_id for a in waiting)
        raise RunStateError(
            f"run {run_id} waits for several calls; name one: {calls}", status=status
        )
    return waiting[0].call_id


def undecided(
    run_id: str, call_id: str, status: str, *, ended: bool, asked: Sequence[ApprovalRecord]
) -> RunStateError:
    """Why a decision of the run's call `call_id` changed nothing (the run is in `status`,
    `ended` or not, with the requests `asked`)."""
    found = {a.call_id: a for a in asked}.get(call_id)
    if found is not None and found.decided_at is not None:
        verdict = "approved" if found.approved else "rejected"
        return RunStateError(
            f"call {call_id!r} of run {run_id} was {verdict} already", status=status
        )
    if ended:
        return RunStateError(f"run {run_id} is {status}: its calls wait no more", status=status)
    calls = ", ".join(a.call_id for a in asked if a.decided_at is None)
    return RunStateError(
        f"run {run_id} does not wait for call {call_id!r}; "
        + (f"it waits for {calls}" if calls else "it waits for no approval"),
        status=status,
    )


# -- in a caller's transaction -------------------------------------------------------------------


def waiting(database: Database, projects: Collection[str] | None = None) -> int:
    """How many calls wait for a person's decision (undecided, of a run that has not
    ended; of a run of `projects` when given)."""
    table = approvals_table.c
    query = (
        sa.select(sa.func.count())
        .select_from(approvals_table.join(runs_table, runs_table.c.run_id == table.run_id))
        .where(table.decided_at.is_(None), runs_table.c.status.in_(ACTIVE))
    )
    if projects is not None:
        query = query.where(runs_table.c.project.in_(sorted(projects)))
    with database.read() as db:
        return int(db.execute(query).scalar_one())


def rejection() -> sa.ScalarSelect[Any]:
    """A column of a query on the runs table: who rejected a call of the run (the latest
    rejection; ``''`` when who is not known), NULL when no call of it was rejected."""
    table = approvals_table.c
    return (
        sa.select(sa.func.coalesce(table.decided_by, ""))
        .where(table.run_id == runs_table.c.run_id, table.approved.is_(False))
        .order_by(table.decided_at.desc())
        .limit(1)
        .scalar_subquery()
    )


def of_run(db: sa.Connection, run_id: str) -> tuple[ApprovalRecord, ...]:
    """The run's requests, in the order they were made."""
    return tuple(
        _record(a)
        for a in db.execute(
            sa.select(*_RECORD)
            .where(approvals_table.c.run_id == run_id)
            .order_by(approvals_table.c.requested_at)
        )
    )


def request(
    database: Database,
    db: sa.Connection,
    run_id: str,
    *,
    call_id: str,
    step_id: str,
    tool: str,
    arguments: Any,
    deadlines: Deadlines | None = None,
) -> ApprovalRecord:
    """Record the request of a call, once (the caller checked the run's lease), with its
    `deadlines` counted from now, and what is recorded of it (a decision already, for a call
    asked again: its deadlines stay those of its first request)."""
    now = time.time()
    given = deadlines or Deadlines()
    db.execute(
        database.insert_ignoring_conflicts(
            approvals_table,
            {
                "run_id": run_id,
                "call_id": call_id,
                "step_id": step_id,
                "tool": tool,
                "arguments": dumps(arguments),
                "requested_at": now,
                "due_at": None if given.timeout is None else now + given.timeout,
                "on_timeout": None if given.timeout is None else given.on_timeout,
                "escalate_at": None if given.escalate_after is None else now + given.escalate_after,
            },
        )
    )
    found = _get(db, run_id, call_id)
    assert found is not None
    return found


def keep(db: sa.Connection, run_id: str, call_id: str, resume: str | None) -> None:
    """Keep `resume` (`Resume.text`) as what the step waiting at call `call_id` goes on
    from, and nothing of the run's other calls (a state kept at a call before is spent), in
    the caller's transaction (the run's park)."""
    table = approvals_table.c
    db.execute(
        approvals_table.update()
        .where(
            table.run_id == run_id,
            sa.or_(table.call_id == call_id, table.resume.is_not(None)),
        )
        .values(resume=sa.case((table.call_id == call_id, resume), else_=None))
    )


def kept(database: Database, run_id: str) -> list[Resume]:
    """What the steps of the run that waited at its calls kept when it parked (none when
    its log ended since: the run was resumed by hand after it ended). One that cannot be
    read is left out (its step starts again from its start), said in the log."""
    table = approvals_table.c
    found: list[Resume] = []
    with database.read() as db:
        for call_id, text in db.execute(
            sa.select(table.call_id, table.resume).where(
                table.run_id == run_id, table.resume.is_not(None)
            )
        ):
            try:
                data = json.loads(text)
                resume = Resume(
                    scope=str(data["scope"]),
                    seq=int(data["seq"]),
                    state=data.get("state"),
                    restarted=data.get("restarted"),
                )
            except (ValueError, TypeError, KeyError) as exc:
                log.warning(
                    "the state kept at a call cannot be read: its step starts again",
                    run_id=run_id,
                    call_id=call_id,
                    error=f"{type(exc).__name__}: {exc}",
                )
                continue
            if not _events.ended_after(db, run_id, resume.seq):
                found.append(resume)
    return found


def forget(db: sa.Connection, run_ids: Sequence[str]) -> None:
    """Delete the requests of these runs (pruning)."""
    db.execute(approvals_table.delete().where(approvals_table.c.run_id.in_(list(run_ids))))


def get_in(db: sa.Connection, run_id: str, call_id: str) -> ApprovalRecord | None:
    """The request of call `call_id`, read in the caller's transaction."""
    return _get(db, run_id, call_id)


_RECORD = [column for column in approvals_table.c if column.name != "resume"]
"""What a record of a call reads (not the state kept at it, which may be big)."""


def _get(db: sa.Connection, run_id: str, call_id: str) -> ApprovalRecord | None:
    row = db.execute(
        sa.select(*_RECORD).where(
            approvals_table.c.run_id == run_id, approvals_table.c.call_id == call_id
        )
    ).one_or_none()
    return None if row is None else _record(row)


def _record(row: Any) -> ApprovalRecord:
    return ApprovalRecord(
        call_id=row.call_id,
        step_id=row.step_id,
        tool=row.tool,
        arguments=json.loads(row.arguments),
        requested_at=row.requested_at,
        decided_at=row.decided_at,
        approved=row.approved,
        reason=row.reason,
        decided_by=row.decided_by,
        due_at=row.due_at,
        on_timeout=row.on_timeout,
        escalate_at=row.escalate_at,
        escalated_at=row.escalated_at,
    )
