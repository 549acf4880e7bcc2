"""Schedules: a recipe snapshotted when the schedule is added, run at each slot of a cron
expression or of an interval, by whichever worker's tick gets there first.

Each slot fires exactly once however many workers tick: the tick that fires a slot moves the
schedule's cursor past it by compare-and-set (on the cursor and the schedule's version), in
the transaction that stores and queues the slot's run, whose idempotency key names the slot
(``schedule:NAME:SLOT``). Of concurrent ticks one moves the cursor; the others write
nothing. Slots that came due while no worker ran, or while the store was down, follow the
schedule's catch-up policy when a tick comes again, bounded (`MAX_BACKLOG` slots, at most
`MAX_PER_TICK` of them a tick, never more than `MAX_PER_TICK` of a schedule's runs waiting in
the queue at once), so a schedule catching up never buries other runs.

A slot due while runs of its schedule are active follows the schedule's overlap policy
(``skip``, ``buffer_one``, ``allow``), read in the transaction that fires it. A tick that
fires a slot late (over `GRACE` after it) or passes over slots without firing them flags the
schedule ``late``, with why; the next tick that fires on time clears the flag. The same
transaction records what it flagged (``minions_schedule_late``: each slot fired late, with its
run; the slots skipped, as one row), which notifications tell (``schedule_late``), each once.

Daylight saving time follows Debian's cron (as cronsim does): an expression with a wildcard
minute or hour field (``* * * * *``, ``*/15 9-17 * * *``) keeps to elapsed time (at a
fall-back its slots of the repeated hour fire in both passes; the hour skipped at a
spring-forward has none), one at a fixed time of day (``30 2 * * *``) fires once a day: in
the repeated hour at its first pass only, in the skipped hour at the first time after it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
import structlog

from minions.errors import ScheduleExistsError, UnknownScheduleError
from minions.runs import _audit
from minions.runs import _runs as runs
from minions.runs._db import Database
from minions.runs._runs import Enqueue
from minions.runs._snapshot import RecipeSnapshot
from minions.runs._tables import ACTIVE, runs_table, schedule_late_table, schedules_table

if TYPE_CHECKING:
    from minions.recipes._internal import CatchUp, Overlap, ScheduleSpec

__all__ = ["ScheduleRecord"]

log = structlog.get_logger(__name__)

TICK = float(os.environ.get("MINIONS_SCHEDULE_TICK", "0.5"))
"""Seconds between a worker's looks at the schedules that are due."""
GRACE = 60.0
"""A slot fired later than this after its time is late (with catch-up ``none``, it is skipped
instead)."""
MAX_PER_TICK = 10
"""The most slots of a schedule one tick fires; and with catch-up ``all``, a tick fires none
while this many of the schedule's runs wait in the queue (it goes on as they start)."""
MAX_BACKLOG = 100
"""With catch-up ``all``, the most missed slots a schedule catches up: the latest this many
fire, the older ones are skipped."""
MAX_COUNTED = 10_000
"""Skipped slots of a cron expression are counted up to this many per gap (an interval's
exactly)."""
LATE_KEPT = 7 * 86400.0
"""Seconds a record of a late or skipped slot is kept (`minions_schedule_late`)."""
LateReason = Literal["late", "overlap", "catch-up", "backlog"]
"""Why a schedule is late: a slot fired over `GRACE` after its time (``late``), or slots were
skipped because runs of it were active (``overlap``), by the catch-up policy (``catch-up``)
or beyond `MAX_BACKLOG` (``backlog``)."""


