"""Random DAGs (up to 30 steps, random failures and latencies) always terminate, run each step
at most once, never start a step before its dependencies are done, and skip exactly the steps
that depend on failures."""

from __future__ import annotations

import asyncio
import dataclasses

from agent_helpers import FAST, Recorder, run, step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minions import ModelError, StepStatus
from minions.events import StepCompleted, StepFailed, StepStarted


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[tuple[list[int], bool, int]], int]:
    size = draw(st.integers(1, 30))
    nodes = []
    for i in range(size):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        fails = draw(st.booleans().map(lambda b: b and draw(st.integers(0, 3)) == 0))
        # Latency in event-loop turns: varied interleavings, the same on every run.
        turns = draw(st.sampled_from([0, 0, 1, 3]))
        nodes.append((sorted(deps), fails, turns))
    return nodes, draw(st.integers(1, 8))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_run_correctly(dag: tuple[list[tuple[list[int], bool, int]], int]) -> None:
    nodes, parallel = dag
    steps = []
    for i, (deps, fails, turns) in enumerate(nodes):
        reply = ModelError(f"s{i} broke") if fails else f"s{i} ok"
        steps.append(step(f"s{i}", reply, turns=turns, depends_on=[f"s{d}" for d in deps]))
    recorder = Recorder()
    config = dataclasses.replace(FAST, max_parallel_steps=parallel)
    result = asyncio.run(run(steps, config=config, recorder=recorder))

    # The expected outcome: a step is skipped when any dependency failed or was skipped.
    expected: dict[str, str] = {}
    for i, (deps, fails, _) in enumerate(nodes):
        if any(expected[f"s{d}"] != "completed" for d in deps):
            expected[f"s{i}"] = "skipped"
        else:
            expected[f"s{i}"] = "failed" if fails else "completed"

    # Each step has exactly one execution, with the expected status.
    assert sorted(e.step_id for e in result.executions) == sorted(expected)
    assert {e.step_id: e.status.value for e in result.executions} == expected
    assert (result.status is StepStatus.COMPLETED) == all(
        v == "completed" for v in expected.values()
    )

    # Each step started at most once, and only after its dependencies had finished.
    started = [e.step_id for e in recorder.of(StepStarted)]
    assert len(started) == len(set(started))
    assert set(started) == {s for s, v in expected.items() if v != "skipped"}
    finished = {
        e.step_id: e.seq for e in recorder.events if isinstance(e, StepCompleted | StepFailed)
    }
    for event in recorder.of(StepStarted):
        deps, _, _ = nodes[int(event.step_id[1:])]
        for d in deps:
            assert finished[f"s{d}"] < event.seq

    # Never more steps at once than allowed.
    assert recorder.max_concurrency() <= parallel
