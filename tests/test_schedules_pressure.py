"""Schedules with back-pressure: catch-up `all` bounded (a cap per tick, a backlog per
schedule, a bound on a schedule's runs waiting in the queue) so an ordinary run is never
behind thousands of scheduled ones; the overlap policies (`skip`, `buffer_one`, `allow`)
driven by a clock of the test and a simulated 3-minute recipe; the late flag; daylight saving
time; intervals too long to hold. On SQLite and Postgres where the store decides."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from runs_helpers import TOOLS, chain, finished, worker
from typer.testing import CliRunner

from minions.cli._app import app
from minions.errors import RecipeError
from minions.recipes._schema import CatchUp, Overlap
from minions.runs import RunRecord, RunStore, ScheduleRecord
from minions.runs._db import Database, sqlalchemy_url
from minions.runs._queue import Queue
from minions.runs._schedules import (
    MAX_BACKLOG,
    MAX_PER_TICK,
    Scheduler,
    Timing,
    plan,
    room,
)
from minions.runs._tables import runs_table, schedules_table

PARIS = ZoneInfo("Europe/Paris")


def write_recipe(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    path = folder / "tick.yaml"
    path.write_text(chain(steps=["one"]).replace("id: ledger", "id: tick", 1))
    return path


def queue_nothing(db: sa.Connection, run_id: str, attempt: int) -> None:
    """The queue's enqueue, for ticks whose runs no worker takes (the test moves them)."""


# -- the plan ----------------------------------------------------------------------------------


def test_catch_up_all_fires_a_bounded_backlog_a_few_slots_a_tick() -> None:
    every = Timing(every=60)
    now = 1_800_000_000.0
    cursor = now - 86_400  # a day without a worker: 1440 slots missed
    first = plan(every, "all", cursor, now, 60)
    assert len(first.fire) == MAX_PER_TICK
    assert first.skipped == 1440 - MAX_BACKLOG
    assert first.reason == "backlog"
    assert first.fire[0] == every.latest(now) - (MAX_BACKLOG - 1) * 60  # the latest 100
    assert first.cursor == first.fire[-1]
    # While the schedule's runs wait in the queue, the next ticks fire nothing and skip nothing.
    waiting = plan(every, "all", first.cursor, now, 60, queued=MAX_PER_TICK)
    assert (waiting.fire, waiting.cursor, waiting.skipped) == ((), first.cursor, 0)
    some = plan(every, "all", first.cursor, now, 60, queued=MAX_PER_TICK - 3)
    assert len(some.fire) == 3
    # The whole catch-up fires the backlog, no more, each slot once.
    fired, at = list(first.fire), first.cursor
    while (step := plan(every, "all", at, now, 60)).fire:
        fired += step.fire
        at = step.cursor
    assert len(fired) == MAX_BACKLOG == len(set(fired))
    assert fired[-1] == every.latest(now)


def test_the_overlap_policies_say_how_many_slots_may_fire() -> None:
    def may(overlap: Overlap, active: int, queued: int, catch_up: CatchUp = "one") -> int:
        return room(overlap, catch_up, active=active, queued=queued)

    assert [may("skip", a, q) for a, q in ((0, 0), (1, 0), (1, 1))] == [1, 0, 0]
    # buffer_one: one running and none waiting lets one wait; no more
    assert [may("buffer_one", a, q) for a, q in ((0, 0), (1, 0), (1, 1), (2, 0))] == [1, 1, 0, 0]
    assert may("allow", 5, 5) == MAX_PER_TICK
    assert may("allow", 5, MAX_PER_TICK, "all") == 0  # the queue's bound of a catch-up
    every = Timing(every=60)
    skipped = plan(every, "one", 0.0, 61.0, 60, overlap="skip", active=1)
    assert (skipped.fire, skipped.cursor, skipped.skipped, skipped.reason) == (
        (),
        60.0,
        1,
        "overlap",
    )
    # With catch-up `all`, a slot the overlap policy holds back waits instead of being skipped.
    held = plan(every, "all", 0.0, 61.0, 60, overlap="skip", active=1)
    assert (held.fire, held.cursor, held.skipped) == ((), 0.0, 0)