@dataclass(frozen=True, kw_only=True)
class ScheduleRecord:
    """A schedule as stored: a recipe snapshotted when it was added, run at each slot.

    Attributes:
        cron: its cron expression (or None, and `every` is set).
        every: seconds between slots, which are multiples of it since 1970-01-01 UTC.
        catch_up: what slots missed while no worker ran do: ``none`` (skipped; a slot over
            a minute late too), ``one`` (the latest fires), ``all`` (each fires, in order).
        next_at: the next slot (a Unix time).
        last_slot: the slot that fired last; `last_run_id` its run.
        fired: how many runs it fired.
        overlap: what a slot due while runs of it are active does: ``skip`` (it is skipped),
            ``buffer_one`` (it fires if no run of it waits in the queue and at most one is
            active) or ``allow`` (it fires).
        late: the latest tick that fired or passed over its slots fired one over `GRACE`
            late or skipped some; `late_reason` says why, `late_at` when.
        late_slots: how many of its slots fired late or were skipped, in all.
    """

    name: str
    recipe_id: str
    inputs: dict[str, Any]
    cron: str | None
    every: int | None
    timezone: str
    catch_up: CatchUp
    paused: bool
    created_at: float
    next_at: float
    last_slot: float | None = None
    last_fired_at: float | None = None
    last_run_id: str | None = None
    fired: int = 0
    recipe_path: str | None = None
    recipe_hash: str = ""
    changed_by: str | None = None
    """Who added it, or paused or resumed it last."""
    overlap: Overlap = "skip"
    late: bool = False
    late_slots: int = 0
    late_at: float | None = None
    late_reason: LateReason | None = None
    project: str = "default"
    """Its project, and its runs'."""

    @property
    def timing(self) -> str:
        """``cron EXPR [TZ]`` or ``every Ns``, as shown."""
        if self.cron is not None:
            zone = "" if self.timezone == "UTC" else f" ({self.timezone})"
            return f"cron {self.cron}{zone}"
        return f"every {self.every}s"


@dataclass(frozen=True, kw_only=True)
class Timing:
    """When a schedule's slots are: a cron expression in a time zone, or every `every`
    seconds (multiples of it since 1970-01-01 UTC, so every 1h is on the hour)."""

    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"

    @classmethod
    def of(cls, spec: ScheduleSpec) -> Timing:
        """The timing of a checked schedule."""
        from minions._duration import duration_seconds

        every = None if spec.every is None else int(duration_seconds(spec.every, whole=True))
        return cls(cron=spec.cron, every=every, timezone=spec.timezone)

    def after(self, moment: float) -> float:
        """The first slot strictly after `moment`."""
        if self.every is not None:
            return float((math.floor(moment / self.every) + 1) * self.every)
        from cronsim import CronSim

        # At a fall-back, a fixed-time expression's walk from the repeated hour's second
        # pass starts with that day's slot of the first pass (before `moment`): it fired.
        for found in CronSim(self._cron, datetime.fromtimestamp(moment, self._zone)):
            if found.timestamp() > moment:
                return found.timestamp()
        return math.inf  # no slot within 50 years (cronsim's horizon)

    def latest(self, moment: float) -> float:
        """The last slot at or before `moment`."""
        if self.every is not None:
            return float(math.floor(moment / self.every) * self.every)
        from cronsim import CronSim

        # Slots are whole seconds, and CronSim walks back from strictly before its start (made
        # from the Unix time, so that a moment of a repeated hour's second pass is that one).
        start = datetime.fromtimestamp(math.floor(moment) + 1, self._zone)
        found = next(CronSim(self._cron, start, reverse=True)).timestamp()
        # The walk back may land on the first pass of a repeated hour, before slots of the
        # second: the last slot at or before `moment` is the last of the walk forward.
        while (following := self.after(found)) <= moment:
            found = following
        return found

    def count(self, start: float, end: float) -> int:
        """How many slots are in (`start`, `end`] (a cron expression's up to `MAX_COUNTED`)."""
        if end <= start:
            return 0
        if self.every is not None:
            return math.floor(end / self.every) - math.floor(start / self.every)
        counted, slot = 0, self.after(start)
        while slot <= end and counted < MAX_COUNTED:
            counted += 1
            slot = self.after(slot)
        return counted

    @property
    def _cron(self) -> str:
        assert self.cron is not None
        return self.cron

    @property
    def _zone(self) -> Any:
        from zoneinfo import ZoneInfo

        return ZoneInfo(self.timezone)


