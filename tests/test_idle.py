"""An idle worker costs almost nothing: it sends its store a statement a second at most (its
heartbeat, a rare look at its queue, DBOS's own loops slowed down) instead of polling its
queue every 50 ms, and it still starts a run at once: a run queued wakes it (Postgres
NOTIFY, a byte in its FIFO on SQLite), and so does a place that frees in it."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
from runs_helpers import WorkerProcess, finished, ledger_lines, worker, write_ledger_recipe

from minions.runs import RunStore

DEFAULTS = {"MINIONS_WORKER_HEARTBEAT": "2", "MINIONS_WORKER_DEAD_AFTER": "10"}
"""The worker's own heartbeat and lease (the other tests' workers beat faster)."""
WINDOW = 15.0
"""Seconds over which an idle worker's statements are counted."""


def statements(process: WorkerProcess, file: Path) -> int:
    """The statements the worker sent so far (it writes them at SIGUSR1)."""
    file.unlink(missing_ok=True)
    process.process.send_signal(signal.SIGUSR1)
    for _ in range(1000):
        if file.exists() and file.read_text():
            return int(file.read_text())
        time.sleep(0.01)
    raise AssertionError("the worker did not say its count")


@pytest.mark.slow
def test_an_idle_worker_sends_a_statement_a_second_at_most(url: str, tmp_path: Path) -> None:
    count = tmp_path / "statements"
    ledger = tmp_path / "ledger.txt"
    with worker(url, tmp_path, "idle", ledger, STATEMENTS=str(count), **DEFAULTS) as idle:
        first = statements(idle, count)
        time.sleep(WINDOW)  # a window of idleness, counted: nothing is ordered by it
        sent = statements(idle, count) - first
    # About 0.6 a second (benchmarks/idle.py); some loops come due together in a short
    # window. Polling the queue every 50 ms sent 50-60 a second.
    assert sent <= 1.5 * WINDOW, sent


async def test_a_run_queued_wakes_an_idle_worker(url: str, tmp_path: Path) -> None:
    """The worker never looks at its queue by itself here (once an hour): each run reaches
    it because its submission woke it, or because a place freed in it (one run at a time,
    three runs queued at once)."""
    recipe = write_ledger_recipe(tmp_path / "recipes")
    ledger = tmp_path / "ledger.txt"
    async with RunStore(url, create=True) as store:
        with worker(
            url, tmp_path, "woken", ledger, "--concurrency", "1", MINIONS_QUEUE_LOOK="3600"
        ):
            runs = [(await store.submit(recipe, {"tag": f"r{i}"}))[0] for i in range(3)]
            statuses = await asyncio.gather(*(finished(store, run_id) for run_id in runs))
    assert statuses == ["completed"] * 3
    assert len(ledger_lines(ledger)) == 15
