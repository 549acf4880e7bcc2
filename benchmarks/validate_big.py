"""VALIDATE — checking a big recipe: 20,000 steps, each depending on the one before and
quoting its output in its goal (a recipe that validated in quadratic time before).

Reports the median of 3 runs of `StepGraph(recipe)` (the whole check: ids, references, cycles,
loops, templates) in milliseconds, and the time per step.
"""

from __future__ import annotations

from _common import emit, mark_imported, summary, time_sync

mark_imported()

from minions import AgentRecipe, DefaultStep, StepGraph  # noqa: E402

STEPS = 20_000


def recipe() -> AgentRecipe:
    steps = [DefaultStep("s0", "Start.")]
    for i in range(1, STEPS):
        goal = f"Go on from {{{{ s{i - 1}.output }}}}."
        steps.append(DefaultStep(f"s{i}", goal, depends_on=[f"s{i - 1}"]))
    return AgentRecipe(id="big", steps=steps)


def main() -> None:
    big = recipe()
    seconds = time_sync(lambda: StepGraph(big), warmups=0, repetitions=3)
    emit(
        "VALIDATE",
        f"{STEPS} chained steps",
        primary="ms",
        metrics={
            "ms": summary([s * 1000 for s in seconds], "ms", digits=1),
            "us_per_step": summary([s * 1e6 / STEPS for s in seconds], "us", digits=2),
        },
    )


if __name__ == "__main__":
    main()
