"""The step cache: a step that says ``cache`` reuses an earlier execution's output (no model
call, event ``step_cached``, no usage, the saving reported) when its rendered prompt, model,
tools and output schema are the same, within its ttl (an injectable clock); any change of a
key part misses; steps whose tools have side effects or need approval are not cached unless
they say so; durable runs share the cache through the store (two workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runs_helpers import run_here

from minions import (
    AgentExecutor,
    AgentRecipe,
    CachePolicy,
    DefaultStep,
    InMemoryStepCache,
    OutputInstructions,
    Prompt,
    RunSettings,
    StepDefinitionError,
    tool,
)
from minions.errors import RecipeError
from minions.events import Event, StepCached
from minions.recipes import dump_recipe, parse_recipe
from minions.runs import RunStore
from minions.testing import FunctionModel


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@tool(side_effects=False)
def look(word: str) -> str:
    """Look a word up."""
    return word.upper()


@tool
def send(word: str) -> str:
    """Send a word somewhere."""
    return "sent"


@tool(side_effects=False, requires_approval=True)
def guarded(word: str) -> str:
    """A tool a person approves."""
    return word


def answering(text: str = "done") -> FunctionModel:
    return FunctionModel(lambda prompt: text, name="answers")


def recipe(goal: str = "sum up {{ inputs.topic }}", **options: Any) -> AgentRecipe:
    options.setdefault("cache", True)
    return AgentRecipe(id="cached", steps=[DefaultStep("sum", goal, **options)])


async def run(
    executor: AgentExecutor, made: AgentRecipe, topic: str = "bees"
) -> tuple[Any, list[Event]]:
    events: list[Event] = []
    result = await executor.execute(made, {"topic": topic}, listeners=[events.append])
    return result, events


async def test_a_second_run_of_a_cached_step_makes_no_model_call() -> None:
    model = answering()
    executor = AgentExecutor(model=model)
    made = recipe()
    first, _ = await run(executor, made)
    assert len(model.requests) == 1
    second, events = await run(executor, made)
    assert len(model.requests) == 1
    assert second.output == first.output == "done"
    [cached] = [e for e in events if isinstance(e, StepCached)]
    assert cached.step_id == "sum"
    assert cached.saved.calls == 1
    assert cached.saved.prompt_tokens == first.usage.prompt_tokens > 0
    assert second.usage.calls == 0
    kinds = [e.kind for e in events]
    assert kinds.index("step_cached") < kinds.index("step_completed")
    assert "model_call_started" not in kinds
    # Another executor has a cache of its own.
    other = AgentExecutor(model=model)
    await run(other, made)
    assert len(model.requests) == 2


async def test_a_change_of_any_key_part_misses() -> None:
    model = answering()
    executor = AgentExecutor(model=model, tools=[look])
    await run(executor, recipe())
    calls = 1

    async def misses(made: AgentRecipe, topic: str = "bees", *, by: AgentExecutor) -> None:
        nonlocal calls
        _, events = await run(by, made, topic)
        assert not [e for e in events if isinstance(e, StepCached)]
        calls += 1
        assert len(model.requests) == calls

    await misses(recipe(), "wasps", by=executor)  # the rendered goal
    await misses(recipe("sum up {{ inputs.topic }}, briefly"), by=executor)  # the goal
    await misses(recipe(tools=["look"]), by=executor)  # the tools
    schema = OutputInstructions({"type": "object", "properties": {"a": {"type": "string"}}})
    model_json = FunctionModel(lambda prompt: '{"a": "x"}', name="answers")
    json_executor = AgentExecutor(
        settings=RunSettings(model=model_json, step_cache=executor.step_cache)
    )
    _, events = await run(json_executor, recipe(output=schema))  # the output schema (and
    assert not [e for e in events if isinstance(e, StepCached)]  # a model of the same name)
    other = FunctionModel(lambda prompt: "x", name="other")
    renamed = AgentExecutor(settings=RunSettings(model=other, step_cache=executor.step_cache))
    _, events = await run(renamed, recipe())  # the model
    assert not [e for e in events if isinstance(e, StepCached)]
    # And the same again hits.
    _, events = await run(executor, recipe(tools=["look"]))
    assert [e for e in events if isinstance(e, StepCached)]


async def test_an_entry_expires_after_its_ttl() -> None:
    clock = Clock()
    model = answering()
    executor = AgentExecutor(
        model=model, settings=RunSettings(step_cache=InMemoryStepCache(clock=clock))
    )
    made = recipe(cache={"ttl": "1h"})
    await run(executor, made)
    clock.now += 3599
    _, events = await run(executor, made)
    [hit] = [e for e in events if isinstance(e, StepCached)]
    assert hit.age == 3599
    assert len(model.requests) == 1
    clock.now += 2  # 3601 s after the entry was made
    _, events = await run(executor, made)
    assert not [e for e in events if isinstance(e, StepCached)]
    assert len(model.requests) == 2
    clock.now += 10  # the new entry serves again
    await run(executor, made)
    assert len(model.requests) == 2


@pytest.mark.parametrize(
    ("tools", "policy", "cached"),
    [
        (["send"], True, False),  # a tool with side effects
        (["guarded"], True, False),  # a tool that needs approval
        (["look"], True, True),  # a tool that only reads
        (["send"], {"side_effects": True}, True),  # the step accepts skipping the effects
    ],
)
async def test_steps_with_side_effects_are_cached_only_when_they_say_so(
    tools: list[str], policy: Any, cached: bool
) -> None:
    model = answering()
    executor = AgentExecutor(model=model, tools=[look, send, guarded])
    made = recipe(tools=tools, cache=policy)
    await run(executor, made)
    _, events = await run(executor, made)
    assert bool([e for e in events if isinstance(e, StepCached)]) is cached
    assert len(model.requests) == (1 if cached else 2)


def test_the_cache_field_in_yaml_and_in_python() -> None:
    text = """\
