"""IDLE — what an idle `minions worker` costs, and how soon it starts a run submitted to it.

- `cpu_percent`: the worker process's CPU (user + system, /proc) over a window while nothing
  is queued, as a percentage of one core.
- `queries_per_s`: SQL statements the worker sends to its store in that window (every
  statement of its SQLAlchemy engines, DBOS's included, counted in the process by
  `_counted.py`); on Postgres also `server_xacts_per_s`, the transactions the server counted
  for the database (`pg_stat_database`, everything the worker did, LISTEN included).
- `pickup_ms` p50 / p99: from the call that submits a one-step run (`RunStore.submit`, in
  this process) to the run's start in the worker (its `started_at`, set when the worker
  claims it), each run submitted after the worker was left idle 0.3-1.2 s (drawn from a
  seed), one at a time.

    python benchmarks/idle.py [--only sqlite|postgres] [--window S] [--runs N]

Variants: `sqlite` and `postgres` (one worker, `--concurrency 4`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from _common import emit, mark_imported, server_xacts, summary

mark_imported()

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' Postgres cluster

TOOLS = '''\
from minions import tool


@tool(run_in_thread=False)
async def noop() -> str:
    """Nothing."""
    return "ok"
'''
RECIPE = "id: idle\ntools: [tools]\nsteps:\n  - {id: one, tool: noop}\n"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counted(process: subprocess.Popen[bytes], file: Path) -> int:
    """The worker's statements so far (it writes them at SIGUSR1)."""
    file.unlink(missing_ok=True)
    process.send_signal(signal.SIGUSR1)
    for _ in range(200):
        if file.exists() and file.read_text():
            return int(file.read_text())
        time.sleep(0.01)
    raise RuntimeError("the worker did not say its count")


@contextmanager
def worker(url: str, folder: Path, count: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = folder / "worker.log"
    env = {**os.environ, "MINIONS_BENCH_COUNT": str(count)}
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, str(HERE / "_counted.py"), "worker", "--database-url", url],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "running queued runs" not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start: {log.read_text()}")
            time.sleep(0.05)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


async def pickups(url: str, recipe: Path, runs: int, seed: int) -> list[float]:
    from minions.runs import RunStore

    rng = random.Random(seed)
    found = []
    async with RunStore(url) as store:
        for _ in range(runs):
            await asyncio.sleep(rng.uniform(0.3, 1.2))
            begun = time.time()
            run_id, _ = await store.submit(recipe)
            async for _event in store.follow(run_id):
                pass
            record = await store.get(run_id)
            assert record.status == "completed", record
            assert record.started_at is not None
            found.append((record.started_at - begun) * 1000)
    return found


def measure(variant: str, url: str, window: float, runs: int, settle: float) -> None:
    from minions.runs import RunStore

    with tempfile.TemporaryDirectory(prefix="minions-idle-") as name:
        folder = Path(name)
        (folder / "tools.py").write_text(TOOLS)
        recipe = folder / "recipe.yaml"
        recipe.write_text(RECIPE)

        async def create() -> None:
            async with RunStore(url, create=True) as store:
                await store.submit(recipe)  # the store's tables and DBOS's, and one run

        asyncio.run(create())
        count = folder / "count"
        with worker(url, folder, count) as process:
            time.sleep(settle)  # the first run done, imports and start-up behind it
            before_cpu, before_n = cpu_seconds(process.pid), counted(process, count)
            before_x = server_xacts(url) if variant == "postgres" else 0
            started = time.monotonic()
            time.sleep(window)
            elapsed = time.monotonic() - started
            cpu = (cpu_seconds(process.pid) - before_cpu) / elapsed * 100
            queries = (counted(process, count) - before_n) / elapsed
            xacts = (server_xacts(url) - before_x) / elapsed if variant == "postgres" else None
            latencies = asyncio.run(pickups(url, recipe, runs, seed=7))
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    metrics = {
        "cpu_percent": summary([cpu], "%"),
        "queries_per_s": summary([queries], "1/s"),
        "pickup_ms_p50": summary([statistics.median(latencies)], "ms"),
        "pickup_ms_p99": summary([p99], "ms"),
    }
    if xacts is not None:
        metrics["server_xacts_per_s"] = summary([xacts], "1/s")
    emit(
        "IDLE",
        variant,
        primary="cpu_percent",
        metrics=metrics,
        extra={"window_s": round(elapsed, 1), "runs": runs, "pickup_ms_max": latencies[-1]},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--settle", type=float, default=5.0)
    args = parser.parse_args()
    with ExitStack() as stack:
        if args.only in (None, "sqlite"):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            url = f"sqlite:///{folder / 'minions.db'}"
            measure("sqlite", url, args.window, args.runs, args.settle)
        if args.only in (None, "postgres"):
            from postgres import cluster

            url = stack.enter_context(cluster())
            measure("postgres", url, args.window, args.runs, args.settle)


if __name__ == "__main__":
    main()
