"""W6 — durable runs: what surviving a crash costs per step, and runs per second through the
queue.

- W6a: a 20-step linear chain (W1's shape, the zero-latency model answering ``"ok"``) run as
  a durable run: one DBOS workflow whose id is the run id, each finished step checkpointed in
  the store with its events (one commit per step). The same chain runs in memory
  (`AgentExecutor.execute`) interleaved; `durable_overhead_us_per_step` = (durable -
  in-memory) / 20, paired per repetition. 2 warm-ups, 20 timed; a fresh run each repetition.
- W6b: 200 runs of a 5-step chain submitted at once (`RunStore.submit`, the recipe snapshotted
  into each run) to the queue, one worker running 8 at a time; `runs_per_s` = 200 / wall time
  from the first submission to the last run finished. 1 warm-up, 5 timed. Two ways: the
  worker in the submitting process (one GIL for the submissions, the worker and DBOS), and
  (`-2w` variants) two worker processes running 4 at a time each, as one deploys them; still
  at most 8 runs at a time.

Variants: `sqlite` (a file in WAL mode, synchronous FULL) and `postgres` (a throwaway cluster
on 127.0.0.1, fsync on; needs the Debian `postgresql` package). Each (part, store) runs in a
process of its own, as DBOS is one per process.

    python benchmarks/w6_durable.py                 # all six
    python benchmarks/w6_durable.py W6a sqlite      # one
    python benchmarks/w6_durable.py W6b postgres-2w # W6b through two worker processes

With ``MINIONS_BENCH_METRICS=1`` the workers record their metrics (as ``minions worker
--metrics-port`` does) and W6b scrapes them once a second while it runs: compare with and
without (and with main, which knows no metrics) to see what metrics cost.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import emit, fail, mark_imported, summary, time_async

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the throwaway Postgres cluster of the tests

from minions import AgentExecutor, Prompt, StepStatus  # noqa: E402
from minions.models import Model  # noqa: E402
from minions.recipes import load_recipe  # noqa: E402
from minions.testing import FunctionModel  # noqa: E402

mark_imported()


def chain(steps: int) -> str:
    lines = ["id: w6-chain", "steps:", '  - {id: step_0, goal: "start"}']
    for i in range(1, steps):
        goal = f'"step {i}: {{{{ step_{i - 1}.output }}}}"'
        lines.append(f"  - {{id: step_{i}, goal: {goal}, depends_on: [step_{i - 1}]}}")
    return "\n".join(lines) + "\n"


def fan_out_join() -> str:
    """W3a's shape: 8 independent steps, then a join depending on all 8."""
    lines = ["id: w6-fan", "steps:"]
    lines += [f'  - {{id: fan_{i}, goal: "fan {i}"}}' for i in range(8)]
    joined = ", ".join(f"fan_{i}" for i in range(8))
    lines.append(f'  - {{id: join, goal: "fan join", depends_on: [{joined}]}}')
    return "\n".join(lines) + "\n"


async def answer(prompt: Prompt) -> str:
    """ "ok" at once, or after 100 ms for the steps of the W3a shape (goals "fan ...")."""
    if any("fan " in (message.content or "") for message in prompt.messages):
        await asyncio.sleep(0.1)
    return "ok"


def resolver(model: FunctionModel) -> Any:
    def resolve(_: Model | str | None) -> Model:
        return model

    return resolve


def start_worker(url: str, model: FunctionModel, concurrency: int) -> tuple[Any, threading.Thread]:
    """A worker in a thread of this process (DBOS launched in it), once it is ready."""
    from minions import RunSettings
    from minions.runs import Worker

    ready = threading.Event()
    worker = Worker(
        url,
        concurrency=concurrency,
        executor_id=f"bench-{uuid.uuid4().hex[:6]}",
        settings=RunSettings(model_resolver=resolver(model), metrics=_metrics()),
        on_ready=lambda _: ready.set(),
    )
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    if not ready.wait(60):
        fail("W6: the worker did not start")
    return worker, thread


METRICS = os.environ.get("MINIONS_BENCH_METRICS") == "1"
_EXPORTED: list[Any] = []


def _metrics() -> Any:
    """The worker's metrics when the run measures them (``MINIONS_BENCH_METRICS=1``): a
    Prometheus registry scraped once a second, as Prometheus would."""
    if not METRICS:
        return None
    from minions._tracing.prometheus import PrometheusMetrics

    exported = PrometheusMetrics()
    _EXPORTED.append(exported)

    def scrape() -> None:
        while True:
            exported.exposition()
            time.sleep(1.0)

    threading.Thread(target=scrape, daemon=True).start()
    return exported.metrics


