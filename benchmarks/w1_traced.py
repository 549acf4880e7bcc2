"""W1 with OpenTelemetry tracing on: what the spans cost per step.

The W1 workload (50 steps in a line, one zero-latency model call each; see
`w1_linear_chain.py`), run by an `AgentExecutor(tracer_provider=...)`, so every run writes
one ``invoke_workflow`` span, 50 ``invoke_agent`` spans and 50 ``chat`` spans. Variants, in one
process, interleaved per repetition so machine noise hits them alike:

* ``untraced``: no tracer provider (the W1 headline, for the ratio);
* ``API no-op provider``: the API's `NoOpTracerProvider` (non-recording spans: what minions'
  own instrumentation costs, without an SDK);
* ``SDK, no processor``: an SDK `TracerProvider` with no span processor (spans are recorded
  and dropped);
* ``SDK, no-op exporter``: the SDK provider with a `SimpleSpanProcessor` into an exporter that
  does nothing (the target's setting: under 2x);
* ``SDK, in-memory exporter``: the same into an `InMemorySpanExporter` (cleared between
  repetitions, outside the timed region).

3 warm-ups, 20 timed repetitions; `us_per_step` = wall time / 50. `extra.ratio_to_untraced`
is the median traced time over the median untraced time (target: under 2).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Sequence

from _common import emit, fail, mark_imported, summary
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider
from w1_linear_chain import STEPS, build, check

from minions import AgentExecutor, AgentResult, StepStatus
from minions.testing import FunctionModel

mark_imported()

WARMUPS = 3
REPETITIONS = 20


class NoOpExporter(SpanExporter):
    """Takes spans and does nothing with them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def main() -> None:
    model = FunctionModel(lambda prompt: "ok", name="openai:zero-latency")
    recipe = build(model)
    exporter = InMemorySpanExporter()
    in_memory = TracerProvider()
    in_memory.add_span_processor(SimpleSpanProcessor(exporter))
    no_op = TracerProvider()
    no_op.add_span_processor(SimpleSpanProcessor(NoOpExporter()))
    executors = {
        "untraced": AgentExecutor(),
        "API no-op provider": AgentExecutor(tracer_provider=NoOpTracerProvider()),
        "SDK, no processor": AgentExecutor(tracer_provider=TracerProvider()),
        "SDK, no-op exporter": AgentExecutor(tracer_provider=no_op),
        "SDK, in-memory exporter": AgentExecutor(tracer_provider=in_memory),
    }
    for executor in executors.values():
        executor.graph(recipe)  # Validate once, outside the timed region.
    times: dict[str, list[float]] = {name: [] for name in executors}
    last: dict[str, AgentResult] = {}

    async def timed(name: str) -> float:
        model.requests.clear()
        exporter.clear()
        gc.collect()
        started = time.perf_counter()
        last[name] = await executors[name].execute(recipe)
        return time.perf_counter() - started

    async def measure() -> None:
        for repetition in range(WARMUPS + REPETITIONS):
            for name in executors:
                elapsed = await timed(name)
                if repetition >= WARMUPS:
                    times[name].append(elapsed)

    asyncio.run(measure())
    for name, result in last.items():
        if result.status is not StepStatus.COMPLETED:
            fail(f"W1 {name}: the run failed: {result.error}")
    check(last["SDK, in-memory exporter"], model)
    spans = exporter.get_finished_spans()
    if len(spans) != 1 + 2 * STEPS:
        fail(f"W1 traced: {len(spans)} spans, expected {1 + 2 * STEPS}")
    untraced = statistics.median(times["untraced"])
    for name, values in times.items():
        emit(
            "W1",
            f"AgentExecutor.execute, {name}",
            headline=False,
            primary="us_per_step",
            metrics={"us_per_step": summary([t / STEPS * 1e6 for t in values], "us")},
            extra={
                "steps": STEPS,
                "spans_per_run": 0 if name == "untraced" else 1 + 2 * STEPS,
                "ratio_to_untraced": round(statistics.median(values) / untraced, 3),
                "model": "minions.testing.FunctionModel, zero latency, answers 'ok'",
            },
        )


if __name__ == "__main__":
    main()
