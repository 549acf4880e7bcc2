"""Helpers for the agent-layer tests: steps with their own scripted models, event recording."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from minions import (
    AgentExecutor,
    AgentRecipe,
    AgentResult,
    DefaultStep,
    ExecutionConfig,
    ModelCallResponse,
    Prompt,
    Step,
)
from minions.events import ModelCallStarted, StepCompleted, StepFailed, StepStarted
from minions.models import TokenCallback
from minions.testing import Reply, ScriptedModel

FAST = ExecutionConfig(retry_initial_delay=0.0, tool_retry_initial_delay=0.0)

HANG_GUARD = 20.0
"""Seconds after which `run` gives up. Not a time budget: when the code under test never opens
a barrier a test waits on, the test fails instead of hanging the suite."""

Condition = Callable[[list[Any]], bool]
"""A test on the events received so far."""


class GatedModel(ScriptedModel):
    """A scripted model whose every answer first waits for `gate` to open, then for `turns`
    turns of the event loop: ordering by barriers and latency without a clock."""

    def __init__(
        self,
        replies: Sequence[Reply],
        *,
        name: str,
        gate: asyncio.Event | None = None,
        turns: int = 0,
        delay: float = 0.0,
    ) -> None:
        super().__init__(replies, name=name, delay=delay)
        self.gate = gate
        self.turns = turns

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        if self.gate is not None:
            await self.gate.wait()
        for _ in range(self.turns):
            await asyncio.sleep(0)  # a turn of the event loop, not a wait on the clock
        return await super().call(prompt, on_token=on_token)


def step(
    step_id: str,
    *replies: Reply,
    gate: asyncio.Event | None = None,
    turns: int = 0,
    delay: float = 0.0,
    goal: str | None = None,
    **options: Any,
) -> DefaultStep:
    """A step with its own scripted model (default reply: ``"<id> done"``).

    Its model answers once `gate` is set and `turns` event-loop turns have passed. `delay` (a
    real sleep) is only for keeping a step busy until something cancels it.
    """
    model = GatedModel(
        list(replies) or [f"{step_id} done"], name=step_id, gate=gate, turns=turns, delay=delay
    )
    return DefaultStep(step_id, goal or f"Do {step_id}.", model=model, **options)


def step_started(step_id: str) -> Condition:
    """The step has started (any visit)."""
    return lambda events: any(isinstance(e, StepStarted) and e.step_id == step_id for e in events)


def step_finished(step_id: str) -> Condition:
    """The step has completed or failed (its first visit or any later one)."""
    return lambda events: any(
        isinstance(e, StepCompleted | StepFailed) and e.step_id == step_id for e in events
    )


def model_calls_started(count: int) -> Condition:
    """At least `count` model calls have started, in any steps."""
    return lambda events: sum(isinstance(e, ModelCallStarted) for e in events) >= count


def model_of(s: Step) -> ScriptedModel:
    assert isinstance(s.model, ScriptedModel)
    return s.model


class Recorder:
    """A listener keeping every event, with helpers to read them."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._waiting: list[tuple[Condition, asyncio.Event]] = []

    def __call__(self, event: Any) -> None:
        self.events.append(event)
        for condition, reached in self._waiting:
            if condition(self.events):
                reached.set()

    def event_when(self, condition: Condition) -> asyncio.Event:
        """An `asyncio.Event` set as soon as the events received satisfy `condition`: a
        barrier to gate a step's model on what other steps have done."""
        reached = asyncio.Event()
        if condition(self.events):
            reached.set()
        else:
            self._waiting.append((condition, reached))
        return reached

    async def until(self, condition: Condition) -> None:
        """Wait until the events received so far satisfy `condition` (no clock involved)."""
        await self.event_when(condition).wait()

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
    async with asyncio.timeout(HANG_GUARD):
        return await executor.execute(recipe, inputs, listeners=listeners)


def statuses(result: AgentResult) -> dict[str, str]:
    """Each step's latest status, by id."""
    return {e.step_id: e.status.value for e in result.executions}


def numbered(events: Sequence[Any]) -> bool:
    """Whether events are numbered as a run numbers them: 1, 2, 3... without a gap, a token
    delta carrying the number of the event before it (it is never stored)."""
    stored = [e.seq for e in events if e.kind != "token_delta"]
    deltas_follow = all(
        e.seq == before.seq for before, e in itertools.pairwise(events) if e.kind == "token_delta"
    )
    return stored == list(range(1, len(stored) + 1)) and deltas_follow
