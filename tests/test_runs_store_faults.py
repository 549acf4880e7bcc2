"""The run store's rooms under crashes between their writes: a seeded random driver
(tests/store_faults_helpers.py) submits (retrying with the key), claims and runs, takes over
dead workers, cancels, resumes, reruns, prunes and approves, in this process, while a crash
may be injected before, inside or after any write transaction of the process doing it; then
the faults are lifted, the runs settle, and: no submission that answered lost its run, no key
has two runs, every run ended, no step ran after its checkpoint and none more than once per
crash of its worker, a rerun's reused steps never ran, each run's log is numbered without a
gap and ends with its end, and pruning left nothing of a deleted run (in minions' tables or
DBOS's).

``MINIONS_STORE_FAULT_SEQUENCES=N`` runs N sequences on each store (default 12),
``MINIONS_STORE_FAULT_OPERATIONS=N`` operations in each (default 14), and
``MINIONS_STORE_FAULT_SEED=S`` starts from seed S (default 32: the test is deterministic in
its operations and its dice; a failure prints the seed of its sequence)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import store_faults_helpers
from store_faults_helpers import RECIPE, TOOLS, Driver, World, problems

from minions.runs import RunStore

pytestmark = pytest.mark.slow

SEQUENCES = int(os.environ.get("MINIONS_STORE_FAULT_SEQUENCES", "12"))
OPERATIONS = int(os.environ.get("MINIONS_STORE_FAULT_OPERATIONS", "14"))
SEED = int(os.environ.get("MINIONS_STORE_FAULT_SEED", "32"))
RATE = 0.12
"""The chance of a crash at each write transaction."""


@pytest.fixture
def recipe(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "tools.py").write_text(TOOLS)
    path = folder / "effects.yaml"
    path.write_text(RECIPE)
    yield path
    store_faults_helpers.WORLD = None


async def prove(url: str, recipe: Path) -> None:
    store = RunStore(url, create=True, import_tools=False)
    world = World(store._database.database, random.Random(SEED))
    store_faults_helpers.WORLD = world
    injected = 0
    try:
        for sequence in range(SEQUENCES):
            seed = SEED + sequence
            world.rng.seed(seed)
            world.rate = RATE
            driver = Driver(store, world, recipe, random.Random(seed))
            try:
                for _ in range(OPERATIONS):
                    await driver.step()
                await driver.settle()
                found = problems(driver)
            except BaseException:
                print(f"MINIONS_STORE_FAULT_SEED={seed}\n{driver.report()}")
                raise
            assert not found, f"MINIONS_STORE_FAULT_SEED={seed}:\n" + "\n".join(
                [*found, driver.report()]
            )
            injected = sum(world.injected.values())
        print(f"{SEQUENCES} sequences, crashes injected: {dict(world.injected)}")
        assert injected >= SEQUENCES  # the dice did kill processes
        assert world.injected.keys() == {"before", "in", "after"}
    finally:
        await store.aclose()


async def test_sqlite_store_survives_crashes_between_its_writes(
    tmp_path: Path, recipe: Path
) -> None:
    await prove(f"sqlite:///{tmp_path / 'store' / 'minions.db'}", recipe)


async def test_postgres_store_survives_crashes_between_its_writes(
    recipe: Path, postgres: str
) -> None:
    from postgres import fresh_database

    await prove(fresh_database(postgres, "store_faults"), recipe)
