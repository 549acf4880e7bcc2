"""Schedules: slots of intervals and cron expressions, each fired once by any number of
workers, the catch-up policies across a gap (no worker, or the store stopped), pause,
resume and remove; the CLI, the YAML `schedule:` key and the REST API."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx2
import pytest
from postgres import cluster, fresh_database, pg_ctl
from runs_helpers import TOOLS, chain, finished, until, worker
from service_helpers import TOKEN, app_in_thread, auth, write_recipes
from typer.testing import CliRunner

from minions.cli._app import app
from minions.errors import RecipeError, ScheduleExistsError, UnknownScheduleError
from minions.runs import RunStore, ScheduleRecord
from minions.runs._db import Database
from minions.runs._queue import Queue
from minions.runs._schedules import Scheduler, Timing, get, plan
from minions.service import ServiceConfig, create_app


def write_recipe(folder: Path, schedule: str = "") -> Path:
    """A one-step recipe whose tool step marks the ledger; `schedule`: its `schedule:`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    path = folder / "tick.yaml"
    path.write_text(chain(steps=["one"]).replace("id: ledger", "id: tick", 1) + schedule)
    return path


# -- slots ----------------------------------------------------------------------------------------


def test_slots_of_an_interval_are_multiples_of_it() -> None:
    every = Timing(every=300)
    assert every.after(1000.0) == 1200.0
    assert every.after(1200.0) == 1500.0
    assert every.latest(1200.0) == 1200.0
    assert every.latest(1199.5) == 900.0


def test_slots_of_a_cron_expression_follow_its_time_zone() -> None:
    paris = ZoneInfo("Europe/Paris")
    morning = Timing(cron="0 7 * * 1-5", timezone="Europe/Paris")
    friday = datetime(2026, 11, 27, 8, 0, tzinfo=paris).timestamp()
    monday = datetime(2026, 11, 30, 7, 0, tzinfo=paris).timestamp()
    assert morning.after(friday) == monday  # the weekend has no slot
    assert morning.latest(friday) == datetime(2026, 11, 27, 7, 0, tzinfo=paris).timestamp()
    assert morning.latest(monday) == monday
    # 02:30 does not exist in Paris on 29 March 2026 (02:00 -> 03:00): that day's slot is at 03:00
    night = Timing(cron="30 2 * * *", timezone="Europe/Paris")
    before = datetime(2026, 3, 29, 0, 0, tzinfo=paris).timestamp()
    assert night.after(before) == datetime(2026, 3, 29, 3, 0, tzinfo=paris).timestamp()


def test_catch_up_policies_choose_among_the_missed_slots() -> None:
    every = Timing(every=10)
    assert plan(every, "all", 100.0, 145.0, 60).fire == (110.0, 120.0, 130.0, 140.0)
    assert plan(every, "one", 100.0, 145.0, 60).fire == (140.0,)
    assert plan(every, "none", 100.0, 145.0, 60).fire == (140.0,)  # 5 s late: on time
    late = plan(every, "none", 100.0, 145.0, 3)
    assert late.fire == ()
    assert late.cursor == 140.0
    assert plan(every, "one", 140.0, 145.0, 60).fire == ()  # nothing new since the cursor


# -- the store --------------------------------------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[str]:
    """A cluster of this test's own, to stop and start."""
    with cluster() as url:
        yield url


async def test_each_catch_up_policy_across_a_gap_of_no_worker(tmp_path: Path, url: str) -> None:
    """Nothing ticked for three slots and more than a minute after the last of them: `all`
    fires each missed slot, `one` the latest, `none` none; the next slot fires for all."""
    await _catch_up_across_a_gap(tmp_path, url, stop_store=False)


@pytest.mark.slow
async def test_each_catch_up_policy_across_a_stopped_store(
    tmp_path: Path, own_postgres: str
) -> None:
    """The same across a Postgres stopped over those slots: ticks fail meanwhile, and the
    first after it starts again follows each policy."""
    await _catch_up_across_a_gap(tmp_path, own_postgres, stop_store=True)