id: y
steps:
  - {id: a, goal: "one", cache: true}
  - {id: b, goal: "two", cache: {ttl: 30m, side_effects: true}}
  - {id: c, goal: "three"}
  - {id: d, goal: "four {{ loop.item }}", loop: [x, y], cache: {ttl: 90}}
"""
    made = parse_recipe(text)
    steps = {s.id: s for s in made.steps}
    assert steps["a"].cache == CachePolicy()
    assert steps["b"].cache == CachePolicy(ttl=1800.0, side_effects=True)
    assert steps["c"].cache is None
    assert steps["d"].cache is None  # the loop: each item (its body) is cached
    assert steps["d"].body.cache == CachePolicy(ttl=90.0)  # type: ignore[attr-defined]
    again = parse_recipe(dump_recipe(made))
    assert {s.id: s.cache for s in again.steps} == {s.id: s.cache for s in made.steps}
    with pytest.raises(RecipeError, match=r"cache.ttl.*positive duration"):
        parse_recipe("id: z\nsteps:\n  - {id: a, goal: g, cache: {ttl: soon}}\n")
    with pytest.raises(RecipeError, match="cache"):
        parse_recipe("id: z\nsteps:\n  - {id: a, goal: g, cache: {forever: true}}\n")
    with pytest.raises(StepDefinitionError, match="unknown keys"):
        DefaultStep("a", "g", cache={"tll": "1h"})
    assert DefaultStep("a", "g", cache={"ttl": "2d"}).cache == CachePolicy(ttl=172800.0)


CHAIN = """\
id: durable-cache
inputs: {topic: {type: string}}
steps:
  - {id: research, goal: "research {{ inputs.topic }}", cache: {ttl: 1h}}
  - {id: write, depends_on: [research], goal: "write about {{ inputs.topic }}"}
"""


async def test_two_workers_share_the_cache_through_the_store(tmp_path: Path, url: str) -> None:
    path = tmp_path / "cached.yaml"
    path.write_text(CHAIN)
    store = RunStore(url, create=True)

    async def answer(prompt: Prompt) -> str:
        return "notes"

    model = FunctionModel(answer, name="answers")
    first, _ = await store.submit(path, {"topic": "bees"})
    await run_here(url, first, model=model)  # one worker
    assert len(model.requests) == 2
    second, _ = await store.submit(path, {"topic": "bees"})
    await run_here(url, second, model=model)  # another worker, another process's cache
    assert len(model.requests) == 3  # only `write`
    events = await store.events(second)
    [cached] = [e for e in events if isinstance(e, StepCached)]
    assert (cached.step_id, cached.saved.calls) == ("research", 1)
    record = await store.get(second)
    assert record.status == "completed"
    assert record.usage["calls"] == 1
    # A foreground run given the store shares it too; expired by its clock, it misses.
    clock = Clock()
    clock.now = 10.0**10
    executor = AgentExecutor(model=model, settings=RunSettings(step_cache=store.step_cache()))
    result = await executor.execute(parse_recipe(CHAIN), {"topic": "bees"})
    assert len(model.requests) == 4
    assert result.output == "notes"
    late = AgentExecutor(
        model=model, settings=RunSettings(step_cache=store.step_cache(clock=clock))
    )
    await late.execute(parse_recipe(CHAIN), {"topic": "bees"})
    assert len(model.requests) == 6
    await store.aclose()
