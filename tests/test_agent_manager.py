"""StepManager on its own: which steps are ready, and how finishing one moves the run on."""

from __future__ import annotations

from agent_helpers import step

from minions import (
    AgentContext,
    AgentRecipe,
    ModelError,
    Step,
    StepGraph,
    StepManager,
    StepStatus,
)


def manager_of(*steps: Step) -> StepManager:
    recipe = AgentRecipe(id="m", steps=steps)
    return StepManager(StepGraph(recipe), AgentContext())


async def test_ready_start_advance_one_step_at_a_time() -> None:
    manager = manager_of(step("a"), step("b"), step("c", depends_on=["a", "b"]))
    assert list(manager.ready) == ["a", "b"]
    assert manager.status("c") == "waiting"
    first = manager.start("a")
    assert manager.status("a") == "running"
    assert list(manager.ready) == ["b"]
    manager.advance(await first.execute())
    assert manager.status("a") == "completed"
    assert list(manager.ready) == ["b"]  # c still waits for b
    second = manager.start("b")
    manager.advance(await second.execute())
    assert list(manager.ready) == ["c"]
    last = manager.start("c")
    assert set(last.dependencies) == {"a", "b"}
    manager.advance(await last.execute())
    assert manager.peek() is None
    assert [e.step_id for e in manager.executions] == ["a", "b", "c"]
    assert manager.failures == []


async def test_a_failure_skips_dependents_at_once() -> None:
    manager = manager_of(step("a", ModelError("down")), step("b", depends_on=["a"]))
    execution = await manager.start("a").execute()
    manager.advance(execution)
    assert manager.status("b") == "skipped"
    assert manager.failures == [execution]
    assert manager.executions[-1].status is StepStatus.SKIPPED
    assert manager.executions[-1].error == "dependency 'a' failed"