def w6a(url: str, folder: Path, variant: str) -> None:
    from dbos import SetWorkflowID

    from minions.runs import _events, _runs
    from minions.runs._db import Database
    from minions.runs._snapshot import RecipeSnapshot
    from minions.runs._worker import minions_run

    steps = 20
    text = chain(steps)
    path = folder / "chain.yaml"
    path.write_text(text)
    model = FunctionModel(answer, name="zero-latency")
    worker, thread = start_worker(url, model, concurrency=1)
    store = Database(url)
    recipe = load_recipe(path)
    executor = AgentExecutor(model=model)
    executor.graph(recipe)
    durable_times: list[float] = []
    memory: list[float] = []
    run_ids: list[str] = []

    async def durable(text: str, path: Path) -> tuple[str, float]:
        run_id = uuid.uuid4().hex
        snapshot = RecipeSnapshot(
            recipe_id="w6", yaml=text, path=str(path), hash="-", request_hash="-"
        )
        row = _runs.queued_row(snapshot, run_id=run_id, idempotency_key=None)
        _runs.insert(store, row, enqueue=lambda *_: None)  # run below, as the queue would
        started = time.perf_counter()
        with SetWorkflowID(run_id):
            await minions_run(run_id, 1)
        return run_id, time.perf_counter() - started

    async def durable_run() -> None:
        run_id, seconds = await durable(text, path)
        durable_times.append(seconds)
        run_ids.append(run_id)

    async def memory_run() -> None:
        started = time.perf_counter()
        result = await executor.execute(recipe)
        memory.append(time.perf_counter() - started)
        if result.status is not StepStatus.COMPLETED:
            fail(f"W6a: the in-memory run failed: {result.error}")

    async def pair() -> None:
        await durable_run()
        await memory_run()

    time_async(pair, warmups=2, repetitions=20)
    fan = folder / "fan.yaml"
    fan.write_text(fan_out_join())
    makespans: list[float] = []

    async def fan_run() -> None:
        makespans.append((await durable(fan.read_text(), fan))[1])

    time_async(fan_run, warmups=2, repetitions=20)
    worker.stop()
    thread.join(30)
    durable_times, memory, makespans = durable_times[2:], memory[2:], makespans[2:]
    last = _runs.get(store, run_ids[-1])
    if last.status != "completed" or len(last.steps) != steps:
        fail(f"W6a: the durable run ended {last.status} with {len(last.steps)} steps")
    events = _events.after(store, run_ids[-1])
    if [e.seq for e in events] != list(range(1, len(events) + 1)):
        fail("W6a: the event log is not contiguous")
    overhead = [(d - m) / steps * 1e6 for d, m in zip(durable_times, memory, strict=True)]
    emit(
        "W6a",
        variant,
        primary="durable_overhead_us_per_step",
        metrics={
            "durable_overhead_us_per_step": summary(overhead, "us"),
            "us_per_step": summary([d / steps * 1e6 for d in durable_times], "us"),
            "in_memory_us_per_step": summary([m / steps * 1e6 for m in memory], "us"),
        },
        extra={
            "steps": steps,
            "events_per_run": len(events),
            "store": variant,
            "what": "one DBOS workflow per run; per step one commit of its checkpoint and events",
        },
    )
    emit(
        "W6a",
        f"{variant}, W3a's shape",
        headline=False,
        primary="ratio_to_ideal",
        metrics={
            "makespan_ms": summary([m * 1e3 for m in makespans], "ms"),
            "ratio_to_ideal": summary([m / 0.2 for m in makespans], "x"),
        },
        extra={"shape": "8 parallel 100 ms steps, then a 100 ms join, run durably"},
    )