def spec_of(
    text: str,
    path: Path,
    *,
    inputs: Mapping[str, Any] | None = None,
    **given: Any,
) -> ScheduleSpec:
    """The schedule of recipe YAML `text` (the file `path`): its own ``schedule:``, with the
    fields `given` (``cron``, ``every``, ``name``, ``timezone``, ``catch_up``, ``overlap``;
    None: not given) over it (a timing given replaces its timing) and `inputs` merged into its
    inputs.

    Raises:
        RecipeError: the recipe has no ``schedule:`` and no timing is given, or the schedule
            is invalid.
    """
    from pydantic import ValidationError

    from minions.recipes import parse_spec
    from minions.recipes._internal import ScheduleSpec

    spec, _ = parse_spec(text, file=str(path))
    told = {k: v for k, v in given.items() if v is not None}
    if isinstance(told.get("every"), int):
        told["every"] = f"{told['every']}s"
    base = spec.schedule.model_dump(exclude_unset=True) if spec.schedule else {}
    if "cron" in told or "every" in told:
        base.pop("cron", None)
        base.pop("every", None)
    elif spec.schedule is None:
        raise _problem("the recipe has no `schedule:`: give a cron expression or an interval", path)
    merged = {**base, **told, "inputs": {**base.get("inputs", {}), **(inputs or {})}}
    try:
        return ScheduleSpec.model_validate(merged)
    except ValidationError as exc:
        raise _problem(
            "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()), path
        ) from None


