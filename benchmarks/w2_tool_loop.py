"""W2 — tool loop: framework overhead per model call and per tool call.

Three trivial sync tools returning small dicts. One step on a fresh conversation: the first
reply asks for k tool calls in one response; after the results, the second reply is "done"
(k = 0: one model call, the text "done"). One repetition = 20 sequential steps; 2 warm-ups,
20 timed. The headline is k = 3; `T(k) = B + M * calls(k) + t * k` is fitted over
k in {0, 1, 3, 6} by least squares: M = us_per_model_call, t = us_per_tool_call.

Variants: the default (sync tools in a worker thread), sync tools marked
`run_in_thread=False`, and async tools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _common import emit, mark_imported, summary, time_async

from minions import (
    AgentContext,
    DefaultStep,
    ExecutionConfig,
    Message,
    ModelCallResponse,
    Prompt,
    StepExecutor,
    StepStatus,
    Tool,
    ToolCall,
    Usage,
    tool,
)
from minions.models import Model, TokenCallback

mark_imported()

STEPS = 20
KS = (0, 1, 3, 6)


def get_weather(city: str) -> dict[str, Any]:
    """Weather in a city."""
    return {"city": city, "temp_c": 21}


def get_time(tz: str) -> dict[str, Any]:
    """Time in a time zone."""
    return {"tz": tz, "time": "12:00"}


def add(a: int, b: int) -> dict[str, Any]:
    """Add two integers."""
    return {"sum": a + b}


async def get_weather_async(city: str) -> dict[str, Any]:
    """Weather in a city."""
    return {"city": city, "temp_c": 21}


async def get_time_async(tz: str) -> dict[str, Any]:
    """Time in a time zone."""
    return {"tz": tz, "time": "12:00"}


async def add_async(a: int, b: int) -> dict[str, Any]:
    """Add two integers."""
    return {"sum": a + b}


CALLS = [
    ("get_weather", {"city": "Oslo"}),
    ("get_time", {"tz": "UTC"}),
    ("add", {"a": 1, "b": 2}),
]


class ZeroLatencyModel(Model):
    """Answers at once with prebuilt responses: k tool calls first, then "done"."""

    name = "zero-latency"

    def __init__(self, k: int) -> None:
        usage = Usage.of_call(20, 5)
        calls = tuple(
            ToolCall(id=f"call_{i}", name=CALLS[i % 3][0], arguments=CALLS[i % 3][1])
            for i in range(k)
        )
        self.first = ModelCallResponse(message=Message.assistant("", calls), usage=usage)
        self.done = ModelCallResponse(message=Message.assistant("done"), usage=usage)
        self.k = k

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        if self.k and prompt.messages[-1].role != "tool":
            return self.first
        return self.done


def tools_for(variant: str) -> list[Tool]:
    if variant == "async tools":
        fns: list[Callable[..., Any]] = [get_weather_async, get_time_async, add_async]
        return [tool(f, name=f.__name__.removesuffix("_async")) for f in fns]
    in_thread = variant == "StepExecutor.execute"
    return [tool(run_in_thread=in_thread)(f) for f in (get_weather, get_time, add)]


def measure(variant: str, k: int) -> list[float]:
    tools = tools_for(variant)
    model = ZeroLatencyModel(k)
    names = {t.name for t in tools}
    steps = [DefaultStep(f"step_{i}", "Use the tools.", tools=names) for i in range(STEPS)]
    config = ExecutionConfig()

    async def one_repetition() -> None:
        context = AgentContext(model=model, tools=tools, config=config)
        for step in steps:
            execution = await StepExecutor(step, context).execute()
            assert execution.status is StepStatus.COMPLETED
            assert len(execution.tool_calls) == k
            assert sum(1 for m in execution.messages if m.role == "tool") == k

    times = time_async(one_repetition, warmups=2, repetitions=20)
    return [t / STEPS * 1e6 for t in times]


def fit(medians: dict[int, float]) -> tuple[float, float, float]:
    """Least squares for T(k) = B + M * calls(k) + t * k (normal equations, 3x3)."""
    rows = [(1.0, 1.0 if k == 0 else 2.0, float(k)) for k in KS]
    ys = [medians[k] for k in KS]
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]
    # Gaussian elimination.
    for col in range(3):
        pivot = ata[col][col]
        for row in range(col + 1, 3):
            factor = ata[row][col] / pivot
            for j in range(col, 3):
                ata[row][j] -= factor * ata[col][j]
            aty[row] -= factor * aty[col]
    solution = [0.0, 0.0, 0.0]
    for row in (2, 1, 0):
        rest = sum(ata[row][j] * solution[j] for j in range(row + 1, 3))
        solution[row] = (aty[row] - rest) / ata[row][row]
    return solution[0], solution[1], solution[2]


def main() -> None:
    import statistics

    variants = ["StepExecutor.execute", "inline sync tools", "async tools"]
    for index, variant in enumerate(variants):
        per_k = {k: measure(variant, k) for k in KS}
        medians = {k: statistics.median(v) for k, v in per_k.items()}
        base, per_model_call, per_tool_call = fit(medians)
        emit(
            "W2",
            variant,
            headline=index == 0,
            primary="us_per_step",
            metrics={
                "us_per_step": summary(per_k[3], "us"),
                "us_per_model_call": {"median": round(per_model_call, 3), "unit": "us", "n": 4},
                "us_per_tool_call": {"median": round(per_tool_call, 3), "unit": "us", "n": 4},
            },
            extra={
                **{f"us_per_step_k{k}": round(medians[k], 3) for k in KS},
                "fit_intercept_us": round(base, 3),
                "steps_per_repetition": STEPS,
                "tools": "sync, in a worker thread (default)"
                if variant == "StepExecutor.execute"
                else variant,
            },
        )


if __name__ == "__main__":
    main()
