"""W1 — linear chain: the agent layer's overhead per step.

50 `DefaultStep`s in a line, each depending on the previous one. Step i makes exactly one
model call; its goal is ``"step {i}: {{ step_<i-1>.output }}"`` (step 0: ``"start"``), and the
model answers the text ``"ok"`` at once. One repetition is one whole 50-step run of
`AgentExecutor.execute`; 3 warm-ups, 20 timed. `us_per_step` = wall time / 50.

The model is `minions.testing.FunctionModel`: native async, no delay, token usage reported
(computed from the request), its request log cleared between repetitions.

Variants: `AgentExecutor.execute` (the headline) and `AgentExecutor.execute_sync` (one
`asyncio.run` per run, included in the time).
"""

from __future__ import annotations

from _common import emit, fail, mark_imported, summary, time_async, time_sync

from minions import AgentExecutor, AgentRecipe, AgentResult, DefaultStep, StepStatus
from minions.testing import FunctionModel

mark_imported()

STEPS = 50


def build(model: FunctionModel) -> AgentRecipe:
    steps = [DefaultStep("step_0", "start", model=model)]
    for i in range(1, STEPS):
        previous = f"step_{i - 1}"
        goal = f"step {i}: {{{{ {previous}.output }}}}"
        steps.append(DefaultStep(f"step_{i}", goal, depends_on=[previous], model=model))
    return AgentRecipe(id="w1-linear-chain", steps=steps)


def check(result: AgentResult, model: FunctionModel) -> None:
    """Every step ran once, in order, with one model call whose goal holds the previous
    output."""
    if result.status is not StepStatus.COMPLETED:
        fail(f"W1: the run failed: {result.error}")
    order = [e.step_id for e in result.executions]
    if order != [f"step_{i}" for i in range(STEPS)]:
        fail(f"W1: steps ran as {order}")
    if any(
        e.status is not StepStatus.COMPLETED or len(e.model_calls) != 1 for e in result.executions
    ):
        fail("W1: a step did not complete with exactly one model call")
    if result.usage.calls != STEPS or len(model.requests) != STEPS:
        fail(f"W1: {result.usage.calls} model calls, {len(model.requests)} requests")
    last = model.requests[-1].messages[-1].content
    if not last.endswith(f"step {STEPS - 1}: ok"):
        fail(f"W1: the last goal was not rendered from the previous output: {last!r}")


def main() -> None:
    model = FunctionModel(lambda prompt: "ok", name="zero-latency")
    recipe = build(model)
    executor = AgentExecutor()
    executor.graph(recipe)  # Validate once, outside the timed region (execute caches it).
    results: list[AgentResult] = []

    async def one_run() -> None:
        model.requests.clear()
        results.append(await executor.execute(recipe))

    def one_sync_run() -> None:
        model.requests.clear()
        results.append(executor.execute_sync(recipe))

    for variant, headline in (
        ("AgentExecutor.execute", True),
        ("AgentExecutor.execute_sync", False),
    ):
        results.clear()
        if headline:
            times = time_async(one_run, warmups=3, repetitions=20)
        else:
            times = time_sync(one_sync_run, warmups=3, repetitions=20)
        check(results[-1], model)
        if any(r.status is not StepStatus.COMPLETED for r in results):
            fail("W1: a run failed")
        emit(
            "W1",
            variant,
            headline=headline,
            primary="us_per_step",
            metrics={"us_per_step": summary([t / STEPS * 1e6 for t in times], "us")},
            extra={
                "steps": STEPS,
                "model": "minions.testing.FunctionModel, zero latency, answers 'ok'",
                "memory": "step",
            },
        )


if __name__ == "__main__":
    main()
