"""Schedules: a recipe snapshotted when the schedule is added, run at each slot of a cron
expression or of an interval, by whichever worker's tick gets there first.

Each slot fires exactly once however many workers tick: the tick that fires a slot moves the
schedule's cursor past it by compare-and-set (on the cursor and the schedule's version), in
the transaction that stores and queues the slot's run, whose idempotency key names the slot
(``schedule:NAME:SLOT``). Of concurrent ticks one moves the cursor; the others write
nothing. Slots that came due while no worker ran, or while the store was down, follow the
schedule's catch-up policy when a tick comes again.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import sqlalchemy as sa
import structlog

from minions.errors import ScheduleExistsError, UnknownScheduleError
from minions.runs._store import Enqueue, Store, _insert_ignoring_conflicts, dumps, queued_row
from minions.runs._tables import CatchUp, ScheduleRecord, runs_table, schedules_table

__all__: list[str] = []

log = structlog.get_logger(__name__)

TICK = float(os.environ.get("MINIONS_SCHEDULE_TICK", "0.5"))
"""Seconds between a worker's looks at the schedules that are due."""
GRACE = 60.0
"""With catch-up ``none``, a slot fired later than this after its time is skipped instead."""
MAX_PER_TICK = 100
"""With catch-up ``all``, the most slots one tick fires (the next tick goes on)."""


@dataclass(frozen=True, kw_only=True)
class Timing:
    """When a schedule's slots are: a cron expression in a time zone, or every `every`
    seconds (multiples of it since 1970-01-01 UTC, so every 1h is on the hour)."""

    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"

    def after(self, moment: float) -> float:
        """The first slot strictly after `moment`."""
        if self.every is not None:
            return float((math.floor(moment / self.every) + 1) * self.every)
        from cronsim import CronSim

        assert self.cron is not None
        start = datetime.fromtimestamp(moment, ZoneInfo(self.timezone))
        return next(CronSim(self.cron, start)).timestamp()

    def latest(self, moment: float) -> float:
        """The last slot at or before `moment`."""
        if self.every is not None:
            return float(math.floor(moment / self.every) * self.every)
        from cronsim import CronSim

        assert self.cron is not None
        # Slots are whole seconds, and CronSim walks back from strictly before its start.
        start = datetime.fromtimestamp(math.floor(moment), ZoneInfo(self.timezone))
        return next(CronSim(self.cron, start + timedelta(seconds=1), reverse=True)).timestamp()


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one tick does with a due schedule: the slots it fires, and where its cursor goes."""

    fire: tuple[float, ...]
    cursor: float


def plan(timing: Timing, catch_up: CatchUp, cursor: float, now: float, grace: float) -> Plan:
    """The slots after `cursor` due at `now`, under the catch-up policy."""
    if catch_up == "all":
        fire: list[float] = []
        slot = timing.after(cursor)
        while slot <= now and len(fire) < MAX_PER_TICK:
            fire.append(slot)
            slot = timing.after(slot)
        return Plan(fire=tuple(fire), cursor=fire[-1] if fire else cursor)
    latest = timing.latest(now)
    if latest <= cursor:
        return Plan(fire=(), cursor=cursor)
    on_time = catch_up == "one" or now - latest <= grace
    return Plan(fire=(latest,) if on_time else (), cursor=latest)


def slot_key(name: str, slot: float) -> str:
    """The idempotency key of a schedule's run for a slot."""
    return f"schedule:{name}:{int(slot)}"


# -- the schedules' SQL (blocking) ---------------------------------------------------------------


def save(store: Store, values: Mapping[str, Any], *, replace: bool) -> ScheduleRecord:
    """Store a new schedule (or, with `replace`, a new recipe and timing for one of that
    name: its slots go on from now, and its runs stay linked to it).

    Raises:
        ScheduleExistsError: it exists and `replace` is False.
    """
    table = schedules_table
    row = dict(values)
    with store.begin() as db:
        if replace:
            kept = ("created_at", "last_slot", "last_fired_at", "last_run_id", "fired", "version")
            updated = db.execute(
                table.update()
                .where(table.c.name == row["name"])
                .values(
                    **{k: v for k, v in row.items() if k not in kept},
                    version=table.c.version + 1,
                )
            ).rowcount
            if updated:
                return record(_row(db, row["name"]))
        inserted = db.execute(
            _insert_ignoring_conflicts(store.postgres, row, table=table).returning(table.c.name)
        ).first()
        if inserted is None:
            raise ScheduleExistsError(row["name"])
        return record(_row(db, row["name"]))


def get(store: Store, name: str) -> ScheduleRecord:
    with store.read() as db:
        return record(_row(db, name))


def listed(store: Store) -> list[ScheduleRecord]:
    with store.read() as db:
        return [
            record(r)
            for r in db.execute(sa.select(schedules_table).order_by(schedules_table.c.name))
        ]


def set_paused(
    store: Store, name: str, *, paused: bool, now: float, actor: str | None = None
) -> ScheduleRecord:
    """Pause, or resume, as `actor`: a resumed schedule goes on from its next slot after
    `now` (the slots of the pause are not fired).

    Raises:
        UnknownScheduleError: no schedule has this name.
    """
    table = schedules_table
    values: dict[str, Any] = {
        "paused": paused,
        "version": table.c.version + 1,
        "changed_by": actor,
    }
    with store.begin() as db:
        if not paused:
            found = _row(db, name)
            if not found.paused:
                return record(found)
            # Never back before a slot it fired (the clock of whoever resumes may lag).
            cursor = max(now, found.cursor)
            values.update(cursor=cursor, next_at=timing_of(found).after(cursor))
        updated = db.execute(table.update().where(table.c.name == name).values(**values)).rowcount
        if not updated:
            raise UnknownScheduleError(name)
        return record(_row(db, name))


