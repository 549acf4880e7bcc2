"""The fleet as the store sees it, in a few cheap reads (one round trip each): the queue, the
workers, the schedules' lateness, the load of limited endpoints, and whether the store's
schema is the one this minions knows. What ``GET /metrics`` computes its gauges from at each
scrape (`RunStore.fleet`), and what the fleet views show: the workers with the runs each
holds (`RunStore.workers`), the endpoints' load beside what they taught
(`RunStore.endpoint_status`), the backlog (`RunStore.queue`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

import sqlalchemy as sa

from minions._text import redact_url
from minions.models._internal import WINDOW
from minions.runs import _endpoints, _workers
from minions.runs._db import DEAD_AFTER, Database, meta
from minions.runs._endpoints import EndpointRecord
from minions.runs._tables import (
    ACTIVE,
    ACTIVE_SQL,
    SCHEMA_VERSION,
    runs_table,
    workers_table,
)
from minions.runs._workers import WorkerRecord

__all__ = [
    "EndpointLoad",
    "EndpointStatus",
    "FleetState",
    "QueueState",
    "QueuedRecipe",
    "QueuedRun",
    "ScheduleState",
]


@dataclass(frozen=True, kw_only=True)
class EndpointLoad:
    """A limited endpoint's load over every worker of the store (an entry of the limits).

    Attributes:
        endpoint: the entry's ``match`` (a base URL, or ``URL#model``), without credentials.
        in_flight: calls holding a place now (their worker's lease is alive).
        waiting: workers whose first caller waits in the store's line for a place (each
            worker's other callers wait in its own line: a worker's
            ``minions_model_call_waiters`` counts them all).
        requests: calls started within the last minute.
        tokens: their tokens (estimated at the start, then as their answers said).
        paused_until: no call goes before this (a 429's ``Retry-After``; Unix seconds, 0:
            none).
    """

    endpoint: str
    in_flight: int
    waiting: int
    requests: int
    tokens: int
    paused_until: float


@dataclass(frozen=True, kw_only=True)
class ScheduleState:
    """A schedule that is not paused, as the fleet sees it."""

    name: str
    next_at: float
    """Its next slot (Unix seconds): a slot in the past not fired yet is late."""
    late: bool
    """Its latest slots fired over a minute late, or some were skipped."""
    late_slots: int
    """How many of its slots were late or skipped in all."""


@dataclass(frozen=True, kw_only=True)
class FleetState:
    """The store's runs, workers, schedules and endpoints at one moment.

    Attributes:
        at: when it was read (Unix seconds).
        queued: runs waiting for a worker.
        oldest_queued_at: when the oldest of them was submitted (None: none queued).
        running: runs a worker runs now.
        waiting: runs waiting for a person's approval.
        workers_alive: workers that beat within the dead-worker timeout.
        workers_dead: workers that stopped beating without stopping (killed, frozen, cut
            off): their records remain until a fleet view's expiry.
        schedules: each schedule that is not paused: its next slot and its lateness.
        endpoints: the limited endpoints' load.
    """

    at: float
    queued: int = 0
    oldest_queued_at: float | None = None
    running: int = 0
    waiting: int = 0
    workers_alive: int = 0
    workers_dead: int = 0
    schedules: tuple[ScheduleState, ...] = ()
    endpoints: tuple[EndpointLoad, ...] = ()

    @property
    def oldest_queued_age(self) -> float:
        """Seconds the oldest queued run has waited (0: none queued)."""
        if self.oldest_queued_at is None:
            return 0.0
        return max(0.0, self.at - self.oldest_queued_at)

    def schedule_lag(self) -> dict[str, float]:
        """Seconds each schedule's next slot is overdue (0: not due yet)."""
        return {s.name: max(0.0, self.at - s.next_at) for s in self.schedules}


_RUNS = sa.text(
    "SELECT status, count(*) AS n, min(created_at) AS oldest FROM minions_runs "
    f"WHERE status IN ({ACTIVE_SQL}) GROUP BY status"
)
_WORKERS = sa.text(
    "SELECT coalesce(sum(CASE WHEN heartbeat_at >= :alive THEN 1 ELSE 0 END), 0) AS alive, "
    "coalesce(sum(CASE WHEN heartbeat_at < :alive THEN 1 ELSE 0 END), 0) AS dead "
    "FROM minions_workers WHERE stopped_at IS NULL"
)
_SCHEDULES = sa.text(
    "SELECT name, next_at, late, late_slots FROM minions_schedules WHERE NOT paused ORDER BY name"
)
_ENDPOINTS = sa.text(
    "SELECT g.endpoint, g.paused_until, "
    "(SELECT count(*) FROM minions_endpoint_calls c WHERE c.endpoint = g.endpoint "
    "AND c.lease_until >= :now) AS in_flight, "
    "(SELECT count(*) FROM minions_endpoint_waiters w WHERE w.endpoint = g.endpoint "
    "AND w.seen_at >= :seen) AS waiting, "
    "(SELECT count(*) FROM minions_endpoint_calls c WHERE c.endpoint = g.endpoint "
    "AND c.started_at > :window) AS requests, "
    "(SELECT coalesce(sum(c.tokens), 0) FROM minions_endpoint_calls c "
    "WHERE c.endpoint = g.endpoint AND c.started_at > :window) AS tokens "
    "FROM minions_endpoint_gates g ORDER BY g.endpoint"
)
LINE_SEEN = 10.0
"""Seconds within which a caller in the store's line was seen, to count as waiting (a caller
looks again at least every half second; one not seen for longer died)."""