async def _catch_up_across_a_gap(tmp_path: Path, url: str, *, stop_store: bool) -> None:
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    for policy in ("none", "one", "all"):
        await store.add_schedule(
            recipe,
            every="5m",
            name=policy,
            catch_up=policy,
            overlap="allow",  # nothing runs the runs: each stays queued
            inputs={"tag": policy},
        )
    blocking, queue = Database(url), Queue(url)
    queue.client()
    now = [(await store.schedule("all")).created_at]
    scheduler = Scheduler(blocking, queue.enqueue, clock=lambda: now[0])
    first = Timing(every=300).after(now[0])

    async def slots() -> dict[str, list[float]]:
        return {
            p: sorted(r.slot or 0.0 for r in await store.list_runs(schedule=p))
            for p in ("none", "one", "all")
        }

    now[0] = first - 1
    assert scheduler.tick() == []
    now[0] = first + 1
    assert len(scheduler.tick()) == 3
    if stop_store:
        await asyncio.to_thread(pg_ctl, url, "stop")
        now[0] = first + 301
        with pytest.raises(Exception):  # noqa: B017 (what the driver says of a stopped server)
            scheduler.tick()
        await asyncio.to_thread(pg_ctl, url, "start")
    now[0] = first + 900 + 100  # three slots missed; the latest is 100 s late
    for _ in range(5):  # a pooled connection of the stopped server fails once
        try:
            scheduler.tick()
            break
        except Exception:
            continue
    assert await slots() == {
        "all": [first, first + 300, first + 600, first + 900],
        "one": [first, first + 900],
        "none": [first],
    }
    lateness = {
        p: (r.late, r.late_reason, r.late_slots)
        for p in ("none", "one", "all")
        for r in [await store.schedule(p)]
    }
    assert lateness == {
        "none": (True, "catch-up", 3),  # three skipped
        "one": (True, "catch-up", 3),  # two skipped, the latest fired 100 s late
        "all": (True, "late", 3),  # three fired over a minute late
    }
    now[0] = first + 1200 + 1
    scheduler.tick()
    assert scheduler.tick() == []  # once
    after = await slots()
    assert all(fired[-1] == first + 1200 for fired in after.values())
    assert len(after["all"]) == 5
    record = await store.schedule("none")
    assert not record.late  # the slot after fired on time
    assert record.late_slots == 3
    assert record.last_slot == first + 1200
    assert record.fired == 2
    assert record.next_at == first + 1500
    blocking.close()
    queue.close()
    await store.aclose()


async def test_a_paused_schedule_fires_nothing_and_resumes_from_its_next_slot(
    tmp_path: Path, url: str
) -> None:
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    added = await store.add_schedule(
        recipe, every="1m", catch_up="all", overlap="allow", inputs={"tag": "p"}
    )
    assert added.name == "tick"
    assert added.next_at == Timing(every=60).after(added.created_at)
    blocking, queue = Database(url), Queue(url)
    queue.client()
    now = [added.next_at + 1]
    scheduler = Scheduler(blocking, queue.enqueue, clock=lambda: now[0])
    assert len(scheduler.tick()) == 1
    await store.pause_schedule("tick")
    now[0] += 600
    assert scheduler.tick() == []  # ten slots while paused: none fires, even with `all`
    resumed = await store.resume_schedule("tick")
    assert not resumed.paused
    assert resumed.next_at > resumed.created_at
    now[0] = resumed.next_at + 1
    assert len(scheduler.tick()) == 1
    runs = await store.list_runs(schedule="tick")
    assert [r.slot for r in runs] == [resumed.next_at, added.next_at]
    assert {r.inputs["tag"] for r in runs} == {"p"}
    await store.remove_schedule("tick")
    now[0] += 600
    assert scheduler.tick() == []
    assert len(await store.list_runs(schedule="tick")) == 2  # its runs stay
    with pytest.raises(UnknownScheduleError, match="no schedule 'tick'"):
        await store.schedule("tick")
    with pytest.raises(UnknownScheduleError):
        await store.pause_schedule("tick")
    blocking.close()
    queue.close()
    await store.aclose()


