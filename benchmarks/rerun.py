"""RERUN — a rerun of the last step of W1's 50-step chain against running the chain whole.

The chain is W1's shape (50 agent steps in a line, the zero-latency model answering "ok"),
run as a durable run on a store (an in-process `RunExecutor`, as a worker runs a run its
queue delivered: claim, checkpoints, events). Each repetition runs the chain whole (a fresh
run), then reruns its last step (`RunStore.rerun(run, from_step="step_49")`: the plan and the
49 reused checkpoints copied into the new run, then the rerun executed). 2 warm-ups, 10 timed.

- `whole_ms`, `rerun_ms`: wall time of the whole run, and of the rerun (queueing it included).
- `model_calls`: 50 for the whole run, 1 for the rerun (the reused steps make none).
- `reused_step_us`: what each reused step adds to the rerun: (rerun - a one-step run) / 49,
  where the one-step run (the chain's first step alone, submitted and run the same way, in
  the same repetition) pays what every run pays (queueing, the claim, the end) and one live
  step; `reused_to_durable_step` is its ratio to a durable step's cost, whole / 50 (the
  target is under 10 %).

Variants: `sqlite` (WAL, synchronous FULL) and `postgres` (a throwaway cluster on 127.0.0.1,
fsync on; needs the Debian `postgresql` package), each in a process of its own.

    python benchmarks/rerun.py              # both
    python benchmarks/rerun.py sqlite       # one
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import emit, fail, mark_imported, summary

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the throwaway Postgres cluster of the tests

from w6_durable import chain  # noqa: E402 (W1's shape in YAML)

from minions import RunSettings  # noqa: E402
from minions.models import Model  # noqa: E402
from minions.runs import RunStore  # noqa: E402
from minions.runs._async import AsyncDatabase  # noqa: E402
from minions.runs._db import Database  # noqa: E402
from minions.runs._runner import RunExecutor  # noqa: E402
from minions.testing import FunctionModel  # noqa: E402

mark_imported()

STEPS = 50


async def measure(url: str, folder: Path, variant: str) -> None:
    path = folder / "chain.yaml"
    path.write_text(chain(STEPS))
    single = folder / "one.yaml"
    single.write_text(chain(1))
    model = FunctionModel(lambda prompt: "ok", name="zero-latency")

    def resolve(_: Model | str | None) -> Model:
        return model

    store = RunStore(url, create=True)
    adapter = AsyncDatabase(Database(url), patient=True)
    runner = RunExecutor(
        adapter,
        executor_id="bench",
        incarnation="bench",
        settings=RunSettings(model_resolver=resolve),
    )
    whole: list[float] = []
    rerun: list[float] = []
    alone: list[float] = []
    calls: list[tuple[int, int]] = []
    last = ""
    for repetition in range(12):
        run_id, _ = await store.submit(path)
        before = len(model.requests)
        started = time.perf_counter()
        await runner.execute(run_id, 1)
        whole_s = time.perf_counter() - started
        middle = len(model.requests)
        started = time.perf_counter()
        plan = await store.rerun(run_id, from_step=f"step_{STEPS - 1}")
        await runner.execute(plan.run_id, 1)
        rerun_s = time.perf_counter() - started
        calls.append((middle - before, len(model.requests) - middle))
        started = time.perf_counter()
        one_id, _ = await store.submit(single)
        await runner.execute(one_id, 1)
        alone_s = time.perf_counter() - started
        if repetition >= 2:
            whole.append(whole_s)
            rerun.append(rerun_s)
            alone.append(alone_s)
        last = plan.run_id
    record = await store.get(last)
    if record.status != "completed" or [s.status for s in record.steps].count("reused") != 49:
        fail(
            f"RERUN: the rerun ended {record.status} with steps {[s.status for s in record.steps]}"
        )
    if any(c != (STEPS, 1) for c in calls) or len(model.requests) != 12 * (STEPS + 2):
        fail(f"RERUN: model calls (whole, rerun) were {sorted(set(calls))}")
    await store.aclose()
    adapter.close()
    per_reused = [(r - a) / (STEPS - 1) for r, a in zip(rerun, alone, strict=True)]
    ratio = [p / (w / STEPS) for p, w in zip(per_reused, whole, strict=True)]
    metrics: dict[str, Any] = {
        "reused_to_durable_step": summary(ratio, "x"),
        "whole_ms": summary([w * 1e3 for w in whole], "ms"),
        "rerun_ms": summary([r * 1e3 for r in rerun], "ms"),
        "reused_step_us": summary([p * 1e6 for p in per_reused], "us"),
        "durable_step_us": summary([w / STEPS * 1e6 for w in whole], "us"),
        "one_step_run_ms": summary([a * 1e3 for a in alone], "ms"),
    }
    emit(
        "RERUN",
        variant,
        primary="reused_to_durable_step",
        metrics=metrics,
        extra={
            "steps": STEPS,
            "model_calls": {"whole": STEPS, "rerun": 1},
            "speedup": round(statistics.median(whole) / statistics.median(rerun), 1),
            "what": "rerun from the last step of W1's chain, run durably, vs the chain whole",
        },
    )


def one(variant: str) -> None:
    with tempfile.TemporaryDirectory(prefix="minions-rerun-") as name:
        folder = Path(name)
        if variant == "sqlite":
            asyncio.run(measure(f"sqlite:///{folder / 'minions.db'}", folder, variant))
            return
        from postgres import binaries, cluster

        if binaries() is None:
            print("RERUN postgres: PostgreSQL is not installed; skipped", file=sys.stderr)
            return
        with cluster() as url:
            asyncio.run(measure(url, folder, variant))


def main(argv: list[str]) -> int:
    if argv:
        one(argv[0])
        return 0
    status = 0
    for variant in ("sqlite", "postgres"):
        done = subprocess.run([sys.executable, __file__, variant], check=False)
        status = status or done.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