def fleet_state(store: Database, *, now: float) -> FleetState:
    """The fleet as the store says it is at `now`: four reads, none of them a scan of
    finished runs (the queue's statuses are indexed)."""
    with store.read() as db:
        counts = {r.status: (int(r.n), r.oldest) for r in db.execute(_RUNS)}
        alive, dead = db.execute(_WORKERS, {"alive": now - DEAD_AFTER}).one()
        found = db.execute(_SCHEDULES).all()
        endpoints = tuple(
            EndpointLoad(
                endpoint=redact_url(r.endpoint),
                in_flight=int(r.in_flight),
                waiting=int(r.waiting),
                requests=int(r.requests),
                tokens=int(r.tokens),
                paused_until=float(r.paused_until) if r.paused_until > now else 0.0,
            )
            for r in db.execute(
                _ENDPOINTS, {"now": now, "seen": now - LINE_SEEN, "window": now - WINDOW}
            )
        )
    queued, oldest = counts.get("queued", (0, None))
    return FleetState(
        at=now,
        queued=queued,
        oldest_queued_at=oldest,
        running=counts.get("running", (0, None))[0],
        waiting=counts.get("waiting", (0, None))[0],
        workers_alive=int(alive),
        workers_dead=int(dead),
        schedules=tuple(
            ScheduleState(
                name=r.name,
                next_at=float(r.next_at),
                late=bool(r.late),
                late_slots=int(r.late_slots),
            )
            for r in found
        ),
        endpoints=endpoints,
    )


def worker_records(store: Database, *, now: float) -> list[WorkerRecord]:
    """The workers of the store that beat within `_workers.EXPIRY`, in the order they
    started, each with the runs it holds now (running under its lease, as the runs' rows
    say: a run another worker took over is that worker's, not the dead one's)."""
    with store.read() as db:
        rows = db.execute(
            sa.select(workers_table)
            .where(workers_table.c.heartbeat_at >= now - _workers.EXPIRY)
            .order_by(workers_table.c.started_at)
        ).all()
        held: dict[str, list[str]] = {}
        for run in db.execute(
            sa.select(runs_table.c.run_id, runs_table.c.holder)
            .where(runs_table.c.status == "running", runs_table.c.holder.is_not(None))
            .order_by(runs_table.c.started_at)
        ):
            held.setdefault(run.holder, []).append(run.run_id)
    return [
        dataclasses.replace(_workers.as_record(row, now), runs=held.get(row.incarnation or "", []))
        for row in rows
    ]


@dataclass(frozen=True, kw_only=True)
class EndpointStatus:
    """A model endpoint as the fleet sees it: its load under the limits (when an entry of
    the limits holds it) and what it taught the structured-output ladder.

    Attributes:
        endpoint: the limits' ``match`` (a base URL, or ``URL#model``), or the base URL an
            endpoint without limits taught from; without credentials.
        load: its load now (None: no entry of the limits holds it).
        learned: what it taught, per model (the output mode that worked, what it refused).
    """

    endpoint: str
    load: EndpointLoad | None
    learned: tuple[EndpointRecord, ...] = ()


def endpoint_status(store: Database, *, now: float, expiry: float) -> list[EndpointStatus]:
    """Each limited endpoint with its load and what its models taught, then the endpoints
    that taught something and no entry of the limits holds."""
    loads = fleet_state(store, now=now).endpoints
    learned = [
        dataclasses.replace(e, base_url=redact_url(e.base_url))
        for e in _endpoints.learned(store, expiry=expiry, now=now)
    ]
    found: list[EndpointStatus] = []
    matched: set[int] = set()
    for load in loads:
        url, _, model = load.endpoint.partition("#")
        mine = [
            i
            for i, e in enumerate(learned)
            if e.base_url.rstrip("/") == url.rstrip("/") and (not model or e.model == model)
        ]
        matched.update(mine)
        found.append(
            EndpointStatus(
                endpoint=load.endpoint, load=load, learned=tuple(learned[i] for i in mine)
            )
        )
    rest: dict[str, list[EndpointRecord]] = {}
    for i, e in enumerate(learned):
        if i not in matched:
            rest.setdefault(e.base_url, []).append(e)
    found.extend(
        EndpointStatus(endpoint=url, load=None, learned=tuple(records))
        for url, records in rest.items()
    )
    return found


