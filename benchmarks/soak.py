"""SOAK — retention under load: N runs through two worker processes on Postgres, each worker
pruning with ``--retention "1000 runs"``; does throughput stay flat, and the database bounded?

Runs of a 3-step chain of tool steps (no model) are submitted so that about 200 wait at any
time (a steady backlog, not one burst); at each thousand finished runs the line records the
runs/s of that thousand, the database's size (`pg_database_size`) and its rows of runs and
events. Finished = submitted - still queued or running (the pruned ones are gone from the
store, the active ones never are). The summary compares the first thousand's runs/s with the
last's and gives the largest size seen.

Postgres is a throwaway cluster on 127.0.0.1 (fsync on; the Debian `postgresql` package).

    python benchmarks/soak.py              # N = 10,000
    python benchmarks/soak.py 3000         # a shorter soak
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, fail, mark_imported

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the throwaway Postgres cluster of the tests

import sqlalchemy as sa  # noqa: E402

from minions.runs import RunStore  # noqa: E402
from minions.runs._db import Database  # noqa: E402

mark_imported()

KEEP = 1000
BACKLOG = 200
TOOLS = '''\
from minions import tool


@tool
def echo(text: str) -> str:
    """The text, back."""
    return text
'''
RECIPE = """\
id: soak
tools: [tools]
inputs: {n: {type: integer}}
steps:
  - {id: a, tool: echo, params: {text: "a {{ inputs.n }}"}}
  - {id: b, tool: echo, params: {text: "{{ a.output }} b"}, depends_on: [a]}
  - {id: c, tool: echo, params: {text: "{{ b.output }} c"}, depends_on: [b]}
"""


def measure(store: Database) -> dict[str, int]:
    with store.read() as db:
        row = db.execute(
            sa.text(
                "SELECT pg_database_size(current_database()) AS size, "
                "(SELECT count(*) FROM minions_runs) AS runs, "
                "(SELECT count(*) FROM minions_runs WHERE status IN ('queued', 'running')) "
                "AS active, (SELECT count(*) FROM minions_events) AS events"
            )
        ).one()
    return {"size": row.size, "runs": row.runs, "active": row.active, "events": row.events}


def start_workers(url: str, folder: Path) -> list[subprocess.Popen[bytes]]:
    """Two worker processes pruning to the newest `KEEP` runs, once both take runs."""
    environment = {**os.environ, "MINIONS_RETENTION_EVERY": "2"}
    workers = []
    for n in range(2):
        with (folder / f"worker{n}.log").open("w") as log:
            command = [
                sys.executable, "-m", "minions", "worker", "--database-url", url,
                "--executor-id", f"soak{n}", "--concurrency", "8", "--retention", f"{KEEP} runs",
            ]  # fmt: skip
            workers.append(
                subprocess.Popen(
                    command, cwd=folder, env=environment, stdout=log, stderr=subprocess.STDOUT
                )
            )
    deadline = time.monotonic() + 120
    for n, worker in enumerate(workers):
        while "running queued runs" not in (folder / f"worker{n}.log").read_text():
            if worker.poll() is not None or time.monotonic() > deadline:
                fail("SOAK: a worker did not start: " + (folder / f"worker{n}.log").read_text())
            time.sleep(0.1)
    return workers


async def soak(url: str, folder: Path, total: int, workers: list[subprocess.Popen[bytes]]) -> None:
    recipe = folder / "soak.yaml"
    store = RunStore(url, create=True)
    blocking = Database(url)
    submitted, thousands = 0, []
    mark, started = time.perf_counter(), time.perf_counter()
    largest: dict[str, int] = {"size": 0, "runs": 0, "events": 0}
    while True:
        seen = measure(blocking)
        for key in largest:
            largest[key] = max(largest[key], seen[key])
        done = submitted - seen["active"]
        while done >= (len(thousands) + 1) * 1000:
            now = time.perf_counter()
            thousands.append({"runs_per_s": round(1000 / (now - mark), 1), **seen})
            mark = now
            emit(
                "SOAK",
                f"thousand-{len(thousands)}",
                primary="runs_per_s",
                headline=False,
                metrics={
                    "runs_per_s": {"value": thousands[-1]["runs_per_s"], "unit": "runs/s"},
                    "db_size_mb": {"value": round(seen["size"] / 1e6, 1), "unit": "MB"},
                    "runs_stored": {"value": seen["runs"], "unit": "rows"},
                    "events_stored": {"value": seen["events"], "unit": "rows"},
                },
            )
        if done >= total:
            break
        if any(w.poll() is not None for w in workers):
            fail("SOAK: a worker exited: " + (folder / "worker0.log").read_text()[-2000:])
        if submitted < total and seen["active"] < BACKLOG:
            for _ in range(min(50, total - submitted)):
                await store.submit(recipe, {"n": submitted})
                submitted += 1
        else:
            await asyncio.sleep(0.2)
    elapsed = time.perf_counter() - started
    first, last = thousands[0], thousands[-1]
    emit(
        "SOAK",
        "postgres",
        primary="last_vs_first",
        metrics={
            "first_thousand_runs_per_s": {"value": first["runs_per_s"], "unit": "runs/s"},
            "last_thousand_runs_per_s": {"value": last["runs_per_s"], "unit": "runs/s"},
            "last_vs_first": {
                "value": round(last["runs_per_s"] / first["runs_per_s"], 2),
                "unit": "ratio",
            },
            "overall_runs_per_s": {"value": round(total / elapsed, 1), "unit": "runs/s"},
            "db_size_mb_first_thousand": {"value": round(first["size"] / 1e6, 1), "unit": "MB"},
            "db_size_mb_last_thousand": {"value": round(last["size"] / 1e6, 1), "unit": "MB"},
            "db_size_mb_max": {"value": round(largest["size"] / 1e6, 1), "unit": "MB"},
            "runs_stored_max": {"value": largest["runs"], "unit": "rows"},
            "events_stored_max": {"value": largest["events"], "unit": "rows"},
        },
        extra={
            "runs": total,
            "workers": 2,
            "concurrency": 8,
            "retention": f"{KEEP} runs",
            "retention_every_s": 2,
            "backlog": BACKLOG,
            "steps_per_run": 3,
            "runs_per_s_by_thousand": [t["runs_per_s"] for t in thousands],
            "db_size_mb_by_thousand": [round(t["size"] / 1e6, 1) for t in thousands],
        },
    )
    blocking.close()
    await store.aclose()


def main() -> None:
    from postgres import cluster

    from minions.runs._queue import Queue

    total = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    with cluster() as url, tempfile.TemporaryDirectory(prefix="minions-soak-") as name:
        folder = Path(name)
        (folder / "tools.py").write_text(TOOLS)
        (folder / "soak.yaml").write_text(RECIPE)
        # The store's tables and DBOS's first: two workers making them at once collide.
        Database(url, create=True).close()
        Queue(url).client()
        workers = start_workers(url, folder)
        try:
            asyncio.run(soak(url, folder, total, workers))
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=60)


if __name__ == "__main__":
    main()
