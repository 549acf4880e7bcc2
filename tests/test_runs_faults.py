"""The proof of the run lifecycle under faults: a seeded random driver (tests/faults_helpers.py)
interleaves submissions (some killed mid-way and retried with their key), cancels, resumes
(several at once), approvals and rejections (at once), SIGKILLed workers, a worker frozen past
the dead-worker timeout (then thawed, sometimes after a second worker took its id), a second
worker with a live one's id, and a Postgres restart or a full SQLite disk; then every run must
have ended or wait for a decision, no completed step or loop item ran again, no run ran in two
workers at once, every run's events are numbered without a gap and end with one terminal
event, every approval was decided once, and a run's usage is the sum of its steps'.

Each defect the driver found is reproduced on its own below.

``MINIONS_FAULT_EXAMPLES=N`` runs N sequences on each store (default 1, a new random seed
each time; 120 on SQLite and 125 on Postgres passed on 2026-11-28),
``MINIONS_FAULT_OPERATIONS=N`` operations in each (default: each kind once), and
``MINIONS_FAULT_SEED=S`` starts from seed S (default: a random one, printed)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from faults_helpers import (
    MARK,
    OPERATIONS,
    TOOLS,
    Driver,
    StartingWorker,
    ledger_calls,
    problems,
)
from postgres import cluster, fresh_database
from runs_helpers import (
    WorkerProcess,
    finished,
    holds_write_lock,
    marking_model,
    until,
    wait_stopped,
    watched,
    worker,
)

from minions.runs import RunStore

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("MINIONS_FAULT_EXAMPLES", "1"))
STEPS = int(os.environ.get("MINIONS_FAULT_OPERATIONS", str(len(OPERATIONS))))
SEED = int(os.environ.get("MINIONS_FAULT_SEED") or random.randrange(1_000_000))


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with cluster() as server:
        yield server


async def prove(folder: Path, url_of: Callable[[int], str]) -> None:
    """`EXAMPLES` random sequences, each on a fresh store (`url_of` the sequence's number)."""
    with marking_model("mark_call") as model:
        for example in range(EXAMPLES):
            seed = SEED + example
            driver = Driver(url_of(example), folder / f"s{example}", seed, model.url)
            try:
                await driver.run(STEPS)
                await driver.settle()
                found = await problems(driver)
            except BaseException:
                print(f"MINIONS_FAULT_SEED={seed}\n{driver.report()}")
                raise
            finally:
                driver.close()
            assert not found, (
                f"MINIONS_FAULT_SEED={seed}:\n" + "\n".join(found) + "\n" + driver.report()
            )
            notable = ("toler", "holding the write lock")
            said = [n for n in driver.journal if any(word in n for word in notable)]
            print(f"MINIONS_FAULT_SEED={seed}: well", *said)


async def test_sqlite_runs_survive_random_faults(tmp_path: Path) -> None:
    await prove(tmp_path, lambda n: f"sqlite:///{tmp_path / f's{n}' / 'minions.db'}")


async def test_postgres_runs_survive_random_faults(tmp_path: Path, postgres: str) -> None:
    await prove(tmp_path, lambda n: fresh_database(postgres, f"f{uuid.uuid4().hex[:12]}"))


# -- defects found by the driver, each reproduced on its own ----------------------------------


@dataclass(frozen=True, kw_only=True)
class Held:
    """A two-step run (steps `one` and `two`, tool calls marking the ledger), and the file that
    holds its worker at a point injected by tests/inject while it exists."""

    store: RunStore
    run_id: str
    ledger: Path
    hold: Path

    async def reached(self) -> None:
        await until(Path(f"{self.hold}.reached").exists)


async def held_run(folder: Path, url: str) -> Held:
    (folder / "tools.py").write_text(TOOLS)
    recipe = folder / "two.yaml"
    recipe.write_text(
        "id: two\ntools: [tools]\ninputs: {tag: {type: string}}\nsteps:\n"
        f"  - {{id: one, {MARK % 'one'}}}\n"
        f"  - {{id: two, depends_on: [one], {MARK % 'two'}}}\n"
    )
    hold = folder / "hold"
    hold.touch()
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "held"})
    return Held(store=store, run_id=run_id, ledger=folder / "ledger.txt", hold=hold)