# -- daylight saving time ------------------------------------------------------------------------


def fired_over(expression: str, start: datetime, hours: int, step: float = 20.0) -> list[datetime]:
    """The slots the default policy fires, ticking every `step` seconds for `hours`."""
    timing = Timing(cron=expression, timezone="Europe/Paris")
    now = cursor = start.timestamp()
    fired: list[float] = []
    for _ in range(int(hours * 3600 / step)):
        now += step
        decided = plan(timing, "one", cursor, now, 60)
        fired += decided.fire
        cursor = decided.cursor
    return [datetime.fromtimestamp(s, PARIS) for s in fired]


def test_at_a_fall_back_the_repeated_hour_fires_each_slot_once() -> None:
    """25 October 2026 in Paris: 02:00-03:00 is lived twice. Expressions with a wildcard
    minute or hour keep to elapsed time (an every-minute cron fires 120 times over the
    repeated hour's two passes); one at a fixed time of day fires once."""
    midnight = datetime(2026, 10, 25, 0, 0, tzinfo=PARIS)
    every_minute = fired_over("* * * * *", midnight, 4)
    repeated = [s for s in every_minute if s.hour == 2]
    assert len(repeated) == 120
    assert len({s.timestamp() for s in every_minute}) == len(every_minute) == 240
    assert [s.strftime("%H:%M%z") for s in fired_over("0 * * * *", midnight, 4)] == [
        "01:00+0200",
        "02:00+0200",
        "02:00+0100",
        "03:00+0100",
    ]
    assert [s.strftime("%d %H:%M%z") for s in fired_over("30 2 * * *", midnight, 30)] == [
        "25 02:30+0200",
        "26 02:30+0100",
    ]
    quarter = fired_over("*/15 2 * * *", midnight, 4)
    assert len(quarter) == 8


def test_at_a_spring_forward_the_skipped_hour_is_documented() -> None:
    """29 March 2026 in Paris: 02:00 -> 03:00. Elapsed time has no 02:xx; a slot at a fixed
    time in the skipped hour fires at 03:00."""
    midnight = datetime(2026, 3, 29, 0, 0, tzinfo=PARIS)
    every_minute = fired_over("* * * * *", midnight, 4)
    assert len(every_minute) == 240  # four hours of elapsed time, one slot a minute
    assert not [s for s in every_minute if s.hour == 2]
    assert [s.strftime("%H:%M%z") for s in fired_over("30 2 * * *", midnight, 4)] == ["03:00+0200"]
    assert fired_over("*/15 2 * * *", midnight, 4) == []


def test_latest_and_after_in_the_repeated_hours_second_pass() -> None:
    second_pass = datetime(2026, 10, 25, 1, 30, 10, tzinfo=UTC).timestamp()  # 02:30:10+01
    minute = Timing(cron="* * * * *", timezone="Europe/Paris")
    assert minute.latest(second_pass) == second_pass - 10
    assert minute.after(second_pass) == second_pass + 50
    fixed = Timing(cron="30 2 * * *", timezone="Europe/Paris")
    first_pass = datetime(2026, 10, 25, 0, 30, tzinfo=UTC).timestamp()  # 02:30+02
    assert fixed.latest(second_pass) == first_pass
    assert fixed.after(second_pass) == datetime(2026, 10, 26, 2, 30, tzinfo=PARIS).timestamp()


# -- the store ---------------------------------------------------------------------------------------


