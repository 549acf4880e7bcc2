"""VALIDATE — checking a big recipe: 20,000 steps, each depending on the one before and
quoting its output in its goal (a recipe that validated in quadratic time before).

Two variants, each the median of 3 runs in milliseconds (wall and CPU time), and the time
per step:

- ``20000 chained steps``: `StepGraph(recipe)` of a Python recipe (the whole check: ids,
  references, cycles, loops, templates).
- ``20000 steps from YAML``: what `minions validate FILE` does in the process: read a legit
  20,000-step YAML file (inputs, agent, tool and analysis steps, `depends_on`, templates,
  output schemas, `save_as`), check it against the format and build and check the recipe.
  ``extra.cli_ms`` is `minions validate FILE` as a command (a fresh interpreter: imports
  included), the median of 3.
- ``20000 independent steps from YAML``: steps that depend on nothing (all ready at once).
- ``20000 broken steps from YAML``: each with an unknown field: 20,000 problems to say.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import emit, mark_imported, summary

mark_imported()

from minions import AgentRecipe, DefaultStep, StepGraph  # noqa: E402
from minions.errors import RecipeError  # noqa: E402
from minions.recipes._build import load_recipe_file  # noqa: E402

STEPS = 20_000


def recipe() -> AgentRecipe:
    steps = [DefaultStep("s0", "Start.")]
    for i in range(1, STEPS):
        goal = f"Go on from {{{{ s{i - 1}.output }}}}."
        steps.append(DefaultStep(f"s{i}", goal, depends_on=[f"s{i - 1}"]))
    return AgentRecipe(id="big", steps=steps)


def recipe_yaml() -> str:
    """A valid recipe of `STEPS` steps, of every common kind, each reading the one before."""
    lines = [
        "id: big",
        "description: A long chain of every common kind of step.",
        "inputs:",
        "  topic: string",
        "  rounds: {type: integer, default: 3}",
        "steps:",
        "  - id: s0",
        '    goal: "Start on {{ inputs.topic }}."',
    ]
    for i in range(1, STEPS):
        before = f"s{i - 1}"
        lines += [f"  - id: s{i}", f"    depends_on: [{before}]"]
        if i % 10 == 3:
            lines += ["    tool: current_datetime"]
        elif i % 10 == 7:
            lines += [
                "    analyze: Is it done?",
                f'    input: "{{{{ {before}.output }}}}"',
                '    output: {done: false, why: ""}',
            ]
        else:
            lines += [
                f'    goal: "Go on from {{{{ {before}.output }}}} '
                '({{ inputs.rounds }} rounds)."',
                "    system: You write briefly.",
            ]
        if i % 100 == 0:
            lines += [f"    save_as: part{i // 100}"]
    return "\n".join(lines) + "\n"


def wide_yaml(*, broken: bool) -> str:
    """`STEPS` steps that depend on nothing (all ready at once); `broken`: each with an
    unknown field, so that every step has a problem to report."""
    lines = ["id: wide", "steps:"]
    for i in range(STEPS):
        lines += [f"  - id: s{i}", "    goal: Say something."]
        if broken:
            lines += ["    colour: red"]
    return "\n".join(lines) + "\n"


def load_problems(path: Path) -> None:
    problems: list[object] = []
    try:
        load_recipe_file(path)
    except RecipeError as exc:
        problems += exc.problems
    if len(problems) != STEPS:
        raise SystemExit(f"expected {STEPS} problems, got {len(problems)}")


def command_ms(path: Path) -> list[float]:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "minions", "validate", str(path)],
            check=True,
            capture_output=True,
        )
        times.append((time.perf_counter() - started) * 1000)
    return times


def measure(fn: Callable[[], object]) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of 3 runs (CPU time is steadier on a shared machine)."""
    wall, cpu = [], []
    for _ in range(3):
        gc.collect()
        started, cpu_started = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return wall, cpu


def report(variant: str, fn: Callable[[], object], **extra: object) -> None:
    wall, cpu = measure(fn)
    emit(
        "VALIDATE",
        variant,
        primary="ms",
        metrics={
            "ms": summary([s * 1000 for s in wall], "ms", digits=1),
            "cpu_ms": summary([s * 1000 for s in cpu], "ms", digits=1),
            "us_per_step": summary([s * 1e6 / STEPS for s in wall], "us", digits=2),
        },
        extra=extra,
    )


def main() -> None:
    big = recipe()
    report(f"{STEPS} chained steps", lambda: StepGraph(big))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.yaml"
        path.write_text(recipe_yaml())
        loaded = load_recipe_file(path)
        assert len(loaded.recipe.steps) == STEPS
        cli = command_ms(path)
        report(
            f"{STEPS} steps from YAML",
            lambda: load_recipe_file(path),
            cli_ms=round(statistics.median(cli), 1),
            yaml_bytes=path.stat().st_size,
        )
        wide = Path(folder) / "wide.yaml"
        wide.write_text(wide_yaml(broken=False))
        report(f"{STEPS} independent steps from YAML", lambda: load_recipe_file(wide))
        broken = Path(folder) / "broken.yaml"
        broken.write_text(wide_yaml(broken=True))
        report(f"{STEPS} broken steps from YAML", lambda: load_problems(broken))


if __name__ == "__main__":
    main()