@dataclass(frozen=True, kw_only=True)
class QueuedRun:
    """A run waiting for a worker."""

    run_id: str
    recipe_id: str
    created_at: float
    schedule: str | None = None


@dataclass(frozen=True, kw_only=True)
class QueuedRecipe:
    """The queued runs of one recipe."""

    recipe_id: str
    queued: int
    """How many."""
    oldest_queued_at: float
    """When the oldest of them was submitted (Unix seconds)."""


@dataclass(frozen=True, kw_only=True)
class QueueState:
    """The backlog at one moment.

    Attributes:
        at: when it was read (Unix seconds).
        queued: runs waiting for a worker.
        oldest_queued_at: when the oldest of them was submitted (None: none queued).
        running: runs a worker runs now.
        waiting: runs waiting for a person's approval (they hold no worker place).
        by_recipe: the queued runs per recipe, the most waiting first.
        oldest: the first queued runs, oldest first (at most `limit` of them).
    """

    at: float
    queued: int
    oldest_queued_at: float | None
    running: int
    waiting: int
    by_recipe: tuple[QueuedRecipe, ...]
    oldest: tuple[QueuedRun, ...]

    @property
    def oldest_queued_age(self) -> float:
        """Seconds the oldest queued run has waited (0: none queued)."""
        return 0.0 if self.oldest_queued_at is None else max(0.0, self.at - self.oldest_queued_at)


_BY_RECIPE = sa.text(
    "SELECT recipe_id, count(*) AS n, min(created_at) AS oldest FROM minions_runs "
    "WHERE status = 'queued' GROUP BY recipe_id ORDER BY count(*) DESC, recipe_id"
)


def queue_state(
    store: Database, *, now: float, limit: int = 20, projects: Collection[str] | None = None
) -> QueueState:
    """The backlog: counts, per recipe, and the `limit` oldest queued runs (of the runs of
    `projects`; None: every run)."""
    runs = runs_table.c
    mine = sa.true() if projects is None else runs.project.in_(sorted(projects))
    n, oldest_at = sa.func.count().label("n"), sa.func.min(runs.created_at).label("oldest")
    with store.read() as db:
        if projects is None:
            counted = db.execute(_RUNS)
            recipes = db.execute(_BY_RECIPE)
        else:
            counted = db.execute(
                sa.select(
                    runs.status,
                    n,
                    oldest_at,
                )
                .where(runs.status.in_(ACTIVE), mine)
                .group_by(runs.status)
            )
            recipes = db.execute(
                sa.select(
                    runs.recipe_id,
                    n,
                    oldest_at,
                )
                .where(runs.status == "queued", mine)
                .group_by(runs.recipe_id)
                .order_by(sa.func.count().desc(), runs.recipe_id)
            )
        counts = {r.status: (int(r.n), r.oldest) for r in counted}
        by_recipe = tuple(
            QueuedRecipe(recipe_id=r.recipe_id, queued=int(r.n), oldest_queued_at=float(r.oldest))
            for r in recipes
        )
        oldest = tuple(
            QueuedRun(
                run_id=r.run_id, recipe_id=r.recipe_id, created_at=r.created_at, schedule=r.schedule
            )
            for r in db.execute(
                sa.select(
                    runs_table.c.run_id,
                    runs_table.c.recipe_id,
                    runs_table.c.created_at,
                    runs_table.c.schedule,
                )
                .where(runs_table.c.status == "queued", mine)
                .order_by(runs_table.c.created_at, runs_table.c.run_id)
                .limit(limit)
            )
        )
    queued, first = counts.get("queued", (0, None))
    return QueueState(
        at=now,
        queued=queued,
        oldest_queued_at=first,
        running=counts.get("running", (0, None))[0],
        waiting=counts.get("waiting", (0, None))[0],
        by_recipe=by_recipe,
        oldest=oldest,
    )


def schema_problem(store: Database) -> str | None:
    """What keeps the store from being used by this minions now (``None``: nothing): one
    read of its schema version.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the store cannot be read.
    """
    with store.read() as db:
        version = meta(db, ("schema_version",)).get("schema_version")
    if version is None:
        return "the run store has no schema version: it is not a minions store"
    if int(version) != SCHEMA_VERSION:
        return f"the run store has schema version {version}; this minions knows {SCHEMA_VERSION}"
    return None