async def test_a_catching_up_schedule_never_buries_an_ordinary_run(
    tmp_path: Path, url: str
) -> None:
    """A schedule every minute, catch-up `all`, after a day without a worker, and an ordinary
    run submitted meanwhile: the ordinary run is behind at most `MAX_PER_TICK` scheduled
    runs; the catch-up fires the latest `MAX_BACKLOG` slots, each once, as its runs start."""
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    added = await store.add_schedule(
        recipe, every="1m", catch_up="all", overlap="allow", inputs={"tag": "s"}
    )
    blocking = Database(url)
    now = added.created_at + 86_400
    scheduler = Scheduler(blocking, queue_nothing, clock=lambda: now)
    for _ in range(5):  # no run starts meanwhile: the queue's bound holds
        scheduler.tick()
    assert await queued_of(store, "tick") == MAX_PER_TICK
    ordinary_id, _ = await store.submit(recipe, inputs={"tag": "o"})
    ordinary = await store.get(ordinary_id)
    ahead = await queued_before(blocking, ordinary)
    assert ahead == MAX_PER_TICK  # not thousands
    record = await store.schedule("tick")
    assert (record.late, record.late_reason) == (True, "backlog")
    assert record.late_slots >= 1440 - MAX_BACKLOG
    while scheduler.tick() or await queued_of(store, "tick"):
        start_all(blocking, "tick")  # the workers take them
    runs = await store.list_runs(schedule="tick", limit=1000)
    slots = [r.slot for r in runs]
    assert len(slots) == MAX_BACKLOG == len(set(slots))
    blocking.close()
    await store.aclose()


async def queued_of(store: RunStore, schedule: str) -> int:
    return len(
        [r for r in await store.list_runs(schedule=schedule, limit=1000) if r.status == "queued"]
    )


async def queued_before(blocking: Database, run: RunRecord) -> int:
    """Runs queued before `run` (the queue is first come, first served)."""
    created = run.created_at
    with blocking.read() as db:
        return int(
            db.execute(
                sa.select(sa.func.count()).where(
                    runs_table.c.status == "queued", runs_table.c.created_at < created
                )
            ).scalar_one()
        )


def start_all(blocking: Database, schedule: str) -> None:
    with blocking.begin() as db:
        db.execute(
            runs_table.update()
            .where(runs_table.c.schedule == schedule, runs_table.c.status == "queued")
            .values(status="running")
        )


@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "allow"])
async def test_a_one_minute_schedule_of_a_three_minute_recipe(
    tmp_path: Path, url: str, overlap: Overlap
) -> None:
    """Forty minutes of a schedule every minute whose runs take three minutes, on two free
    workers (the clock is the test's; a run starts at the first tick after it is queued and
    ends three minutes after it started), fired by two workers' ticks at once: `skip` never has two runs at once, `buffer_one`
    never more than one waiting, `allow` piles them up. Skipped slots flag the schedule late."""
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    added = await store.add_schedule(recipe, every="1m", overlap=overlap, inputs={"tag": overlap})
    blocking = Database(url)
    clock = [added.created_at]
    # Two workers' schedulers, ticking at once: the overlap policy holds across them.
    schedulers = [Scheduler(Database(url), queue_nothing, clock=lambda: clock[0]) for _ in range(2)]
    pool = ThreadPoolExecutor(2)
    most_active = most_queued = 0
    for _ in range(40 * 4):
        clock[0] += 15
        list(pool.map(lambda s: s.tick(), schedulers))
        with blocking.read() as db:
            active = db.execute(
                sa.select(runs_table.c.status, sa.func.count())
                .where(
                    runs_table.c.schedule == "tick",
                    runs_table.c.status.in_(("queued", "running")),
                )
                .group_by(runs_table.c.status)
            ).all()
        counts: dict[str, int] = dict(active)
        most_active = max(most_active, sum(counts.values()))
        most_queued = max(most_queued, counts.get("queued", 0))
        work(blocking, clock[0], workers=2)
    record = await store.schedule("tick")
    if overlap == "skip":
        assert most_active == 1
        assert (record.late, record.late_reason) == (True, "overlap")
        assert record.fired + record.late_slots == 40  # each slot fired or skipped
        assert record.fired >= 10
    elif overlap == "buffer_one":
        assert (most_queued, most_active) == (1, 2)
        assert record.late_reason == "overlap"
        assert record.fired + record.late_slots == 40
    else:
        assert most_active > 10  # they pile up, as asked
        assert record.fired == 40
        assert not record.late
    pool.shutdown()
    for scheduler in schedulers:
        scheduler.database.close()
    blocking.close()
    await store.aclose()


