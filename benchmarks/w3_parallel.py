"""W3 — parallelism: makespan against the ideal of perfectly parallel steps.

- W3a: 8 independent steps, each one model call with 100 ms latency, then a join step
  depending on all 8 (one more 100 ms call). Ideal 200 ms.
- W3b: 4 waves of 4 steps, each one 50 ms call; every step of a wave depends on all steps of
  the previous wave. Ideal 200 ms.

The latency is the model's: `minions.testing.FunctionModel(delay=...)` awaits
`asyncio.sleep(delay)` in each call, then answers "ok". 2 warm-ups, 20 timed, one
`AgentExecutor.execute` run per repetition (default `max_parallel_steps`, 8).

`ratio_to_ideal` = makespan / 200 ms. The same sleeps arranged with bare `asyncio.gather`
(no framework at all) are timed in the same process and reported in `extra`: that is the
floor the event loop's timers set on this machine (`asyncio.sleep` wakes up late by up to a
millisecond), and `framework_ms` = minions' median minus that floor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from _common import emit, fail, mark_imported, summary, time_async

from minions import (
    AgentExecutor,
    AgentRecipe,
    AgentResult,
    DefaultStep,
    StepExecution,
    StepStatus,
)
from minions.testing import FunctionModel

mark_imported()

IDEAL_S = 0.2


def fan_out_join() -> AgentRecipe:
    model = FunctionModel(lambda prompt: "ok", name="100ms", delay=0.1)
    parts = [DefaultStep(f"part_{i}", f"Do part {i}.", model=model) for i in range(8)]
    join = DefaultStep("join", "Join the parts.", depends_on=[s.id for s in parts], model=model)
    return AgentRecipe(id="w3a-fan-out-join", steps=[*parts, join])


def waves() -> AgentRecipe:
    model = FunctionModel(lambda prompt: "ok", name="50ms", delay=0.05)
    steps: list[DefaultStep] = []
    previous: list[str] = []
    for w in range(4):
        wave = [
            DefaultStep(f"w{w}_{j}", f"Wave {w}, step {j}.", depends_on=previous, model=model)
            for j in range(4)
        ]
        steps.extend(wave)
        previous = [s.id for s in wave]
    return AgentRecipe(id="w3b-waves", steps=steps)


async def bare_fan_out_join() -> None:
    await asyncio.gather(*(asyncio.sleep(0.1) for _ in range(8)))
    await asyncio.sleep(0.1)


async def bare_waves() -> None:
    for _ in range(4):
        await asyncio.gather(*(asyncio.sleep(0.05) for _ in range(4)))


def span(execution: StepExecution) -> tuple[float, float]:
    """When a step ran (epoch seconds), from its execution record."""
    started, finished = execution.started_at, execution.finished_at
    if started is None or finished is None:
        fail(f"{execution.step_id}: no start or end time")
    return started, finished


def all_at_once(executions: list[StepExecution]) -> bool:
    """Each of these steps started before any of them finished."""
    spans = [span(e) for e in executions]
    return max(s for s, _ in spans) < min(f for _, f in spans)


def after(later: list[StepExecution], earlier: list[StepExecution]) -> bool:
    """No step of `later` started before every step of `earlier` had finished."""
    return min(span(e)[0] for e in later) >= max(span(e)[1] for e in earlier)


def check_fan_out_join(result: AgentResult) -> None:
    if result.status is not StepStatus.COMPLETED or len(result.executions) != 9:
        fail(f"W3a: the run did not complete its 9 steps: {result!r}")
    parts = [result.step(f"part_{i}") for i in range(8)]
    if not all_at_once(parts):
        fail("W3a: the 8 independent steps did not all run at once")
    if not after([result.step("join")], parts):
        fail("W3a: the join started before all its dependencies finished")


def check_waves(result: AgentResult) -> None:
    if result.status is not StepStatus.COMPLETED or len(result.executions) != 16:
        fail(f"W3b: the run did not complete its 16 steps: {result!r}")
    by_wave = [[result.step(f"w{w}_{j}") for j in range(4)] for w in range(4)]
    for w, wave in enumerate(by_wave):
        if not all_at_once(wave):
            fail(f"W3b: the 4 steps of wave {w} did not all run at once")
        if w and not after(wave, by_wave[w - 1]):
            fail(f"W3b: wave {w} started before wave {w - 1} finished")


def measure(
    workload: str,
    recipe: AgentRecipe,
    check: Callable[[AgentResult], None],
    bare: Callable[[], Awaitable[None]],
    shape: str,
) -> None:
    executor = AgentExecutor()
    executor.graph(recipe)  # Validate once, outside the timed region.
    results: list[AgentResult] = []

    async def one_run() -> None:
        results.append(await executor.execute(recipe))

    times = time_async(one_run, warmups=2, repetitions=20)
    for result in results:
        check(result)
    floor = time_async(bare, warmups=2, repetitions=20)
    makespan = summary([t * 1e3 for t in times], "ms")
    bare_ms = summary([t * 1e3 for t in floor], "ms")
    emit(
        workload,
        "AgentExecutor.execute",
        primary="ratio_to_ideal",
        metrics={
            "makespan_ms": makespan,
            "ratio_to_ideal": summary([t / IDEAL_S for t in times], "x", digits=4),
        },
        extra={
            "ideal_ms": IDEAL_S * 1e3,
            "shape": shape,
            "bare_asyncio_makespan_ms": bare_ms,
            "bare_asyncio_ratio_to_ideal": round(bare_ms["median"] / (IDEAL_S * 1e3), 4),
            "framework_ms": round(makespan["median"] - bare_ms["median"], 3),
            "model": "minions.testing.FunctionModel with delay= (asyncio.sleep)",
        },
    )


def main() -> None:
    measure(
        "W3a",
        fan_out_join(),
        check_fan_out_join,
        bare_fan_out_join,
        "8 parallel 100 ms steps, then a 100 ms join",
    )
    measure(
        "W3b",
        waves(),
        check_waves,
        bare_waves,
        "4 waves of 4 parallel 50 ms steps, each wave after the whole previous one",
    )


if __name__ == "__main__":
    main()
