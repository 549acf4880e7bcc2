"""Helpers for the agent-layer tests: steps with their own scripted models, event recording."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from minions import AgentExecutor, AgentRecipe, AgentResult, DefaultStep, ExecutionConfig, Step
from minions.events import StepCompleted, StepFailed, StepStarted
from minions.testing import Reply, ScriptedModel

FAST = ExecutionConfig(retry_initial_delay=0.0, tool_retry_initial_delay=0.0)


def step(
    step_id: str,
    *replies: Reply,
    delay: float = 0.0,
    goal: str | None = None,
    **options: Any,
) -> DefaultStep:
    """A step with its own scripted model (default reply: ``"<id> done"``)."""
    model = ScriptedModel(list(replies) or [f"{step_id} done"], name=step_id, delay=delay)
    return DefaultStep(step_id, goal or f"Do {step_id}.", model=model, **options)


def model_of(s: Step) -> ScriptedModel:
    assert isinstance(s.model, ScriptedModel)
    return s.model


class Recorder:
    """A listener keeping every event, with helpers to read them."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._waiting: list[tuple[Callable[[list[Any]], bool], asyncio.Event]] = []

    def __call__(self, event: Any) -> None:
        self.events.append(event)
        for condition, reached in self._waiting:
            if condition(self.events):
                reached.set()

    async def until(self, condition: Callable[[list[Any]], bool]) -> None:
        """Wait until the events received so far satisfy `condition` (no clock involved)."""
        reached = asyncio.Event()
        if condition(self.events):
            return
        self._waiting.append((condition, reached))
        await reached.wait()

    def kinds(self, step_id: str | None = None) -> list[str]:
        return [e.kind for e in self.events if step_id is None or e.step_id == step_id]

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def seq(self, kind: type[Any], step_id: str, visit: int = 1) -> int:
        """The sequence number of a step's event (StepStarted / StepCompleted / StepFailed)."""
        for event in self.events:
            if isinstance(event, kind) and event.step_id == step_id and event.visit == visit:
                return int(event.seq)
        raise AssertionError(f"no {kind.__name__} for {step_id!r} visit {visit}")

    def finished(self, step_id: str, visit: int = 1) -> int:
        for event in self.events:
            if (
                isinstance(event, StepCompleted | StepFailed)
                and event.step_id == step_id
                and event.visit == visit
            ):
                return int(event.seq)
        raise AssertionError(f"{step_id!r} visit {visit} never finished")

    def started(self, step_id: str, visit: int = 1) -> int:
        return self.seq(StepStarted, step_id, visit)

    def max_concurrency(self) -> int:
        """The most steps running at once, from start and finish events."""
        running = peak = 0
        for event in self.events:
            if isinstance(event, StepStarted):
                running += 1
                peak = max(peak, running)
            elif isinstance(event, StepCompleted | StepFailed):
                running -= 1
        return peak


async def run(
    steps: Sequence[Step],
    *,
    inputs: dict[str, Any] | None = None,
    config: ExecutionConfig | None = None,
    recorder: Recorder | None = None,
    **recipe_options: Any,
) -> AgentResult:
    recipe = AgentRecipe(id="test", steps=steps, **recipe_options)
    executor = AgentExecutor(config=config or FAST)
    listeners = [recorder] if recorder is not None else []
    return await executor.execute(recipe, inputs, listeners=listeners)


def statuses(result: AgentResult) -> dict[str, str]:
    """Each step's latest status, by id."""
    return {e.step_id: e.status.value for e in result.executions}