def work(blocking: Database, now: float, *, workers: int) -> None:
    """The workers at `now`: runs three minutes old end, queued runs start on a free one."""
    with blocking.begin() as db:
        db.execute(
            runs_table.update()
            .where(runs_table.c.status == "running", runs_table.c.started_at <= now - 180)
            .values(status="completed", finished_at=now)
        )
        running = db.execute(
            sa.select(sa.func.count()).where(runs_table.c.status == "running")
        ).scalar_one()
        waiting = db.execute(
            sa.select(runs_table.c.run_id)
            .where(runs_table.c.status == "queued")
            .order_by(runs_table.c.slot)
            .limit(max(0, workers - running))
        ).all()
        for (run_id,) in waiting:
            db.execute(
                runs_table.update()
                .where(runs_table.c.run_id == run_id)
                .values(status="running", started_at=now)
            )


async def test_a_late_slot_is_flagged_and_an_on_time_one_clears_it(
    tmp_path: Path, url: str
) -> None:
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    added = await store.add_schedule(recipe, every="5m", overlap="allow", inputs={"tag": "l"})
    blocking = Database(url)
    clock = [added.next_at + 90]  # the worker came 90 s after the slot
    scheduler = Scheduler(blocking, queue_nothing, clock=lambda: clock[0])
    assert len(scheduler.tick()) == 1
    runner = CliRunner()
    shown = await asyncio.to_thread(
        runner.invoke, app, ["schedules", "show", "tick", "--database-url", url]
    )
    assert "overlap allow" in shown.output
    assert "late: a slot fired over a minute after its time (" in shown.output
    assert "; 1 slot(s) late in all)" in shown.output
    table = await asyncio.to_thread(
        runner.invoke, app, ["schedules", "list", "--database-url", url]
    )
    assert "LATE (late) 1" in table.output, table.output
    late = await store.schedule("tick")
    assert (late.late, late.late_reason, late.late_slots, late.late_at) == (
        True,
        "late",
        1,
        clock[0],
    )
    clock[0] = added.next_at + 300 + 1
    assert len(scheduler.tick()) == 1
    on_time = await store.schedule("tick")
    assert (on_time.late, on_time.late_slots, on_time.late_reason) == (False, 1, "late")
    # What a person sees: the CLI's list, its JSON
    args = ["schedules", "list", "--json", "--database-url", url]
    listed = await asyncio.to_thread(runner.invoke, app, args)
    assert listed.exit_code == 0, listed.output
    assert '"late_slots": 1' in listed.output
    blocking.close()
    await store.aclose()


# -- bounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "every", ["99999999999999999999999d", "3651d", 10**30, "1e400", "inf", "nan", "-5m", 0]
)
async def test_an_interval_too_long_or_not_one_is_a_clear_error(
    tmp_path: Path, url: str, every: str | int
) -> None:
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    with pytest.raises(RecipeError, match="every"):
        await store.add_schedule(recipe, every=every, inputs={"tag": "x"})
    longest = await store.add_schedule(recipe, every="3650d", inputs={"tag": "x"})
    assert longest.every == 3650 * 86400
    assert longest.next_at > longest.created_at
    await store.aclose()


def test_an_interval_too_long_on_the_command_line_exits_2(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path)
    runner = CliRunner()
    db = ["--database-url", f"sqlite:///{tmp_path / 'store.db'}"]
    for every in ("99999999999999999999999d", "1e400", "-1s"):
        result = runner.invoke(app, ["schedules", "add", str(recipe), "--every", every, *db])
        assert result.exit_code == 2, result.output
        assert "every" in result.output
        assert "Traceback" not in result.output
    bad = runner.invoke(
        app, ["schedules", "add", str(recipe), "--every", "1h", "--overlap", "x", *db]
    )
    assert bad.exit_code == 2
    assert "--overlap: 'x' is not one of skip, buffer_one, allow" in bad.output
    made = runner.invoke(
        app,
        [
            "schedules",
            "add",
            str(recipe),
            "--every",
            "1h",
            "--overlap",
            "buffer_one",
            "-i",
            "tag=x",
            *db,
        ],
    )
    assert made.exit_code == 0, made.output
    assert "overlap buffer_one" in made.output


