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


# -- the key names its world -------------------------------------------------------------------


def _look_here(word: str) -> str:
    """Look a word up."""
    return word.upper()


def _look_elsewhere(word: str) -> str:
    """Look a word up."""
    return "the other's " + word


async def hits(executor: AgentExecutor, made: AgentRecipe) -> bool:
    _, events = await run(executor, made)
    return bool([e for e in events if isinstance(e, StepCached)])


async def test_a_step_alike_in_another_recipe_or_version_misses() -> None:
    """Two recipes with the same step (prompt, model, tools, schema) share no entry, nor do
    two versions of a YAML recipe; the same recipe again hits."""
    model = answering()
    executor = AgentExecutor(model=model)
    one = AgentRecipe(id="one", steps=[DefaultStep("sum", "sum up {{ inputs.topic }}", cache=True)])
    two = AgentRecipe(id="two", steps=[DefaultStep("sum", "sum up {{ inputs.topic }}", cache=True)])
    assert not await hits(executor, one)
    assert not await hits(executor, two)
    assert await hits(executor, one)
    text = "id: versioned\ninputs: {topic: {type: string}}\nsteps:\n  - {id: sum, goal: 'sum up {{ inputs.topic }}', cache: true}\n"
    assert not await hits(executor, parse_recipe(text))
    assert await hits(executor, parse_recipe(text))
    other = text + "  - {id: more, depends_on: [sum], goal: more}\n"
    assert not await hits(executor, parse_recipe(other))  # a new version of the recipe


async def test_a_step_whose_file_tools_see_another_folder_misses(tmp_path: Path) -> None:
    """The same recipe with its file tools in two workspaces: the second is never answered
    with what the first read (one recipe's private file, the other's answer)."""
    from minions.tools import file_tools

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "secret.txt").write_text(f"secret of {name}")

    async def reader(prompt: Prompt) -> str:
        return "read it"

    model = FunctionModel(reader, name="answers")
    shared = InMemoryStepCache()
    made = recipe(tools=["read_file", "list_files"])
    first = AgentExecutor(
        settings=RunSettings(model=model, step_cache=shared), tools=file_tools(tmp_path / "a")
    )
    second = AgentExecutor(
        settings=RunSettings(model=model, step_cache=shared), tools=file_tools(tmp_path / "b")
    )
    assert not await hits(first, made)
    assert not await hits(second, made)
    assert await hits(first, made)
    assert len(shared) == 2


async def test_a_tool_of_the_same_name_and_schema_from_elsewhere_misses() -> None:
    """Two tools alike to the model (name, description, parameters) but of other functions
    (modules, MCP servers): the key tells them apart."""
    from minions import Tool

    model = answering()
    shared = InMemoryStepCache()
    made = recipe(tools=["look"])
    here = Tool(_look_here, name="look", side_effects=False)
    elsewhere = Tool(_look_elsewhere, name="look", side_effects=False)
    assert here.spec == elsewhere.spec
    for tools, hit in (([here], False), ([elsewhere], False), ([here], True)):
        executor = AgentExecutor(settings=RunSettings(model=model, step_cache=shared), tools=tools)
        assert await hits(executor, made) is hit


def test_the_world_names_the_mcp_server_and_the_model_endpoint() -> None:
    """A tool of an MCP server is told apart by the server that serves it (two servers of
    the same name elsewhere), and a model by its endpoint."""
    from minions import Message, Tool
    from minions._step.cache import cache_key, cache_world
    from minions.models import OpenAIChatModel
    from minions.tools import MCPHttpServer, MCPStdioServer

    remote = Tool(_look_here, name="files_look", side_effects=False)
    remote.origin = ("files", "look")
    worlds = [
        cache_world({"id": "r"}, [remote], {"files": server})
        for server in (
            MCPHttpServer(url="http://127.0.0.1:1/mcp"),
            MCPHttpServer(url="http://127.0.0.1:2/mcp"),
            MCPStdioServer(command="files-server"),
        )
    ]
    assert len({repr(w) for w in worlds}) == 3

    def key(base_url: str) -> str:
        model = OpenAIChatModel("same", base_url=base_url, api_key="k")
        return cache_key(
            messages=[Message.user("hi")], model=model, tools=[], output=None, world=worlds[0]
        )

    assert key("http://127.0.0.1:1/v1") != key("http://127.0.0.1:2/v1")
    assert key("http://127.0.0.1:1/v1") == key("http://127.0.0.1:1/v1")