def _problem(message: str, path: Path) -> Exception:
    from minions.errors import Problem, RecipeError

    return RecipeError([Problem(message=message, file=str(path), field="schedule")])


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one tick does with a due schedule: the slots it fires, where its cursor goes, and
    how many slots the cursor passes over without firing them (and why)."""

    fire: tuple[float, ...]
    cursor: float
    skipped: int = 0
    reason: LateReason | None = None
    last_skipped: float | None = None
    """The latest slot it skips (None: it skips none); the first is the first after the
    cursor it starts from."""


def room(overlap: Overlap, catch_up: CatchUp, *, active: int = 0, queued: int = 0) -> int:
    """How many slots a schedule may fire now, with `active` runs of it not ended, `queued`
    of them not started."""
    if overlap == "skip":
        return 1 if active == 0 else 0
    if overlap == "buffer_one":
        return 1 if queued == 0 and active <= 1 else 0
    return max(0, MAX_PER_TICK - queued) if catch_up == "all" else MAX_PER_TICK


@functools.lru_cache(maxsize=1024)
def _beyond_backlog(timing: Timing, cursor: float) -> float:
    """The first slot after `cursor` past the backlog (the schedule's `MAX_BACKLOG` + 1th):
    a tick of a schedule waiting for room to catch up asks it again and again."""
    slot = cursor
    for _ in range(MAX_BACKLOG + 1):
        slot = timing.after(slot)
    return slot


def plan(
    timing: Timing,
    catch_up: CatchUp,
    cursor: float,
    now: float,
    grace: float,
    *,
    overlap: Overlap = "allow",
    active: int = 0,
    queued: int = 0,
) -> Plan:
    """The slots after `cursor` due at `now` under the catch-up and overlap policies, with
    `active` runs of the schedule not ended and `queued` of them not started.

    With catch-up ``all``, the slots the overlap policy (or the queue's bound) leaves wait for
    a later tick; with ``one`` and ``none``, a slot that may not fire now is skipped."""
    may = min(room(overlap, catch_up, active=active, queued=queued), MAX_PER_TICK)
    if catch_up == "all":
        start, skipped = cursor, 0
        if _beyond_backlog(timing, cursor) <= now:  # more missed than the backlog holds
            oldest = timing.latest(now)
            for _ in range(MAX_BACKLOG - 1):
                oldest = timing.latest(oldest - 1)
            start = oldest - 1  # slots are whole seconds
            skipped = timing.count(cursor, start)
        last_skipped = timing.latest(start) if skipped else None
        fire: list[float] = []
        slot = timing.after(start)
        while slot <= now and len(fire) < may:
            fire.append(slot)
            slot = timing.after(slot)
        return Plan(
            fire=tuple(fire),
            cursor=fire[-1] if fire else start,
            skipped=skipped,
            reason="backlog" if skipped else None,
            last_skipped=last_skipped,
        )
    latest = timing.latest(now)
    if latest <= cursor:
        return Plan(fire=(), cursor=cursor)
    missed = timing.count(cursor, latest) - 1
    if catch_up == "none" and now - latest > grace:
        return Plan(
            fire=(), cursor=latest, skipped=missed + 1, reason="catch-up", last_skipped=latest
        )
    if may < 1:
        return Plan(
            fire=(), cursor=latest, skipped=missed + 1, reason="overlap", last_skipped=latest
        )
    return Plan(
        fire=(latest,),
        cursor=latest,
        skipped=missed,
        reason="catch-up" if missed else None,
        last_skipped=timing.latest(latest - 1) if missed else None,
    )


def slot_key(name: str, slot: float) -> str:
    """The idempotency key of a schedule's run for a slot."""
    return f"schedule:{name}:{int(slot)}"


# -- the schedules' SQL (blocking) ---------------------------------------------------------------


def save(
    database: Database,
    values: Mapping[str, Any],
    *,
    replace: bool,
    audit: Callable[[str], Mapping[str, Any] | None] | None = None,
) -> ScheduleRecord:
    """Store a new schedule (or, with `replace`, a new recipe and timing for one of that
    name and project: its slots go on from now, and its runs stay linked to it); `audit(how)`
    is its audit entry (``add`` or ``replace``), written in the same transaction.

    Raises:
        ScheduleExistsError: it exists and `replace` is False, or it is another project's.
    """
    table = schedules_table
    row = dict(values)
    with database.begin() as db:
        if replace:
            kept = ("created_at", "last_slot", "last_fired_at", "last_run_id", "fired", "version")
            updated = db.execute(
                table.update()
                .where(table.c.name == row["name"], table.c.project == row["project"])
                .values(
                    **{k: v for k, v in row.items() if k not in kept},
                    version=table.c.version + 1,
                )
            ).rowcount
            if updated:
                _audit.write(db, audit and audit("replace"), project=row["project"])
                return record(_row(db, row["name"]))
        inserted = db.execute(
            database.insert_ignoring_conflicts(table, row).returning(table.c.name)
        ).first()
        if inserted is None:
            raise ScheduleExistsError(row["name"])
        _audit.write(db, audit and audit("add"), project=row["project"])
        return record(_row(db, row["name"]))


def get(database: Database, name: str) -> ScheduleRecord:
    with database.read() as db:
        return record(_row(db, name))


def listed(database: Database) -> list[ScheduleRecord]:
    with database.read() as db:
        return [
            record(r)
            for r in db.execute(sa.select(schedules_table).order_by(schedules_table.c.name))
        ]


def set_paused(
    database: Database,
    name: str,
    *,
    paused: bool,
    now: float,
    actor: str | None = None,
    audit: Mapping[str, Any] | None = None,
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
    with database.begin() as db:
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
        changed = _row(db, name)
        _audit.write(db, audit, project=changed.project)
        return record(changed)


def delete(database: Database, name: str, *, audit: Mapping[str, Any] | None = None) -> None:
    """Remove the schedule (its runs stay), with its `audit` entry.

    Raises:
        UnknownScheduleError: no schedule has this name.
    """
    with database.begin() as db:
        deleted = db.execute(
            schedules_table.delete()
            .where(schedules_table.c.name == name)
            .returning(schedules_table.c.project)
        ).first()
        if deleted is not None:
            _audit.write(db, audit, project=deleted.project)
    if deleted is None:
        raise UnknownScheduleError(name)


def fire_due(
    database: Database, enqueue: Enqueue, *, now: float, grace: float = GRACE
) -> list[str]:
    """Fire the slots of every schedule due at `now`; the ids of the runs this call queued."""
    table = schedules_table
    with database.read() as db:
        due = db.execute(
            sa.select(table).where(table.c.paused.is_(False), table.c.next_at <= now)
        ).all()
        # A schedule waiting for room to catch up (its slots due, its runs in the way) costs
        # a read, not a write transaction, per tick: the write decides again.
        due = [row for row in due if _step(db, row, now, grace) is not None]
    fired: list[str] = []
    for row in due:
        fired += _fire(database, enqueue, row, now, grace)
    return fired


def next_due(database: Database) -> float | None:
    """When the store's next slot is due (None: no schedule fires)."""
    table = schedules_table
    with database.read() as db:
        due: float | None = db.execute(
            sa.select(sa.func.min(table.c.next_at)).where(table.c.paused.is_(False))
        ).scalar()
    return due


def _active(db: sa.Connection, name: str) -> tuple[int, int]:
    """How many runs of the schedule have not ended, and how many of them wait in the queue."""
    counts: dict[str, int] = dict(
        db.execute(
            sa.select(runs_table.c.status, sa.func.count())
            .where(runs_table.c.schedule == name, runs_table.c.status.in_(ACTIVE))
            .group_by(runs_table.c.status)
        ).all()
    )
    return sum(counts.values()), counts.get("queued", 0)


def _step(db: sa.Connection, row: Any, now: float, grace: float) -> Plan | None:
    """What a tick at `now` does with the due schedule `row` (None: nothing)."""
    counted = row.overlap != "allow" or row.catch_up == "all"
    active, waiting = _active(db, row.name) if counted else (0, 0)
    step = plan(
        timing_of(row),
        row.catch_up,
        row.cursor,
        now,
        grace,
        overlap=row.overlap,
        active=active,
        queued=waiting,
    )
    return None if step.cursor == row.cursor and not step.fire else step


def _fire(database: Database, enqueue: Enqueue, row: Any, now: float, grace: float) -> list[str]:
    table = schedules_table
    timing = timing_of(row)
    queued: list[str] = []
    snapshot = RecipeSnapshot.from_row(row)
    with database.begin() as db:
        # The compare-and-set that makes a slot fire once, first (a write, so that SQLite's
        # transaction holds the writer's turn before it reads): of the ticks that read this
        # cursor, one holds the row; the others write nothing (Postgres: they wait on the
        # row, then find it moved). The runs of the schedule are counted after it: only a
        # tick holding the row makes one active.
        held = db.execute(
            table.update()
            .where(
                table.c.name == row.name,
                table.c.version == row.version,
                table.c.cursor == row.cursor,
                table.c.paused.is_(False),
            )
            .values(version=table.c.version)
        ).rowcount
        if not held:
            return []
        step = _step(db, row, now, grace)
        if step is None:
            return []  # catching up, and waiting for room
        fired = [(uuid.uuid4().hex, slot) for slot in step.fire]
        late_fired = sum(1 for slot in step.fire if now - slot > grace)
        values: dict[str, Any] = {
            "cursor": step.cursor,
            "next_at": timing.after(step.cursor),
            "late": bool(step.skipped or late_fired),
        }
        if fired:
            values.update(
                last_slot=fired[-1][1],
                last_fired_at=now,
                last_run_id=fired[-1][0],
                fired=table.c.fired + len(fired),
            )
        if step.skipped or late_fired:
            values.update(
                late_slots=table.c.late_slots + step.skipped + late_fired,
                late_at=now,
                late_reason=step.reason if step.skipped else "late",
            )
        db.execute(table.update().where(table.c.name == row.name).values(**values))
        for run_id, slot in fired:
            queued_run = runs.queued_row(
                snapshot,
                run_id=run_id,
                idempotency_key=slot_key(row.name, slot),
                schedule=row.name,
                slot=slot,
                queued_by=f"schedule:{row.name}",
                project=row.project,
            )
            audit = functools.partial(
                _submitted,
                actor=_audit.Actor(name=queued_run["queued_by"], project=row.project),
                recipe=snapshot.recipe_id,
                schedule=row.name,
                slot=slot,
            )
            if runs.insert_in(database, db, queued_run, enqueue=enqueue, audit=audit):
                queued.append(run_id)  # else: fired before (the schedule was added again)
        if step.skipped or late_fired:
            _record_late(database, db, row, step, fired, set(queued), now=now, grace=grace)
    for run_id in queued:
        log.info("schedule fired", schedule=row.name, run_id=run_id)
    if values["late"]:
        log.warning(
            "schedule late",
            schedule=row.name,
            reason=values["late_reason"],
            skipped=step.skipped,
            fired_late=late_fired,
        )
    return queued


def _submitted(run_id: str, *, actor: _audit.Actor, **detail: Any) -> dict[str, Any]:
    """The audit entry of a run a schedule fired."""
    return _audit.entry("run.submit", run_id, actor, **detail)


def _record_late(
    database: Database,
    db: sa.Connection,
    row: Any,
    step: Plan,
    fired: Sequence[tuple[str, float]],
    queued: set[str],
    *,
    now: float,
    grace: float,
) -> None:
    """Record, in the tick's transaction, what it flagged the schedule `row` late for: the
    slots `step` skips (one row: the first after the cursor to its `last_skipped`) and each
    slot it fires late (with its run, when this tick queued it); and forget the records
    older than `LATE_KEPT`."""
    table = schedule_late_table
    common = {"schedule": row.name, "recipe_id": row.recipe_id, "at": now}
    records: list[dict[str, Any]] = []
    if step.skipped and step.last_skipped is not None and step.reason is not None:
        records.append(
            {
                **common,
                "slot": step.last_skipped,
                "why": "skipped",
                "reason": step.reason,
                "slots": step.skipped,
                "first_slot": min(timing_of(row).after(row.cursor), step.last_skipped),
                "run_id": None,
            }
        )
    for run_id, slot in fired:
        if now - slot > grace:
            records.append(
                {
                    **common,
                    "slot": slot,
                    "why": "late",
                    "reason": "late",
                    "slots": 1,
                    "first_slot": slot,
                    "run_id": run_id if run_id in queued else None,
                }
            )
    for record in records:
        db.execute(database.insert_ignoring_conflicts(table, record))
    db.execute(table.delete().where(table.c.at < now - LATE_KEPT))


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
        overlap=row.overlap,
        late=bool(row.late),
        late_slots=row.late_slots,
        late_at=row.late_at,
        late_reason=row.late_reason,
        project=row.project,
    )


def new_row(
    *,
    name: str,
    snapshot: RecipeSnapshot,
    timing: Timing,
    catch_up: CatchUp,
    overlap: Overlap = "skip",
    now: float,
    actor: str | None = None,
    project: str = "default",
) -> dict[str, Any]:
    """A schedule's row as added at `now` by `actor`: its first slot is the first after
    `now`."""
    return {
        **snapshot.columns(),
        "name": name,
        "cron": timing.cron,
        "every": timing.every,
        "timezone": timing.timezone,
        "catch_up": catch_up,
        "overlap": overlap,
        "paused": False,
        "created_at": now,
        "cursor": now,
        "next_at": timing.after(now),
        "version": 1,
        "fired": 0,
        "changed_by": actor,
        "project": project,
    }


class Scheduler:
    """What a worker's tick does: fire the due slots of the store's schedules.

    Args:
        database: the store's database.
        enqueue: queues a run's first attempt in the caller's transaction.
        clock: the time now (tests give their own).
        grace: see `GRACE`.
    """

    def __init__(
        self,
        database: Database,
        enqueue: Enqueue,
        *,
        clock: Callable[[], float] = time.time,
        grace: float = GRACE,
    ) -> None:
        self.database = database
        self.enqueue = enqueue
        self.clock = clock
        self.grace = grace

    def tick(self) -> Sequence[str]:
        """Fire what is due now; the ids of the runs queued."""
        return fire_due(self.database, self.enqueue, now=self.clock(), grace=self.grace)
