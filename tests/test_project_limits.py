"""Limits per project (`projects:` of the limits file), on SQLite and Postgres: a run of a
project at its runs in flight, or at its tokens of the last 24 hours, is parked (queued, no
worker's place held) and queued again when there is room; claims of one project take turns;
then the proof over two worker processes: a project limited to one run in flight never has
two running, and every run completes."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from runs_helpers import TOOLS, WorkerProcess, chain, finished, watched

from minions.errors import ConfigError, UnknownRunError
from minions.models import Limits, ProjectLimit
from minions.runs import RunStore
from minions.runs import _runs as runs
from minions.runs._db import Database
from minions.runs._leases import Start
from minions.runs._project_limits import claim, unpark
from minions.runs._tables import runs_table

NOW = 1_900_000_000.0


def _claim(database: Database, run_id: str, limit: ProjectLimit, attempt: int = 1) -> object:
    return claim(
        database,
        run_id,
        limit,
        attempt=attempt,
        holder="h",
        executor_id="w",
        lease_until=NOW + 30,
        now=NOW,
    )


def _recipe(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    recipe = folder / "recipe.yaml"
    recipe.write_text(chain())
    return recipe


async def _runs(url: str, folder: Path, project: str, n: int) -> list[str]:
    recipe = await asyncio.to_thread(_recipe, folder)
    store = RunStore(url, create=True)
    made = [(await store.submit(recipe, {"tag": str(i)}, project=project))[0] for i in range(n)]
    await store.aclose()
    return made


async def test_a_project_at_its_runs_in_flight_parks_its_next_run(url: str, tmp_path: Path) -> None:
    first, second, third = await _runs(url, tmp_path, "team-a", 3)
    (other,) = await _runs(url, tmp_path, "team-b", 1)
    limit = ProjectLimit(name="team-a", max_runs_in_flight=1)
    database = Database(url)
    assert isinstance(_claim(database, first, limit), Start)
    assert _claim(database, second, limit) == "parked"
    assert _claim(database, third, limit) == "parked"
    # Another project is not held by it; a claim again of the run it holds is not "parked".
    assert isinstance(_claim(database, other, ProjectLimit(name="team-b")), Start)
    store = RunStore(url)
    assert [(await store.get(r)).held_back for r in (first, second, third)] == [
        None,
        "max_runs_in_flight",
        "max_runs_in_flight",
    ]
    queued: list[tuple[str, int]] = []

    def enqueue(db: sa.Connection, run_id: str, attempt: int) -> None:
        queued.append((run_id, attempt))

    assert unpark(database, [limit], enqueue=enqueue, now=NOW) == []  # no room yet
    with database.begin() as db:  # the first ends
        db.execute(
            runs_table.update()
            .where(runs_table.c.run_id == first)
            .values(status="completed", holder=None, lease_until=None, finished_at=NOW)
        )
    assert unpark(database, [limit], enqueue=enqueue, now=NOW) == [second]  # oldest first
    assert queued == [(second, 2)]
    assert _claim(database, second, limit) == "stale"  # its first attempt is over
    assert isinstance(_claim(database, second, limit, attempt=2), Start)
    assert (await store.get(second)).held_back is None
    assert (await store.get(third)).held_back == "max_runs_in_flight"
    # A worker killed while it held a run frees its place when the lease runs out.
    assert unpark(database, [limit], enqueue=enqueue, now=NOW + 60) == [third]
    await store.aclose()
    database.close()


async def test_a_workers_claim_reads_a_runs_project_from_the_store(
    url: str, tmp_path: Path
) -> None:
    """The project a worker claims a run under is the store's (`_runs.project_of`, the one
    read of it); a run pruned since its attempt was queued is no run (the worker's claim
    then refuses it)."""
    (made,) = await _runs(url, tmp_path, "team-a", 1)
    database = Database(url)
    assert runs.project_of(database, made) == "team-a"
    with pytest.raises(UnknownRunError):
        runs.project_of(database, "gone")
    database.close()


async def test_a_project_over_its_tokens_of_the_day_starts_no_run(url: str, tmp_path: Path) -> None:
    done, waiting = await _runs(url, tmp_path, "team-a", 2)
    limit = ProjectLimit(name="team-a", tokens_per_day=1000)
    database = Database(url)
    with database.begin() as db:
        db.execute(
            runs_table.update()
            .where(runs_table.c.run_id == done)
            .values(
                status="completed",
                finished_at=NOW - 3600,
                usage=json.dumps({"prompt_tokens": 700, "completion_tokens": 300}),
            )
        )
    assert _claim(database, waiting, limit) == "parked"
    store = RunStore(url)
    assert (await store.get(waiting)).held_back == "tokens_per_day"
    queued: list[str] = []
    assert unpark(database, [limit], enqueue=lambda db, r, a: queued.append(r), now=NOW) == []
    # A day after the run ended its tokens no longer count.
    later = NOW - 3600 + 86400 + 1
    assert unpark(database, [limit], enqueue=lambda db, r, a: queued.append(r), now=later) == [
        waiting
    ]
    await store.aclose()
    database.close()


async def test_concurrent_claims_of_one_project_take_turns(url: str, tmp_path: Path) -> None:
    """Eight claims at once, of eight runs of a project of two runs in flight: two start."""
    made = await _runs(url, tmp_path, "team-a", 8)
    limit = ProjectLimit(name="team-a", max_runs_in_flight=2)
    database = Database(url)
    outcomes = await asyncio.gather(
        *(asyncio.to_thread(_claim, database, run_id, limit) for run_id in made)
    )
    database.close()
    assert sum(isinstance(o, Start) for o in outcomes) == 2
    assert outcomes.count("parked") == 6


def test_the_limits_file_takes_projects(tmp_path: Path) -> None:
    file = tmp_path / "limits.yaml"
    file.write_text("projects:\n  - {name: team-a, max_runs_in_flight: 2, tokens_per_day: 5000}\n")
    loaded = Limits.load(file)
    assert loaded.projects == (
        ProjectLimit(name="team-a", max_runs_in_flight=2, tokens_per_day=5000),
    )
    for wrong, says in (
        ("projects:\n  - {name: a/b}\n", "name"),
        ("projects:\n  - {name: a, max_runs_in_flight: 0}\n", "max_runs_in_flight"),
        ("projects:\n  - {name: a, tokens_per_hour: 5}\n", "tokens_per_hour"),
        ("projects:\n  - {name: a}\n  - {name: a}\n", "two entries"),
    ):
        file.write_text(wrong)
        with pytest.raises(ConfigError, match=says):
            Limits.load(file)


def limited(limits: Path) -> type[WorkerProcess]:
    return type("LimitedWorker", (WorkerProcess,), {"args": ("--limits", str(limits))})


@pytest.mark.slow
async def test_two_workers_never_run_two_runs_of_a_project_of_one(url: str, tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(chain(0.2, steps=["one", "two"]))
    (tmp_path / "tools.py").write_text(TOOLS)
    limits = tmp_path / "limits.yaml"
    limits.write_text("projects:\n  - {name: team-a, max_runs_in_flight: 1}\n")
    store = RunStore(url, create=True)
    ours = [(await store.submit(recipe, {"tag": f"a{n}"}, project="team-a"))[0] for n in range(4)]
    theirs = [(await store.submit(recipe, {"tag": f"b{n}"}, project="team-b"))[0] for n in range(2)]
    ledger = tmp_path / "ledger.txt"
    kind = limited(limits)
    with (
        watched(kind(url, tmp_path, "w1", ledger)),
        watched(kind(url, tmp_path, "w2", ledger)),
    ):
        statuses = [await finished(store, run_id, within=120) for run_id in ours + theirs]
    records = [await store.get(run_id) for run_id in ours]
    await store.aclose()
    assert statuses == ["completed"] * 6
    spans = sorted((r.started_at or 0.0, r.finished_at or 0.0) for r in records)
    for (_, ended), (started, _) in itertools.pairwise(spans):
        assert started >= ended  # never two of team-a in flight
    assert sum(r.attempt for r in records) > 4  # some were parked, and queued again
