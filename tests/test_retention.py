"""Retention: pruning finished runs with everything stored of them (steps, events, approvals,
DBOS workflows), in batches while a worker runs others; the SQLite file shrinks; a worker's
`--retention`; a store of schema 2 migrates."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from runs_helpers import finished, insert_run, worker, write_ledger_recipe
from test_runs_lifecycle import completed_once
from typer.testing import CliRunner

from minions.cli._app import app
from minions.runs import RunStore
from minions.runs._db import Database, sqlite_path
from minions.runs._runs import queued_row
from minions.runs._snapshot import RecipeSnapshot
from minions.runs._tables import (
    SCHEMA_VERSION,
    approvals_table,
    events_table,
    meta_table,
    runs_table,
    steps_table,
)

DAY = 86400.0
OLD = RecipeSnapshot(recipe_id="old", yaml="id: old", path=None, hash="-", request_hash="-")


def insert_finished(
    store: Database, count: int, *, status: str = "completed", finished_at: float, events: int = 0
) -> list[str]:
    """`count` finished runs straight into the store, each with a step, an approval and
    `events` events of a few hundred bytes (many at once: one transaction)."""
    ids = [uuid.uuid4().hex for _ in range(count)]
    runs = [
        {
            **queued_row(OLD, run_id=run_id, idempotency_key=None),
            "status": status, "finished_at": finished_at - i, "created_at": finished_at - i - 1,
            "last_seq": events,
        }
        for i, run_id in enumerate(ids)
    ]  # fmt: skip
    payload = '{"kind":"step_completed","text":"' + "x" * 300 + '"}'
    with store.begin() as db:
        db.execute(runs_table.insert(), runs)
        db.execute(
            steps_table.insert(),
            [
                {"run_id": r, "step_id": "s", "visit": 1, "status": "completed",
                 "execution": "{}", "saved_at": finished_at}
                for r in ids
            ],
        )  # fmt: skip
        db.execute(
            approvals_table.insert(),
            [
                {"run_id": r, "call_id": "c", "step_id": "s", "tool": "t", "arguments": "{}",
                 "requested_at": finished_at}
                for r in ids
            ],
        )  # fmt: skip
        if events:
            db.execute(
                events_table.insert(),
                [
                    {"run_id": r, "seq": n, "kind": "step_completed", "step_id": "s",
                     "data": payload}
                    for r in ids
                    for n in range(1, events + 1)
                ],
            )  # fmt: skip
    return ids


def count(store: Database, table: sa.Table, run_ids: list[str] | None = None) -> int:
    query = sa.select(sa.func.count()).select_from(table)
    if run_ids is not None:
        query = query.where(table.c.run_id.in_(run_ids))
    with store.read() as db:
        return int(db.execute(query).scalar_one())


def workflows(store: Database, workflow_ids: list[str]) -> int:
    table = "dbos.workflow_status" if store.postgres else "workflow_status"
    with store.read() as db:
        return int(
            db.execute(
                sa.text(f"SELECT count(*) FROM {table} WHERE workflow_uuid IN :ids").bindparams(
                    sa.bindparam("ids", expanding=True)
                ),
                {"ids": workflow_ids},
            ).scalar_one()
        )


def file_size(url: str) -> int:
    path = sqlite_path(url)
    assert path is not None
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


@pytest.mark.slow
async def test_prune_of_ten_thousand_runs_while_a_worker_runs_others(tmp_path: Path) -> None:
    """10,000 old finished runs (and three old ones a worker ran, with their DBOS workflows)
    go with everything stored of them, while the worker runs twenty new ones to the end; an
    old failed run (not asked for), an old queued one and the new ones are not touched; the
    SQLite file shrinks."""
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    blocking = Database(url)
    old = time.time() - 2 * DAY
    with worker(url, tmp_path, "w1", ledger):
        ran = [(await store.submit(recipe, {"tag": f"old{n}"}))[0] for n in range(3)]
        for run_id in ran:
            assert await finished(store, run_id) == "completed"
        assert workflows(blocking, ran) == 3
        with blocking.begin() as db:
            db.execute(
                runs_table.update().where(runs_table.c.run_id.in_(ran)).values(finished_at=old)
            )
        inserted = await asyncio.to_thread(
            insert_finished, blocking, 10_000, finished_at=old, events=6
        )
        failed = insert_finished(blocking, 1, status="failed", finished_at=old)
        insert_run(blocking, "queued-long-ago")
        with blocking.begin() as db:
            db.execute(
                runs_table.update()
                .where(runs_table.c.run_id == "queued-long-ago")
                .values(created_at=old - DAY)
            )
        before = file_size(url)
        live = [(await store.submit(recipe, {"tag": f"new{n}"}))[0] for n in range(10)]
        pruning = asyncio.create_task(store.prune("1d", statuses=["completed"]))
        live += [(await store.submit(recipe, {"tag": f"new{n}"}))[0] for n in range(10, 20)]
        result = await pruning
        for run_id in live:
            assert await finished(store, run_id) == "completed"
            completed_once(await store.events(run_id))
    assert result.runs == 10_003
    assert result.statuses == ("completed",)
    gone = inserted + ran
    for table in (runs_table, steps_table, events_table, approvals_table):
        assert count(blocking, table, gone) == 0, table.name
    assert workflows(blocking, ran) == 0
    assert workflows(blocking, live) == 20
    left = {r.run_id for r in await store.list_runs(limit=100)}
    assert left == {*live, *failed, "queued-long-ago"}
    assert count(blocking, steps_table, live) == 100  # five steps each, all kept
    assert result.bytes_before is not None
    assert result.bytes_after is not None
    assert result.bytes_after < result.bytes_before / 4
    assert file_size(url) < before / 4
    history = await store.history()
    assert history.pruned_before == result.before
    assert history.oldest_at is not None
    assert history.oldest_at < old  # the queued run, never pruned
    listed = await asyncio.to_thread(
        CliRunner().invoke, app, ["runs", "list", "--database-url", url]
    )
    assert "were pruned" in listed.output
    blocking.close()
    await store.aclose()


async def test_what_a_prune_takes(url: str) -> None:
    """Only finished runs older than the cutoff, of the statuses asked for, but the newest
    `keep`; a dry run counts and deletes nothing."""
    store = RunStore(url, create=True)
    blocking = Database(url)
    old = time.time() - 2 * DAY
    completed = insert_finished(blocking, 10, finished_at=old, events=2)
    failed = insert_finished(blocking, 5, status="failed", finished_at=old)
    recent = insert_finished(blocking, 4, finished_at=time.time())
    insert_run(blocking, "queued")
    dry_cli = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["runs", "prune", "--older-than", "1d", "--status", "failed", "--dry-run", "--json",
         "--database-url", url],
    )  # fmt: skip
    assert dry_cli.exit_code == 0, dry_cli.output
    assert json.loads(dry_cli.output)["runs"] == 5
    dry = await store.prune("1d", dry_run=True)
    assert (dry.runs, dry.dry_run) == (15, True)
    assert count(blocking, runs_table) == 20
    kept = await store.prune("1d", statuses=["completed"], keep=3)
    assert kept.runs == 7
    newest = completed[:3]  # the newest finished first
    assert {r.run_id for r in await store.list_runs(status="completed")} == {*newest, *recent}
    assert count(blocking, events_table, newest) == 6
    everything = await store.prune(3600)
    assert everything.runs == 8
    left = {r.run_id for r in await store.list_runs()}
    assert left == {*recent, "queued"}
    assert not set(failed) & left
    with pytest.raises(ValueError, match="queued is not one of"):
        await store.prune("1d", statuses=["queued"])
    with pytest.raises(ValueError, match="not a duration"):
        await store.prune("soon")
    blocking.close()
    await store.aclose()


@pytest.mark.slow
async def test_a_worker_with_a_retention_keeps_the_newest_runs(tmp_path: Path) -> None:
    """`minions worker --retention "2 runs"` prunes all but the two newest finished runs (its
    audit log says the worker did); `--audit-retention 1h` prunes the audit log's older
    entries."""
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    await store.add_key("old", role="viewer", actor="cli:ops")
    engine = sa.create_engine(url)
    with engine.begin() as db:  # an entry of two hours ago
        db.execute(sa.text("UPDATE minions_audit SET at = at - 7200"))
    engine.dispose()
    ids = [(await store.submit(recipe, {"tag": f"r{n}"}))[0] for n in range(6)]
    with worker(
        url, tmp_path, "w1", tmp_path / "ledger.txt", "--retention", "2 runs",
        "--audit-retention", "1h", MINIONS_RETENTION_EVERY="0.2",
    ):  # fmt: skip
        for run_id in ids:
            await finished_or_pruned(store, run_id)
        for _ in range(200):
            if len(await store.list_runs()) == 2:
                break
            await asyncio.sleep(0.1)
    left = await store.list_runs()
    assert len(left) == 2
    assert all(r.status == "completed" for r in left)
    tags = [line.split()[0] for line in (tmp_path / "ledger.txt").read_text().splitlines()]
    assert sorted(set(tags)) == [f"r{n}" for n in range(6)]  # every run ran, then went
    assert (await store.history()).pruned_at is not None
    audit = await store.audit()
    assert "key.add" not in [e.action for e in audit]  # older than the audit's horizon
    assert [e.action for e in audit].count("run.submit") == 6
    pruned = [e for e in audit if e.action == "history.prune"]
    assert pruned
    assert {(e.actor, e.address) for e in pruned} == {("system", "w1")}
    assert sum(e.detail["runs"] for e in pruned) == 4
    [cut] = [e for e in audit if e.action == "audit.prune"]  # once: later ones cut nothing
    assert (cut.actor, cut.address, cut.detail["entries"]) == ("system", "w1", 1)
    await store.aclose()


async def finished_or_pruned(store: RunStore, run_id: str) -> None:
    from minions.errors import UnknownRunError

    try:
        await finished(store, run_id)
    except UnknownRunError:
        pass  # finished, and pruned already


async def test_an_older_sqlite_store_is_vacuumed_whole(tmp_path: Path) -> None:
    """A store made before pruning existed does not vacuum incrementally: a prune gives the
    space back with a full VACUUM instead."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as made:  # what an older minions made: auto_vacuum NONE
        made.execute("CREATE TABLE made_before (x INTEGER)")
    url = f"sqlite:///{path}"
    blocking = Database(url, create=True)
    with blocking.read() as db:
        assert db.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 0
    insert_finished(blocking, 2000, finished_at=time.time() - 2 * DAY, events=5)
    store = RunStore(url)
    result = await store.prune("1d")
    assert result.runs == 2000
    assert result.bytes_before is not None
    assert result.bytes_after is not None
    assert result.bytes_after < result.bytes_before / 4
    blocking.close()
    await store.aclose()