@contextmanager
def frozen(process: WorkerProcess, held: Held) -> Iterator[None]:
    """The worker frozen (SIGSTOP); then the hold lifted and the worker thawed (SIGCONT)."""
    os.kill(process.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        held.hold.unlink()
        os.kill(process.process.pid, signal.SIGCONT)


async def test_a_worker_thawed_after_losing_its_run_starts_none_of_its_side_effects(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    held = await held_run(tmp_path, url)
    with worker(url, tmp_path, "w1", held.ledger, HOLD_BEFORE_TOOL=str(held.hold)) as first:
        await held.reached()  # about to start step one's call
        with frozen(first, held), worker(url, tmp_path, "w2", held.ledger):
            assert await finished(held.store, held.run_id) == "completed"  # taken over
        await until(lambda: "standing down" in first.log.read_text())
    assert (await held.store.get(held.run_id)).status == "completed"
    assert [c for c in ledger_calls(held.ledger) if c.pid == first.process.pid] == []
    held.store.close()


async def test_a_worker_that_starts_on_a_full_disk_says_so_without_a_traceback(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    RunStore(url, create=True).close()
    full = tmp_path / "full"
    full.touch()
    started = StartingWorker(url, tmp_path, "w1", tmp_path / "ledger.txt", DISK_FULL=str(full))
    assert not started.started()
    said = started.log.read_text()
    assert started.process.wait() == 2, said
    assert "error: cannot use the run store" in said
    assert "database or disk is full" in said
    assert "Traceback" not in said


async def test_a_step_cancelled_before_its_checkpoint_says_it_completed_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    held = await held_run(tmp_path, url)
    store, run_id = held.store, held.run_id
    with worker(url, tmp_path, "w1", held.ledger, HOLD_BEFORE_CHECKPOINT=str(held.hold)):
        await held.reached()  # step one done, its checkpoint not yet written
        assert (await store.cancel(run_id)).status == "cancelled"
        held.hold.unlink()
        await store.resume(run_id)
        assert await finished(store, run_id) == "completed"
    events = await store.events(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.step_id for e in events if e.kind == "step_completed"] == ["one", "two"]
    store.close()


async def test_a_worker_frozen_inside_a_postgres_transaction_does_not_stop_the_takeover(
    tmp_path: Path, postgres: str
) -> None:
    url = fresh_database(postgres, f"f{uuid.uuid4().hex[:12]}")
    held = await held_run(tmp_path, url)
    with worker(url, tmp_path, "w1", held.ledger, HOLD_IN_CHECKPOINT=str(held.hold)) as first:
        await held.reached()  # the run's row locked by a transaction not committed
        with frozen(first, held), worker(url, tmp_path, "w2", held.ledger):
            assert await finished(held.store, held.run_id, within=30) == "completed"
    events = await held.store.events(held.run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    held.store.close()


async def test_a_worker_handed_the_next_attempt_of_a_run_it_lost_runs_it(tmp_path: Path) -> None:
    """A worker cut off from its store (a Postgres restart) past its lease may be handed the
    run's next attempt, queued by a takeover, while its own execution of the run has not yet
    found out that it lost it: it runs that attempt once the earlier one stood down (it did
    nothing instead, and the run stayed queued for good)."""
    from minions.runs import _leases, _runs
    from minions.runs._db import Database
    from minions.runs._queue import Queue, workflow_id
    from minions.runs._tables import HELD

    url = f"sqlite:///{tmp_path / 'minions.db'}"
    held = await held_run(tmp_path, url)
    down = tmp_path / "down"
    env = {"STORE_DOWN": str(down), "HOLD_BEFORE_TOOL": str(held.hold)}
    with worker(url, tmp_path, "w1", held.ledger, **env):
        store, queue = Database(url), Queue(url)
        queue.client()
        await held.reached()  # attempt 1 runs in w1, about to start step one's call
        down.touch()  # and w1 no longer reaches its store
        # Taken over, as a live worker takes over a run whose lease ran out.
        epoch = _leases.watch(store, held.run_id, held.run_id).epoch
        _runs.requeue(
            store, held.run_id, statuses=HELD, epoch=epoch, recovery=True, enqueue=queue.enqueue
        )
        second = workflow_id(held.run_id, 2)
        await until(  # handed to w1
            lambda: _leases.watch(store, held.run_id, second).workflow_status != "ENQUEUED"
        )
        down.unlink()
        held.hold.unlink()
        assert await finished(held.store, held.run_id) == "completed"
        queue.close()
        store.close()
    held.store.close()


async def test_a_store_opens_and_reads_while_another_process_holds_its_write_lock(
    tmp_path: Path,
) -> None:
    """A process frozen while it holds the SQLite file's write lock keeps writers waiting,
    not readers: a new process opens the store and reads it at once (every new connection
    set ``auto_vacuum``, a write: it waited 30 s for the lock and failed "database is locked";
    seed 329126)."""
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    held = await held_run(tmp_path, url)
    holder = sqlite3.connect(tmp_path / "minions.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held as by a frozen writer
    holder.execute("UPDATE minions_meta SET value = value")
    try:
        reader = RunStore(url)  # a new process's store: new connections
        assert [r.run_id for r in await reader.list_runs()] == [held.run_id]
        assert (await reader.get(held.run_id)).status == "queued"
        reader.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    held.store.close()


async def test_a_worker_that_takes_a_silent_workers_id_says_so(tmp_path: Path) -> None:
    """A worker silent past the dead-worker timeout (frozen here; starved by a loaded machine
    in seeds 329109 and 329112) loses its id to a second worker started with it, which says
    whose id it took and how long that one was silent; the first stands down."""
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    RunStore(url, create=True).close()
    ledger = tmp_path / "ledger.txt"
    with worker(url, tmp_path, "w1", ledger) as first:
        pid = first.process.pid
        while True:  # frozen outside a write: the second one registers
            os.kill(pid, signal.SIGSTOP)
            wait_stopped(pid)
            if not holds_write_lock(url, pid):
                break
            os.kill(pid, signal.SIGCONT)
        try:
            second = StartingWorker(url, tmp_path, "w1", ledger)
            started = await asyncio.to_thread(second.started)
        finally:
            os.kill(pid, signal.SIGCONT)
        with watched(second):
            said = second.log.read_text()
            assert started, said
            assert "executor id taken from a worker that stopped beating" in said, said
            assert f"pid={pid}" in said, said
            assert "process_gone=False" in said, said
            assert await asyncio.to_thread(first.process.wait, 60) == 1
            assert "stood down" in first.log.read_text()