def test_a_schedule_record_has_overlap_and_lateness() -> None:
    fields = {f.name for f in dataclasses.fields(ScheduleRecord)}
    assert {"overlap", "late", "late_slots", "late_at", "late_reason"} <= fields


async def test_a_store_of_schema_5_keeps_its_schedules_allowing_overlap(
    tmp_path: Path, url: str
) -> None:
    """Schedules stored before overlap existed keep what they did (`allow`); new ones skip."""
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    await store.add_schedule(recipe, every="1h", inputs={"tag": "old"})
    await store.aclose()
    engine = sa.create_engine(sqlalchemy_url(url))
    with engine.begin() as db:
        for column in ("overlap", "late", "late_slots", "late_at", "late_reason"):
            db.execute(sa.text(f"ALTER TABLE minions_schedules DROP COLUMN {column}"))
        db.execute(sa.text("UPDATE minions_meta SET value = '5' WHERE key = 'schema_version'"))
    engine.dispose()
    store = RunStore(url, create=True)
    old = await store.schedule("tick")
    assert (old.overlap, old.late, old.late_slots) == ("allow", False, 0)
    new = await store.add_schedule(recipe, every="1h", name="new", inputs={"tag": "new"})
    assert new.overlap == "skip"
    await store.aclose()
    with Database(url).read() as db:
        assert db.execute(sa.select(sa.func.count()).select_from(schedules_table)).scalar_one() == 2


@pytest.mark.slow
async def test_a_worker_runs_a_skip_schedule_one_run_at_a_time(tmp_path: Path, url: str) -> None:
    """The same with a real worker process running the runs: a schedule every minute whose
    run is held (a gate file) for three minutes of the test's clock, fired by a scheduler on
    that clock: the store never has two runs of it active, and each run ran once."""
    recipe = write_recipe(tmp_path)
    ledger, gate = tmp_path / "ledger.txt", tmp_path / "gate"
    gate.touch()
    store = RunStore(url, create=True)
    added = await store.add_schedule(recipe, every="1m", overlap="skip", inputs={"tag": "w"})
    blocking, queue = Database(url), Queue(url)
    queue.client()
    clock = [added.created_at + 86_400]
    scheduler = Scheduler(blocking, queue.enqueue, clock=lambda: clock[0])
    scheduler.tick()  # the cursor goes to the test's clock: the worker's own ticks see nothing due
    before = await store.schedule("tick")
    most = 0

    async def active() -> list[RunRecord]:
        return [
            r
            for r in await store.list_runs(schedule="tick", limit=100)
            if r.status in ("queued", "running", "waiting")
        ]

    with worker(url, tmp_path, "w0", ledger, GATE=str(gate)):
        for minute in range(1, 13):
            clock[0] += 60
            scheduler.tick()
            now_active = await active()
            most = max(most, len(now_active))
            if minute % 3 == 0:  # three minutes of the test's clock: the run ends
                gate.unlink()
                for run in now_active:
                    assert await finished(store, run.run_id, within=60) == "completed"
                gate.touch()
    runs = await store.list_runs(schedule="tick", limit=100)
    assert most == 1
    assert len(runs) == 4
    assert {r.status for r in runs} == {"completed"}
    spans = sorted((r.started_at or 0.0, r.finished_at or 0.0) for r in runs)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # never two at once
    assert len(ledger.read_text().splitlines()) == 4  # each run's step ran once
    record = await store.schedule("tick")
    # Fired at 0, 4, 7 and 10 minutes; the 9 other slots of the 12 minutes were skipped.
    assert (record.fired, record.late_reason) == (4, "overlap")
    assert record.late_slots - before.late_slots == 9
    blocking.close()
    queue.close()
    await store.aclose()