def delete(store: Store, name: str) -> None:
    """Remove the schedule (its runs stay).

    Raises:
        UnknownScheduleError: no schedule has this name.
    """
    with store.begin() as db:
        deleted = db.execute(
            schedules_table.delete().where(schedules_table.c.name == name)
        ).rowcount
    if not deleted:
        raise UnknownScheduleError(name)


def fire_due(store: Store, enqueue: Enqueue, *, now: float, grace: float = GRACE) -> list[str]:
    """Fire the slots of every schedule due at `now`; the ids of the runs this call queued."""
    table = schedules_table
    with store.read() as db:
        due = db.execute(
            sa.select(table).where(table.c.paused.is_(False), table.c.next_at <= now)
        ).all()
    fired: list[str] = []
    for row in due:
        timing = timing_of(row)
        step = plan(timing, row.catch_up, row.cursor, now, grace)
        fired += _fire(store, enqueue, row, step, timing.after(step.cursor), now)
    return fired


def _fire(
    store: Store, enqueue: Enqueue, row: Any, step: Plan, next_at: float, now: float
) -> list[str]:
    table = schedules_table
    runs: list[tuple[str, float]] = [(uuid.uuid4().hex, slot) for slot in step.fire]
    values: dict[str, Any] = {"cursor": step.cursor, "next_at": next_at}
    if runs:
        values.update(
            last_slot=runs[-1][1],
            last_fired_at=now,
            last_run_id=runs[-1][0],
            fired=table.c.fired + len(runs),
        )
    queued: list[str] = []
    with store.begin() as db:
        # The compare-and-set that makes a slot fire once: of the ticks that read this cursor,
        # one moves it (Postgres: the others wait on the row, then find it moved).
        moved = db.execute(
            table.update()
            .where(
                table.c.name == row.name,
                table.c.version == row.version,
                table.c.cursor == row.cursor,
                table.c.paused.is_(False),
            )
            .values(**values)
        ).rowcount
        if not moved:
            return []
        for run_id, slot in runs:
            inserted = db.execute(
                _insert_ignoring_conflicts(
                    store.postgres,
                    queued_row(
                        run_id=run_id,
                        recipe_id=row.recipe_id,
                        recipe_yaml=row.recipe_yaml,
                        recipe_path=row.recipe_path,
                        recipe_hash=row.recipe_hash,
                        inputs=row.inputs,
                        idempotency_key=slot_key(row.name, slot),
                        request_hash=row.request_hash,
                        schedule=row.name,
                        slot=slot,
                        queued_by=f"schedule:{row.name}",
                    ),
                ).returning(runs_table.c.run_id)
            ).first()
            if inserted is not None:  # else: fired before (the schedule was added again)
                enqueue(db, run_id, 1)
                queued.append(run_id)
    for run_id in queued:
        log.info("schedule fired", schedule=row.name, run_id=run_id)
    return queued


def timing_of(row: Any) -> Timing:
    return Timing(cron=row.cron, every=row.every, timezone=row.timezone)


def _row(db: sa.Connection, name: str) -> Any:
    row = db.execute(sa.select(schedules_table).where(schedules_table.c.name == name)).one_or_none()
    if row is None:
        raise UnknownScheduleError(name)
    return row


def record(row: Any) -> ScheduleRecord:
    return ScheduleRecord(
        name=row.name,
        recipe_id=row.recipe_id,
        inputs=json.loads(row.inputs),
        cron=row.cron,
        every=row.every,
        timezone=row.timezone,
        catch_up=row.catch_up,
        paused=bool(row.paused),
        created_at=row.created_at,
        next_at=row.next_at,
        last_slot=row.last_slot,
        last_fired_at=row.last_fired_at,
        last_run_id=row.last_run_id,
        fired=row.fired,
        recipe_path=row.recipe_path,
        recipe_hash=row.recipe_hash,
        changed_by=row.changed_by,
    )


def new_row(
    *,
    name: str,
    recipe_id: str,
    recipe_yaml: str,
    recipe_path: str | None,
    recipe_hash: str,
    request_hash: str,
    inputs: Mapping[str, Any],
    timing: Timing,
    catch_up: CatchUp,
    now: float,
    actor: str | None = None,
) -> dict[str, Any]:
    """A schedule's row as added at `now` by `actor`: its first slot is the first after
    `now`."""
    return {
        "name": name,
        "recipe_id": recipe_id,
        "recipe_yaml": recipe_yaml,
        "recipe_path": recipe_path,
        "recipe_hash": recipe_hash,
        "request_hash": request_hash,
        "inputs": dumps(dict(inputs)),
        "cron": timing.cron,
        "every": timing.every,
        "timezone": timing.timezone,
        "catch_up": catch_up,
        "paused": False,
        "created_at": now,
        "cursor": now,
        "next_at": timing.after(now),
        "version": 1,
        "fired": 0,
        "changed_by": actor,
    }


class Scheduler:
    """What a worker's tick does: fire the due slots of the store's schedules.

    Args:
        store: the store.
        enqueue: queues a run's first attempt in the caller's transaction.
        clock: the time now (tests give their own).
        grace: see `GRACE`.
    """

    def __init__(
        self,
        store: Store,
        enqueue: Enqueue,
        *,
        clock: Callable[[], float] = time.time,
        grace: float = GRACE,
    ) -> None:
        self.store = store
        self.enqueue = enqueue
        self.clock = clock
        self.grace = grace

    def tick(self) -> Sequence[str]:
        """Fire what is due now; the ids of the runs queued."""
        return fire_due(self.store, self.enqueue, now=self.clock(), grace=self.grace)