def worker_process(url: str, concurrency: int) -> None:
    """A worker of its own (`-2w`): the zero-latency model, until its parent ends it."""
    import signal

    worker, thread = start_worker(url, FunctionModel(answer, name="zero-latency"), concurrency)
    print("ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    while thread.is_alive():
        thread.join(0.5)


def w6b(url: str, folder: Path, variant: str) -> None:
    import sqlalchemy as sa

    from minions.runs import RunStore
    from minions.runs._db import Database
    from minions.runs._tables import TERMINAL

    runs, concurrency = 200, 8
    path = folder / "five.yaml"
    path.write_text(chain(5))
    separate = variant.endswith("-2w")
    processes: list[subprocess.Popen[str]] = []
    if separate:
        RunStore(url, create=True).close()
        for _ in range(2):
            process = subprocess.Popen(
                [sys.executable, __file__, "worker", url, str(concurrency // 2)],
                stdout=subprocess.PIPE,
                text=True,
            )
            processes.append(process)
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                fail("W6b: a worker process did not start")
            # What it logs after: read, or a full pipe would stop it.
            threading.Thread(target=process.stdout.read, daemon=True).start()
    else:
        model = FunctionModel(lambda prompt: "ok", name="zero-latency")
        worker, thread = start_worker(url, model, concurrency=concurrency)
    times: list[float] = []

    counter = Database(url)

    # Every run in the store is this benchmark's, and a batch starts when the one before it
    # ended: the runs not ended are the batch's. One fixed statement (a list of the batch's 200
    # ids cost the submitting process more CPU than a run's steps): the timed loop polls it.
    left = sa.text(
        f"SELECT count(*) FROM minions_runs WHERE status NOT IN "
        f"({', '.join(repr(status) for status in sorted(TERMINAL))})"
    )

    def unfinished() -> int:
        """How many of the batch's runs have not ended."""
        with counter.read() as db:
            return int(db.execute(left).scalar_one())

    async def batch(count: int) -> list[str]:
        store = RunStore(url)
        try:
            started = time.perf_counter()
            submitted = await asyncio.gather(*(store.submit(path) for _ in range(count)))
            ids = [run_id for run_id, _ in submitted]
            while await asyncio.to_thread(unfinished):  # noqa: ASYNC110 (another thread's work)
                await asyncio.sleep(0.01)
            times.append(time.perf_counter() - started)
            mine = [await store.get(run_id) for run_id in ids]
            if any(r.status != "completed" for r in mine):
                fail(f"W6b: runs ended {sorted({r.status for r in mine})}")
            return ids
        finally:
            store.close()

    asyncio.run(batch(runs))  # warm-up
    times.clear()
    transactions: list[float] = []
    for _ in range(5):
        before = committed(url)
        asyncio.run(batch(runs))
        if before is not None:
            transactions.append(((committed(url) or 0) - before) / runs)
    if separate:
        for process in processes:
            process.terminate()
            process.wait(30)
    else:
        worker.stop()
        thread.join(30)
    metrics = {"runs_per_s": summary([runs / t for t in times], "runs/s", digits=1)}
    if transactions:
        metrics["transactions_per_run"] = summary(transactions, "tx", digits=1)
    emit(
        "W6b",
        variant,
        primary="runs_per_s",
        metrics=metrics,
        extra={
            "runs": runs,
            "steps": 5,
            "metrics": METRICS,
            "concurrency": concurrency,
            "workers": 2 if separate else 1,
            "worker_processes": 2 if separate else 0,
            "transactions_per_run": "Postgres' transactions, committed or rolled back (reads "
            "included: the queue's polls, the workers' looks at their runs, this benchmark's "
            "polls) during a batch, per run",
        },
    )


def committed(url: str) -> int | None:
    """Transactions Postgres ended in the store's database so far, committed or rolled back
    (a read in a transaction ends in a rollback; None on SQLite)."""
    if not url.startswith("postgresql://"):
        return None
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else None


def one(part: str, variant: str) -> None:
    with tempfile.TemporaryDirectory(prefix="minions-w6-") as name:
        folder = Path(name)
        if variant.startswith("sqlite"):
            url = f"sqlite:///{folder / 'minions.db'}"
            (w6a if part == "W6a" else w6b)(url, folder, variant)
            return
        from postgres import binaries, cluster

        if binaries() is None:
            print("W6 postgres: PostgreSQL is not installed; skipped", file=sys.stderr)
            return
        with cluster() as url:
            (w6a if part == "W6a" else w6b)(url, folder, variant)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "worker":
        worker_process(argv[1], int(argv[2]))
        return 0
    if argv:
        one(argv[0], argv[1])
        return 0
    status = 0
    parts = [("W6a", v) for v in ("sqlite", "postgres")]
    parts += [("W6b", v) for v in ("sqlite", "postgres", "sqlite-2w", "postgres-2w")]
    for part, variant in parts:
        done = subprocess.run([sys.executable, __file__, part, variant], check=False)
        status = status or done.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
