"""EVAL — what an eval adds to the runs it makes, and a replayed eval of 1,000 case runs.

The recipe is examples/evals' capital recipe (one agent step: a tool call, then the answer);
its case runs are recorded once (a zero-latency stand-in model), then replayed, so no model
time is measured: only minions.

- `overhead`: 200 case runs (4 cases x 50 repeats), replayed. Each round times the eval
  (`evaluate(dataset, replay=DIR, concurrency=1)`: loading nothing, making each run's replay
  model from its recording file, running it, building its result document, grading its
  checks, the report) and, alternately, the same 200 runs made directly
  (`AgentExecutor.execute` with a `ReplayModel` of the same recording, loaded beforehand):
  the run itself. `overhead_per_case_run_us` is (eval - direct) / 200, per round; 7 rounds.
- `replay-1000`: one eval of 1,000 case runs (4 cases x 250 repeats), replayed with
  concurrency 4, wall time (must be under a minute on the 2-core machine). 3 repetitions.

    python benchmarks/evals.py
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, mark_imported, summary

HERE = Path(__file__).parent
EXAMPLE = HERE.parent / "examples" / "evals"
sys.path.insert(0, str(EXAMPLE))

from stand_in import reply  # noqa: E402

from minions import AgentExecutor  # noqa: E402
from minions.evals import Case, Dataset, ExprCheck, TrajectoryCheck, evaluate  # noqa: E402
from minions.models import Recording, ReplayModel  # noqa: E402
from minions.recipes import load_recipe  # noqa: E402
from minions.testing import FunctionModel  # noqa: E402

mark_imported()

COUNTRIES = ["France", "Japan", "Kenya", "Peru"]


def dataset(repeat: int) -> Dataset:
    recipe = load_recipe(EXAMPLE / "capital.yaml")
    cases = [
        Case(
            id=name.lower(),
            inputs={"country": name},
            checks=[
                ExprCheck("length(tool_calls) == `1`"),
                TrajectoryCheck(tools=["lookup_capital"]),
            ],
        )
        for name in COUNTRIES
    ]
    return Dataset(recipe, cases, repeat=repeat)


async def record(folder: Path, repeat: int) -> None:
    await evaluate(
        dataset(repeat), model=FunctionModel(reply, name="stand-in"), record=folder, concurrency=4
    )


def load_all(folder: Path) -> dict[Path, Recording]:
    return {p: Recording.load(p) for p in folder.rglob("*.recording.json")}


async def direct(folder: Path, repeat: int, recordings: dict[Path, Recording]) -> None:
    recipe = load_recipe(EXAMPLE / "capital.yaml")
    for repetition in range(1, repeat + 1):
        for name in COUNTRIES:
            file = folder / name.lower() / f"{repetition}.recording.json"
            model = ReplayModel(recordings[file])
            executor = AgentExecutor(model_resolver=lambda _spec, m=model: m)
            result = await executor.execute(recipe, {"country": name})
            assert result.ok


async def overhead(rounds: int = 7, repeat: int = 50) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await record(folder, repeat)
        recordings = load_all(folder)
        data = dataset(repeat)
        runs = repeat * len(COUNTRIES)
        await evaluate(data, replay=folder, concurrency=1)  # warm-up
        await direct(folder, repeat, recordings)
        per_run, evals, directs = [], [], []
        for _ in range(rounds):
            gc.collect()
            started = time.perf_counter()
            report = await evaluate(data, replay=folder, concurrency=1)
            eval_seconds = time.perf_counter() - started
            assert report.passed == runs, report.note
            gc.collect()
            started = time.perf_counter()
            await direct(folder, repeat, recordings)
            direct_seconds = time.perf_counter() - started
            evals.append(eval_seconds * 1e3)
            directs.append(direct_seconds * 1e3)
            per_run.append((eval_seconds - direct_seconds) / runs * 1e6)
    emit(
        "EVAL",
        "overhead",
        primary="overhead_per_case_run_us",
        metrics={
            "overhead_per_case_run_us": summary(per_run, "us", digits=1),
            "eval_ms": summary(evals, "ms", digits=1),
            "direct_ms": summary(directs, "ms", digits=1),
        },
        extra={"case_runs": runs, "rounds": rounds},
    )


async def thousand(repetitions: int = 3, repeat: int = 250) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await record(folder, repeat)
        data = dataset(repeat)
        seconds = []
        for _ in range(repetitions):
            gc.collect()
            started = time.perf_counter()
            report = await evaluate(data, replay=folder, concurrency=4)
            seconds.append(time.perf_counter() - started)
            assert report.passed == 1000, report.note
    emit(
        "EVAL",
        "replay-1000",
        primary="wall_s",
        metrics={"wall_s": summary(seconds, "s", digits=2)},
        extra={"case_runs": 1000, "concurrency": 4},
    )


if __name__ == "__main__":
    asyncio.run(overhead())
    asyncio.run(thousand())