async def test_a_slot_fired_before_the_schedule_was_added_again_queues_nothing_again(
    tmp_path: Path, url: str
) -> None:
    """A schedule removed and added again starts before a slot it fired already: that slot
    keeps the one run queued then (its idempotency key names the slot), submitted once in
    the audit log, in the schedule's project."""
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)

    async def add() -> ScheduleRecord:
        return await store.add_schedule(
            recipe, every="24h", overlap="allow", inputs={"tag": "a"}, project="ops"
        )

    added = await add()
    blocking, queue = Database(url), Queue(url)
    queue.client()
    scheduler = Scheduler(blocking, queue.enqueue, clock=lambda: added.next_at + 1)
    [run_id] = scheduler.tick()
    await store.remove_schedule("tick")
    again = await add()
    assert again.next_at == added.next_at  # the slot is due again
    assert scheduler.tick() == []
    assert (await store.schedule("tick")).next_at > added.next_at  # and passed over
    assert [r.run_id for r in await store.list_runs(schedule="tick")] == [run_id]
    submitted = await store.audit(action="run.submit")
    assert [(e.target, e.actor, e.project) for e in submitted] == [(run_id, "schedule:tick", "ops")]
    blocking.close()
    queue.close()
    await store.aclose()


async def test_the_recipe_is_snapshotted_and_replaced_by_adding_it_again(
    tmp_path: Path, url: str
) -> None:
    recipe = write_recipe(tmp_path)
    store = RunStore(url, create=True)
    first = await store.add_schedule(recipe, every="1h", inputs={"tag": "a"})
    recipe.write_text(recipe.read_text().replace("step: one", "step: edited"))
    with pytest.raises(ScheduleExistsError, match="--replace"):
        await store.add_schedule(recipe, every="1h", inputs={"tag": "a"})
    assert (await store.schedule("tick")).recipe_hash == first.recipe_hash  # the snapshot
    replaced = await store.add_schedule(
        recipe, cron="*/5 * * * *", inputs={"tag": "b"}, replace=True
    )
    assert replaced.recipe_hash != first.recipe_hash
    assert (replaced.cron, replaced.every, replaced.inputs) == ("*/5 * * * *", None, {"tag": "b"})
    assert [s.name for s in await store.schedules()] == ["tick"]
    await store.aclose()


async def test_a_recipes_own_schedule_is_registered_and_checked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    recipe = write_recipe(
        tmp_path, "schedule:\n  cron: '0 3 * * *'\n  timezone: Asia/Tokyo\n  inputs: {tag: n}\n"
    )
    store = RunStore(url, create=True)
    record = await store.add_schedule(recipe, catch_up="none")
    assert (record.cron, record.timezone, record.catch_up) == ("0 3 * * *", "Asia/Tokyo", "none")
    assert record.inputs == {"tag": "n"}
    other = await store.add_schedule(recipe, every="10s", name="often", inputs={"tag": "o"})
    assert (other.cron, other.every, other.timezone) == (None, 10, "Asia/Tokyo")
    bare = write_recipe(tmp_path / "bare")
    with pytest.raises(RecipeError, match="has no `schedule:`"):
        await store.add_schedule(bare)
    with pytest.raises(RecipeError, match="not a cron expression"):
        await store.add_schedule(bare, cron="61 * * * *", name="bad")
    with pytest.raises(RecipeError, match="unknown time zone"):
        await store.add_schedule(bare, every="1m", timezone="Mars/Olympus", name="bad")
    with pytest.raises(RecipeError, match="tag"):
        await store.add_schedule(bare, every="1m", name="bad")
    assert [s.name for s in await store.schedules()] == ["often", "tick"]
    await store.aclose()