def _downgrade_to_2(store: Database) -> None:
    """What a store of schema 2 looked like: no schedules, no schedule of a run."""
    with store.begin() as db:
        db.execute(
            meta_table.update().where(meta_table.c.key == "schema_version").values(value="2")
        )
        db.execute(sa.text("DROP TABLE minions_schedules"))
        db.execute(sa.text("DROP INDEX ix_minions_runs_schedule"))
        db.execute(sa.text("ALTER TABLE minions_runs DROP COLUMN schedule"))
        db.execute(sa.text("ALTER TABLE minions_runs DROP COLUMN slot"))


async def test_a_store_of_schema_2_migrates(url: str, tmp_path: Path) -> None:
    made = Database(url, create=True)
    insert_run(made, "before")
    _downgrade_to_2(made)
    made.close()
    store = RunStore(url)
    record = await store.get("before")
    assert (record.status, record.schedule, record.slot) == ("queued", None, None)
    assert await store.schedules() == []
    recipe = write_ledger_recipe(tmp_path)
    added = await store.add_schedule(recipe, every="1h", inputs={"tag": "m"})
    assert added.name == "ledger"
    blocking = Database(url)
    with blocking.read() as db:
        version = db.execute(
            sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
        ).scalar_one()
    assert int(version) == SCHEMA_VERSION == 14
    blocking.close()
    await store.aclose()
