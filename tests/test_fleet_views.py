"""The fleet views over a store: the workers (alive, dead, the runs each holds now, places of
their own concurrency, records expired after a day), the backlog, the endpoints' load beside
what they taught, and the totals of tokens and cost; in the store, ``minions workers``,
``minions queue``, ``minions endpoints status`` and ``minions usage`` (``--json``) and their
routes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from runs_helpers import insert_run, model_calls, write_ledger_recipe
from service_helpers import TOKEN, auth, write_recipes
from typer.testing import CliRunner

from minions.cli import app
from minions.runs import RunStore, _workers
from minions.runs._db import Database
from minions.runs._tables import meta_table
from minions.service import ServiceConfig, create_app

DAY = 86400.0
NOW = time.time()
PRICED = "https://api.openai.com/v1"  # an endpoint the price table knows
LOCAL = "http://127.0.0.1:8080/v1"  # a server of one's own: its price is unknown


def beat(database: Database, executor_id: str, *, at: float, stopped: bool = False) -> None:
    with database.begin() as db:
        db.execute(
            sa.text(
                "UPDATE minions_workers SET heartbeat_at = :at, stopped_at = :stopped "
                "WHERE executor_id = :id"
            ),
            {"at": at, "stopped": at if stopped else None, "id": executor_id},
        )


def hold(database: Database, run_id: str, holder: str, *, status: str = "running") -> None:
    with database.begin() as db:
        db.execute(
            sa.text(
                "UPDATE minions_runs SET status = :status, holder = :holder, started_at = :at "
                "WHERE run_id = :run"
            ),
            {"status": status, "holder": holder, "run": run_id, "at": NOW},
        )


def fleet_of(url: str) -> Database:
    """A store with three workers: `alive` (2 places, runs `r1`), `killed` (its heartbeats
    stopped a minute ago; it held `r2`, which `alive` took over, and still holds `r3`,
    not taken over yet), `old` (dead for two days: expired); and `q1`, `q2` queued."""
    database = Database(url, create=True)
    for run_id in ("r1", "r2", "r3", "q1", "q2"):
        insert_run(database, run_id)
    for name, places in (("alive", 2), ("killed", 4), ("old", 1)):
        _workers.register(
            database, name, incarnation=f"{name}-i", version="6", host="h", pid=1, places=places
        )
    beat(database, "killed", at=NOW - 60)
    beat(database, "old", at=NOW - 2 * DAY)
    hold(database, "r1", "alive-i")
    hold(database, "r2", "alive-i")  # taken over from `killed`
    hold(database, "r3", "killed-i")
    with database.begin() as db:  # `killed`'s last heartbeat still named r2 and r3
        db.execute(
            sa.text("UPDATE minions_workers SET runs = :runs WHERE executor_id = 'killed'"),
            {"runs": json.dumps(["r2", "r3"])},
        )
    return database


async def test_workers_show_the_runs_they_hold_now_and_dead_ones_expire(url: str) -> None:
    database = fleet_of(url)
    store = RunStore(url)
    try:
        found = {w.executor_id: w for w in await store.workers()}
        assert set(found) == {"alive", "killed"}  # `old` is past the expiry
        assert (found["alive"].alive, found["alive"].runs, found["alive"].places) == (
            True,
            ["r1", "r2"],
            2,
        )
        # The dead worker lists only what it still holds, not what `alive` took over.
        assert (found["killed"].alive, found["killed"].runs, found["killed"].places) == (
            False,
            ["r3"],
            4,
        )
        # A live worker's look for dead workers deletes the expired record.
        assert _workers.expire(database, ["old", "killed"], before=NOW - _workers.EXPIRY) == 1
        assert {w.executor_id for w in _workers.listed(database)} == {"alive", "killed"}
    finally:
        await store.aclose()
        database.close()


async def test_a_worker_has_room_by_its_own_concurrency_not_the_askers(tmp_path: Path) -> None:
    """A worker of 1 place with one run handed to it has no room, whatever the concurrency
    of the worker that asks (before, the asker's own was used: a worker of 8 handed its
    waiting runs to a full worker of 1)."""
    from minions.runs._queue import QUEUE, Queue

    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = RunStore(url, create=True)
    await store.submit(write_ledger_recipe(tmp_path), {"tag": "t"})  # its workflow: ENQUEUED
    await store.aclose()
    database = Database(url)
    _workers.register(database, "small", incarnation="s", version="v", host="h", pid=1, places=1)
    with database.begin() as db:  # handed to "small" by DBOS's queue
        db.execute(sa.text("UPDATE workflow_status SET status = 'PENDING', executor_id = 'small'"))

    def room(places: int) -> bool:
        return _workers.room_elsewhere(database, "big", queue=QUEUE, places=places, now=time.time())

    assert not room(8)
    assert not room(1)
    with database.begin() as db:  # a worker of an older minions said no places of its own
        db.execute(sa.text("UPDATE minions_workers SET places = NULL"))
    assert room(8)
    database.close()
    Queue(url).close()


def test_a_store_of_schema_5_migrates_to_workers_with_places(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    made = Database(url, create=True)
    with made.begin() as db:
        db.execute(meta_table.update().values(value="5"))
        db.execute(sa.text("ALTER TABLE minions_workers DROP COLUMN places"))
        db.execute(sa.text("DROP TABLE minions_notifications"))
    made.close()
    again = Database(url)
    _workers.register(again, "w", incarnation="i", version="v", host="h", pid=1, places=3)
    assert [w.places for w in _workers.listed(again)] == [3]
    with again.read() as db:
        assert db.execute(sa.text("SELECT count(*) FROM minions_notifications")).scalar() == 0
    again.close()


async def test_the_queue_counts_the_backlog_and_lists_the_oldest(url: str) -> None:
    database = fleet_of(url)
    with database.begin() as db:
        db.execute(
            sa.text("UPDATE minions_runs SET created_at = :at WHERE run_id = 'q1'"),
            {"at": NOW - 300},
        )
    store = RunStore(url)
    try:
        state = await store.queue(limit=1)
        assert (state.queued, state.running, state.waiting) == (2, 3, 0)
        assert state.oldest_queued_age >= 300
        assert [r.run_id for r in state.oldest] == ["q1"]
        assert [(r.recipe_id, r.queued) for r in state.by_recipe] == [("x", 2)]
    finally:
        await store.aclose()
        database.close()


def usage_store(url: str) -> Database:
    """Runs of two recipes with priced, unpriced and unreported calls, one still running,
    one from a schedule, one of three days ago."""
    database = Database(url, create=True)
    for run_id, recipe, schedule in (
        ("done", "triage", None),
        ("going", "triage", None),
        ("nightly", "digest", "nightly"),
        ("old", "digest", None),
    ):
        insert_run(database, run_id)
        with database.begin() as db:
            db.execute(
                sa.text(
                    "UPDATE minions_runs SET recipe_id = :recipe, schedule = :schedule, "
                    "status = :status, finished_at = :end WHERE run_id = :run"
                ),
                {
                    "recipe": recipe,
                    "schedule": schedule,
                    "run": run_id,
                    "status": "running" if run_id == "going" else "completed",
                    "end": None if run_id == "going" else NOW - 10,
                },
            )
    model_calls(database, "done", [("openai:gpt-4o", PRICED, 1000, 100, NOW - 60)])
    model_calls(
        database,
        "going",
        [("gpt-4o", PRICED, 2000, 200, NOW - 30), ("qwen", LOCAL, 50, 5, NOW - 20)],
    )
    model_calls(
        database,
        "nightly",
        [("gpt-4o-mini", "", 1000, 1000, NOW - 40), ("qwen", LOCAL, 10, -1, NOW - 40)],
    )
    model_calls(database, "old", [("gpt-4o", PRICED, 9000, 9000, NOW - 3 * DAY)])
    return database


async def test_usage_totals_by_recipe_schedule_and_model_price_unknown_as_unknown(url: str) -> None:
    database = usage_store(url)
    store = RunStore(url)
    try:
        report = await store.usage(since=NOW - DAY, group_by=["model"])
        rows = {r.model: r for r in report.rows}
        assert list(rows) == ["gpt-4o", "gpt-4o-mini", "openai:gpt-4o", "qwen"]
        # gpt-4o at $2.50 / $10 per million tokens (named as minions names it, too).
        assert rows["gpt-4o"].cost == pytest.approx(2000 * 2.5e-6 + 200 * 10e-6)
        assert rows["openai:gpt-4o"].cost == pytest.approx(1000 * 2.5e-6 + 100 * 10e-6)
        assert (rows["gpt-4o"].calls, rows["gpt-4o"].unpriced_calls) == (1, 0)
        assert rows["gpt-4o-mini"].cost == pytest.approx(1000 * 0.15e-6 + 1000 * 0.6e-6)
        # A server of one's own: unknown, never $0; an unreported call counted as such.
        assert (rows["qwen"].cost, rows["qwen"].unpriced_calls, rows["qwen"].unknown_calls) == (
            None,
            2,
            1,
        )
        assert (report.total.calls, report.total.unpriced_calls) == (5, 2)
        assert report.total.prompt_tokens == 1000 + 2050 + 1000  # 3 days ago is out; unreported: 0
        assert report.total.cost == pytest.approx(sum(r.cost or 0 for r in rows.values()))
        assert report.prices.startswith("genai-prices ")

        by_two = await store.usage(since=NOW - DAY, group_by=["recipe", "schedule"])
        assert [(r.recipe, r.schedule, r.calls) for r in by_two.rows] == [
            ("digest", "nightly", 2),
            ("triage", None, 3),
        ]
        by_day = await store.usage(since=NOW - 7 * DAY, group_by=["day"])
        assert sum(r.calls for r in by_day.rows) == 6
        assert len(by_day.rows) >= 2
        with pytest.raises(ValueError, match="at most once"):
            await store.usage(since=0, group_by=["model", "model"])
        with pytest.raises(ValueError, match="day, recipe, schedule, model, project"):
            await store.usage(since=0, group_by=["tenant"])

        # A running run shows its usage so far; a finished one what its end wrote.
        going = await store.get("going")
        assert (going.usage["prompt_tokens"], going.usage["calls"]) == (2050, 2)
        listed = {r.run_id: r.usage for r in await store.list_runs()}
        assert listed["going"] == going.usage
        assert listed["done"] == {}
    finally:
        await store.aclose()
        database.close()


# -- the CLI -------------------------------------------------------------------------------------


def cli(url: str, *args: str) -> Any:
    result = CliRunner().invoke(app, [*args, "--database-url", url])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result.stdout


def test_the_fleet_commands_print_json_and_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    fleet_of(url).close()
    workers = cli(url, "workers", "--json")
    assert [
        (w["executor_id"], w["state"], w["places_used"], w["places"], w["runs"]) for w in workers
    ] == [
        ("alive", "alive", 2, 2, ["r1", "r2"]),
        ("killed", "dead", 1, 4, ["r3"]),
    ]
    assert "2/2" in cli(url, "workers")
    assert "dead" in cli(url, "workers")
    queue = cli(url, "queue", "--json", "--limit", "5")
    assert (queue["queued"], queue["running"], [r["run_id"] for r in queue["oldest"]]) == (
        2,
        3,
        ["q1", "q2"],
    )
    assert queue["by_recipe"] == [
        {"recipe": "x", "queued": 2, "oldest_queued_at": pytest.approx(queue["oldest_queued_at"])}
    ]
    assert "2 queued" in cli(url, "queue")
    assert cli(url, "endpoints", "status", "--json") == []
    usage_store(f"sqlite:///{tmp_path / 'usage.db'}").close()
    usage = cli(
        f"sqlite:///{tmp_path / 'usage.db'}", "usage", "--json", "--by", "model", "--since", "1d"
    )
    assert {r["model"]: r["unpriced_calls"] for r in usage["rows"]} == {
        "gpt-4o": 0, "gpt-4o-mini": 0, "openai:gpt-4o": 0, "qwen": 2,
    }  # fmt: skip
    assert (
        usage["total"]["total_tokens"]
        == usage["total"]["prompt_tokens"] + usage["total"]["completion_tokens"]
    )
    table = cli(f"sqlite:///{tmp_path / 'usage.db'}", "usage", "--by", "model")
    assert "unknown" in table
    assert "genai-prices" in table
    bad = CliRunner().invoke(app, ["usage", "--by", "tenant", "--database-url", url])
    assert (bad.exit_code, "--by 'tenant'" in bad.output) == (2, True)


# -- the API -------------------------------------------------------------------------------------


def test_the_fleet_routes_answer_readers_and_refuse_bad_parameters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    fleet_of(url).close()
    database = Database(url)
    model_calls(database, "r1", [("gpt-4o", PRICED, 1000, 100, NOW - 60)])
    database.close()
    config = ServiceConfig(token=TOKEN, database_url=url, recipes=write_recipes(tmp_path / "r"))
    with TestClient(create_app(config)) as client:
        headers = auth()
        workers = client.get("/workers", headers=headers).json()
        assert [(w["executor_id"], w["alive"], w["runs"], w["places"]) for w in workers] == [
            ("alive", True, ["r1", "r2"], 2),
            ("killed", False, ["r3"], 4),
        ]
        queue = client.get("/queue", headers=headers).json()
        assert (queue["queued"], queue["running"]) == (2, 3)
        assert client.get("/endpoints/status", headers=headers).json() == []
        usage = client.get("/usage?since=2h&group_by=recipe,model", headers=headers).json()
        assert [(r["recipe"], r["model"], r["calls"]) for r in usage["rows"]] == [
            ("x", "gpt-4o", 1)
        ]
        assert usage["total"]["cost"] == pytest.approx(1000 * 2.5e-6 + 100 * 10e-6)
        since = client.get("/usage?since=2026-01-01&group_by=", headers=headers).json()
        assert (since["rows"], since["total"]["calls"]) == ([], 1)
        for bad, status in (
            ("since=yesterday", 422),
            ("group_by=tenant", 400),
            ("group_by=day,day", 400),
            ("since=" + "9" * 80, 422),
        ):
            answer = client.get(f"/usage?{bad}", headers=headers)
            assert answer.status_code == status, (bad, answer.text)
            assert answer.json()["error"]["message"]
        assert client.get("/usage").status_code == 401


async def test_a_live_worker_deletes_the_records_of_workers_dead_for_a_day(tmp_path: Path) -> None:
    """Looking for dead workers' runs, a worker deletes the record of one dead for longer
    than the expiry (after it looked at its runs); a worker dead for less stays listed."""
    from runs_helpers import until, worker

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    database = Database(url, create=True)
    for name in ("ancient", "recent"):
        _workers.register(database, name, incarnation=name, version="6", host="h", pid=1)
    beat(database, "ancient", at=time.time() - 2 * DAY)
    beat(database, "recent", at=time.time() - 60)

    def names() -> set[str]:
        return {w.executor_id for w in _workers.listed(database)}

    with worker(url, tmp_path, "live", tmp_path / "ledger.txt"):
        await until(lambda: "ancient" not in names())
        assert names() == {"live", "recent"}
    database.close()


async def test_endpoints_show_their_load_pause_and_what_their_models_taught(url: str) -> None:
    database = Database(url, create=True)
    now = time.time()
    with database.begin() as db:
        db.execute(
            sa.text("INSERT INTO minions_endpoint_gates (endpoint, paused_until) VALUES (:e, :p)"),
            {"e": "http://user:pw@gpu:8080/v1", "p": now + 60},
        )
        db.execute(
            sa.text(
                "INSERT INTO minions_endpoint_calls (call_id, endpoint, holder, started_at, "
                "tokens, lease_until) VALUES (:c, 'http://user:pw@gpu:8080/v1', 'h', :at, 100, :u)"
            ),
            [{"c": c, "at": now - 5, "u": now + 30} for c in ("a", "b")],
        )
        db.execute(
            sa.text(
                "INSERT INTO minions_endpoint_waiters (endpoint, ticket, since, seen_at, tokens) "
                "VALUES ('http://user:pw@gpu:8080/v1', 't', :at, :at, 10)"
            ),
            {"at": now},
        )
        db.execute(
            sa.text(
                "INSERT INTO minions_capabilities (base_url, model, rejected, worked, learned_at) "
                "VALUES (:u, :m, :r, :w, :at)"
            ),
            [
                {"u": "http://user:pw@gpu:8080/v1", "m": "qwen", "r": '["json_schema"]',
                 "w": "tool", "at": now},
                {"u": "http://other:11434/v1", "m": "llama", "r": "[]", "w": "json_schema",
                 "at": now},
            ],
        )  # fmt: skip
    database.close()
    store = RunStore(url)
    try:
        limited, unlimited = await store.endpoint_status()
    finally:
        await store.aclose()
    assert limited.endpoint == "http://***@gpu:8080/v1"  # no credentials
    assert limited.load is not None
    assert (limited.load.in_flight, limited.load.waiting, limited.load.requests) == (2, 1, 2)
    assert (limited.load.tokens, limited.load.paused_until > now) == (200, True)
    assert [(e.model, e.output_mode, e.rejected) for e in limited.learned] == [
        ("qwen", "tool", ("json_schema",))
    ]
    assert (unlimited.endpoint, unlimited.load) == ("http://other:11434/v1", None)
    assert [e.output_mode for e in unlimited.learned] == ["json_schema"]