# -- workers --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "workers"), [("sqlite", 2), ("postgres", 3)])
async def test_workers_fire_each_slot_once_and_stop_when_paused_or_removed(
    tmp_path: Path, kind: str, workers: int, request: pytest.FixtureRequest
) -> None:
    """A schedule every second over worker processes on one store: each slot fires one run,
    none is missed, every run completes; pausing and removing stop the firing (seen from a
    second schedule that goes on firing meanwhile)."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres"), "schedules")
    recipe = write_recipe(tmp_path)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    await store.add_schedule(
        recipe, every="1s", catch_up="all", overlap="allow", inputs={"tag": "s"}
    )
    blocking = Database(url)

    def fired(name: str) -> int:
        return get(blocking, name).fired

    with ExitStack() as stack:
        for n in range(workers):
            stack.enter_context(worker(url, tmp_path, f"w{n}", ledger))
        start = fired("tick")
        await until(lambda: fired("tick") >= start + 6, within=120)
        await store.pause_schedule("tick")
        paused = fired("tick")
        await store.add_schedule(
            recipe, every="1s", catch_up="all", overlap="allow", name="witness", inputs={"tag": "w"}
        )
        await until(lambda: fired("witness") >= 3, within=60)
        assert fired("tick") == paused
        await store.resume_schedule("tick")
        await until(lambda: fired("tick") >= paused + 3, within=60)
        await store.remove_schedule("tick")
        removed = len(await store.list_runs(schedule="tick", limit=1000))
        seen = fired("witness")
        await until(lambda: fired("witness") >= seen + 3, within=60)
        runs = await store.list_runs(schedule="tick", limit=1000)
        assert len(runs) == removed
        for run in runs:
            assert await finished(store, run.run_id, within=120) == "completed"
    slots = sorted(r.slot or 0.0 for r in runs)
    assert len(slots) == len(set(slots))  # once each
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert sum(gap > 1 for gap in gaps) == 1, gaps  # none missed, but over the pause
    marks = [line.split()[0] for line in ledger.read_text().splitlines()]
    assert marks.count("s") == len(runs)  # each run's step ran once
    blocking.close()
    await store.aclose()


# -- the CLI and the API ----------------------------------------------------------------------------


def test_schedules_from_the_command_line(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "schedule:\n  every: 1h\n  inputs: {tag: cli}\n")
    db = ["--database-url", f"sqlite:///{tmp_path / 'store.db'}"]
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, [*args, *db])
        return result.exit_code, result.output

    code, out = run("schedules", "add", str(recipe), "--json")
    assert code == 0, out
    assert json.loads(out)["every"] == 3600
    assert json.loads(out)["inputs"] == {"tag": "cli"}
    code, out = run(
        "schedules", "add", str(recipe), "--cron", "0 7 * * 1-5", "--name", "morning",
        "--timezone", "Europe/Paris", "--catch-up", "all", "-i", "tag=m",
    )  # fmt: skip
    assert code == 0
    assert "schedule morning: tick, cron 0 7 * * 1-5 (Europe/Paris)" in out
    code, out = run("schedules", "list")
    assert code == 0
    assert "morning" in out
    assert "every 3600s" in out
    code, out = run("schedules", "pause", "morning", "--json")
    assert code == 0
    assert json.loads(out)["paused"] is True
    code, out = run("schedules", "show", "morning")
    assert code == 0
    assert "paused" in out
    code, out = run("schedules", "resume", "morning")
    assert code == 0
    assert "next " in out
    code, out = run("schedules", "show", "morning", "--json")
    assert json.loads(out)["runs"] == []
    assert json.loads(out)["paused"] is False
    code, out = run("schedules", "add", str(recipe), "--every", "2h")
    assert code == 2
    assert "exists already" in out
    assert "--replace" in out
    code, out = run("schedules", "add", str(recipe), "--every", "2h", "--replace")
    assert code == 0
    assert "every 7200s" in out
    code, out = run("schedules", "add", str(recipe), "--every", "2h", "--cron", "* * * * *")
    assert code == 2
    assert "either --cron or --every" in out
    code, out = run("schedules", "add", str(recipe), "--every", "soon", "--name", "x")
    assert code == 2
    assert "'soon' is not a duration" in out
    code, out = run("schedules", "remove", "morning")
    assert code == 0
    assert "removed" in out
    code, out = run("schedules", "remove", "morning")
    assert code == 2
    assert "no schedule 'morning'" in out
    code, out = run("schedules", "list", "--json")
    assert [s["name"] for s in json.loads(out)] == ["tick"]


def test_schedules_through_the_api(tmp_path: Path) -> None:
    folder = write_recipes(tmp_path / "recipes")
    config = ServiceConfig(
        token=TOKEN, database_url=f"sqlite:///{tmp_path / 'api' / 'minions.db'}", recipes=folder
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as c,
    ):
        body = {"recipe": "ledger", "every": "1h", "inputs": {"tag": "api"}}
        created = c.post("/schedules", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["name"] == "ledger"
        assert created.json()["every"] == 3600
        assert (created.json()["overlap"], created.json()["late"]) == ("skip", False)
        again = c.post("/schedules", json=body)
        assert again.status_code == 409
        assert again.json()["error"]["type"] == "schedule_exists"
        replaced = c.post(
            "/schedules",
            json={**body, "cron": None, "every": "2h", "overlap": "buffer_one", "replace": True},
        )
        assert replaced.status_code == 201
        assert replaced.json()["overlap"] == "buffer_one"
        too_long = c.post("/schedules", json={**body, "name": "long", "every": "9" * 30 + "d"})
        assert too_long.status_code == 400
        assert "every" in too_long.json()["error"]["message"]
        assert replaced.json()["every"] == 7200
        bad = c.post("/schedules", json={**body, "name": "bad", "cron": "nope", "every": None})
        assert bad.status_code == 400
        assert "not a cron expression" in bad.text
        unknown = c.post("/schedules", json={**body, "recipe": "nope"})
        assert unknown.status_code == 400
        assert unknown.json()["error"]["type"] == "unknown_recipe"
        assert [s["name"] for s in c.get("/schedules").json()] == ["ledger"]
        assert c.post("/schedules/ledger/pause").json()["paused"] is True
        assert c.post("/schedules/ledger/resume").json()["paused"] is False
        detail = c.get("/schedules/ledger").json()
        assert detail["runs"] == []
        assert detail["next_at"] > detail["created_at"]
        assert c.delete("/schedules/ledger").status_code == 204
        gone = c.get("/schedules/ledger")
        assert gone.status_code == 404
        assert gone.json()["error"]["type"] == "unknown_schedule"
        assert httpx2.get(f"{base}/schedules").status_code == 401
        paths = c.get("/openapi.json").json()["paths"]
        assert {"/schedules", "/schedules/{name}", "/schedules/{name}/pause"} <= set(paths)
        history = c.get("/runs").json()["history"]
        assert history == {
            "oldest_at": None,
            "pruned_before": None,
            "pruned_at": None,
            "pruned_by": None,
        }


def test_a_schedule_record_says_its_timing() -> None:
    cron = ScheduleRecord(
        name="n", recipe_id="r", inputs={}, cron="0 7 * * *", every=None,
        timezone="Asia/Tokyo", catch_up="one", paused=False, created_at=0.0, next_at=1.0,
    )  # fmt: skip
    every = dataclasses.replace(cron, cron=None, every=30, timezone="UTC")
    assert (cron.timing, every.timing) == ("cron 0 7 * * * (Asia/Tokyo)", "every 30s")