async def durable_run(tmp_path: Path, url: str) -> tuple[RunStore, FunctionModel, Path, str]:
    """A store, a model answering "notes", and a completed durable run of CHAIN (its recipe
    file and id)."""
    path = tmp_path / "cached.yaml"
    path.write_text(CHAIN)
    store = RunStore(url, create=True)
    model = FunctionModel(lambda prompt: "notes", name="answers")
    run_id, _ = await store.submit(path, {"topic": "bees"})
    await run_here(url, run_id, model=model)
    return store, model, path, run_id


async def test_entries_belong_to_their_run_pruned_with_it_listed_and_cleared(
    tmp_path: Path, url: str
) -> None:
    """A durable run's entries name its run and recipe; pruning the run deletes them (the
    next run calls its model again); `cache_entries` lists them by recipe, `clear_cache`
    empties one recipe's part or all."""
    store, model, path, first = await durable_run(tmp_path, url)
    [listed] = await store.cache_entries()
    entry = listed.step
    assert (entry.step_id, entry.run_id, entry.recipe_id) == ("research", first, "durable-cache")
    assert await store.cache_entries(recipe="other") == []
    assert await store.count_cache_entries(recipe="durable-cache") == 1
    assert (await store.prune(0)).runs == 1
    assert await store.cache_entries() == []
    second, _ = await store.submit(path, {"topic": "bees"})
    await run_here(url, second, model=model)
    assert len(model.requests) == 4  # nothing answered from the pruned run's entry
    assert await store.clear_cache(recipe="other") == 0
    assert await store.clear_cache(recipe="durable-cache") == 1
    assert await store.cache_entries() == []
    await store.aclose()


async def test_a_rerun_runs_its_steps_again_unless_it_asks_for_the_cache(
    tmp_path: Path, url: str
) -> None:
    """A rerun from a cached step runs it (a model call, no `step_cached`), refreshing its
    entry; asked for (`cache=True`, said in the plan), it answers from the cache."""
    store, model, _, parent = await durable_run(tmp_path, url)
    assert len(model.requests) == 2
    plan = await store.rerun(parent, from_step="research")
    assert plan.cache is False
    await run_here(url, plan.run_id, model=model)
    assert len(model.requests) == 4  # research and write, both again
    assert not [e for e in await store.events(plan.run_id) if isinstance(e, StepCached)]
    [listed] = await store.cache_entries()
    entry = listed.step
    assert entry.run_id == plan.run_id  # refreshed by the rerun
    asked = await store.rerun(parent, from_step="research", cache=True)
    assert asked.cache is True
    await run_here(url, asked.run_id, model=model)
    assert len(model.requests) == 5  # only write
    [cached] = [e for e in await store.events(asked.run_id) if isinstance(e, StepCached)]
    assert cached.step_id == "research"
    await store.aclose()


async def test_a_schema_3_store_drops_its_world_less_entries(tmp_path: Path) -> None:
    """Entries of schema 3 had keys without their world: the migration drops them."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'old.db'}"
    RunStore(url, create=True).close()
    with sqlite3.connect(tmp_path / "old.db") as db:
        for column in ("run_id", "recipe_id"):
            db.execute(f"DROP INDEX ix_minions_step_cache_{column}")
            db.execute(f"ALTER TABLE minions_step_cache DROP COLUMN {column}")
        db.execute("INSERT INTO minions_step_cache VALUES ('k', 'sum', '\"old\"', NULL, '{}', 1.0)")
        db.execute("UPDATE minions_meta SET value = '3' WHERE key = 'schema_version'")
    store = RunStore(url)
    assert await store.cache_entries() == []
    await store.aclose()


async def test_the_cli_lists_and_clears_the_cache(tmp_path: Path) -> None:
    import json

    from runs_helpers import minions

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    path = tmp_path / "cached.yaml"
    path.write_text(CHAIN)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(path, {"topic": "bees"})
    await run_here(url, run_id, model=FunctionModel(lambda prompt: "notes", name="answers"))
    await store.aclose()
    listed = minions("cache", "list", "--json", "--database-url", url)
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert (entry["step_id"], entry["run_id"], entry["recipe_id"]) == (
        "research",
        run_id,
        "durable-cache",
    )
    table = minions("cache", "list", "--database-url", url)
    assert "research" in table.stdout
    assert run_id in table.stdout
    none = minions("cache", "list", "--recipe", "nope", "--database-url", url)
    assert "no cached step of recipe nope" in none.stderr
    bad = minions("cache", "list", "--limit", "0", "--database-url", url)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    cleared = minions("cache", "clear", "--recipe", "durable-cache", "--database-url", url)
    assert "cleared 1 cached step of recipe durable-cache" in cleared.stderr
    assert json.loads(minions("cache", "list", "--json", "--database-url", url).stdout) == []
