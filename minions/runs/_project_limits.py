"""Limits per project (`minions.models.ProjectLimit`: runs in flight, tokens per day), held by
the workers of a store over all of them.

A worker that is handed a run of a limited project claims it under the project's gate (a row
of the endpoints' gates table, ``project:NAME``, written first: the claims of one project
take turns, on SQLite and Postgres): counted with the project's runs in flight (running or
waiting, their holder's lease alive) and the tokens its runs used in the last 24 hours, the
run starts, or it is *parked*: it stays queued with no attempt queued, and the worker's place
is free at once. Every worker's tick (`unpark`) queues the oldest parked runs of each project
again, as many as it has room for; a claim of them checks again (a place taken meanwhile
parks it once more). A killed worker's runs stop counting when their lease runs out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
import structlog

from minions.runs import _runs as runs
from minions.runs._db import loads
from minions.runs._endpoints import _lock_gate
from minions.runs._leases import Refusal, Start, claimed_row, start_of
from minions.runs._tables import HELD, runs_table

if TYPE_CHECKING:
    from minions.models import ProjectLimit
    from minions.runs._db import Database
    from minions.runs._runs import Enqueue

__all__: list[str] = []

log = structlog.get_logger(__name__)

DAY = 86400.0
Parked = Literal["parked"]
Why = Literal["max_runs_in_flight", "tokens_per_day"]


def gate(project: str) -> str:
    """The project's row in the gates table."""
    return f"project:{project}"


def _in_flight(db: sa.Connection, project: str, now: float, *, besides: str = "") -> int:
    r = runs_table.c
    return int(
        db.execute(
            sa.select(sa.func.count())
            .select_from(runs_table)
            .where(
                r.project == project,
                r.status.in_(HELD),
                r.lease_until >= now,
                r.run_id != besides,
            )
        ).scalar_one()
    )


def tokens_used(db: sa.Connection, project: str, now: float) -> int:
    """The tokens of the project's runs that ended in the last 24 hours or are in flight."""
    r = runs_table.c
    rows = db.execute(
        sa.select(r.usage).where(
            r.project == project,
            r.usage.is_not(None),
            sa.or_(r.finished_at >= now - DAY, r.status.in_(HELD)),
        )
    ).all()
    total = 0
    for (usage,) in rows:
        found = loads(usage, {}) or {}
        total += int(found.get("total_tokens") or 0) or (
            int(found.get("prompt_tokens") or 0) + int(found.get("completion_tokens") or 0)
        )
    return total


def _over(
    db: sa.Connection, limit: ProjectLimit, now: float, *, besides: str = ""
) -> tuple[Why | None, int]:
    """Why the project has no room for one more run now (None: it has), and its room (runs
    that may start)."""
    room = 1 << 30
    if limit.max_runs_in_flight is not None:
        room = limit.max_runs_in_flight - _in_flight(db, limit.name, now, besides=besides)
        if room <= 0:
            return "max_runs_in_flight", 0
    if limit.tokens_per_day is not None and tokens_used(db, limit.name, now) >= (
        limit.tokens_per_day
    ):
        return "tokens_per_day", 0
    return None, room


def claim(
    database: Database,
    /,
    run_id: str,
    limit: ProjectLimit,
    *,
    attempt: int,
    holder: str,
    **claiming: Any,
) -> Start | Refusal | Parked:
    """`minions.runs._leases.claim` of a run of a limited project (`claiming`: its
    `executor_id`, `lease_until` and `now`): under the project's gate, the claim when the
    project has room, else the run parked (``parked``)."""
    now: float = claiming["now"]
    with database.begin() as db:
        _lock_gate(db, database, gate(limit.name))
        why, _ = _over(db, limit, now, besides=run_id)
        if why is None:
            row = claimed_row(db, run_id, attempt=attempt, holder=holder, **claiming)
        else:
            parked = runs.hold_back(db, run_id, attempt=attempt, why=why)
    if why is None:
        return start_of(database, run_id, row, attempt=attempt, holder=holder)
    if parked:
        log.info("run parked: its project is at its limit", run_id=run_id, limit=why)
        return "parked"
    return start_of(database, run_id, None, attempt=attempt, holder=holder)


def unpark(
    database: Database,
    limits: Sequence[ProjectLimit],
    *,
    enqueue: Enqueue,
    now: float | None = None,
) -> list[str]:
    """Queue again the oldest parked runs of each project, as many as it has room for now
    (each as its next attempt, in the transaction that unparks it). Their ids."""
    queued: list[str] = []
    r = runs_table.c
    for limit in limits:
        with database.read() as db:
            waiting = db.execute(
                sa.select(sa.func.count())
                .select_from(runs_table)
                .where(r.project == limit.name, r.parked.is_not(None))
            ).scalar_one()
        if not waiting:
            continue
        at = time.time() if now is None else now
        with database.begin() as db:
            _lock_gate(db, database, gate(limit.name))
            why, room = _over(db, limit, at)
            if why is not None:
                continue
            oldest = db.execute(
                sa.select(r.run_id)
                .where(
                    r.project == limit.name,
                    r.parked.is_not(None),
                    r.status == "queued",
                )
                .order_by(r.created_at, r.run_id)
                .limit(min(room, 100))
            ).all()
            for (run_id,) in oldest:
                attempt = runs.let_go(db, run_id)
                if attempt is not None:
                    enqueue(db, run_id, attempt)
                    queued.append(run_id)
            # The parked runs that ended meanwhile (cancelled) wait for nothing.
            runs.let_go_ended(db, limit.name)
    for run_id in queued:
        log.info("parked run queued again: its project has room", run_id=run_id)
    return queued


def by_name(limits: Sequence[ProjectLimit]) -> Mapping[str, ProjectLimit]:
    return {limit.name: limit for limit in limits}
