"""YAML recipes build into AgentRecipes with the same semantics as Python ones: tools by import
path, tool / analysis / loop / sub-recipe steps, routing, save_as, sequential mode, inputs
checked when a run starts, located build errors, and to_yaml / from_yaml round trips."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from minions import (
    AgentExecutor,
    AgentRecipe,
    AnalysisStep,
    DefaultStep,
    ExecutionConfig,
    LoopStep,
    MessageBundle,
    OutputInstructions,
    Prompt,
    StepStatus,
    ToolStep,
    Transition,
)
from minions.errors import InputError, RecipeError
from minions.events import StepStarted
from minions.recipes import dump_recipe, load_recipe, parse_recipe
from minions.testing import FunctionModel, ScriptedModel

TOOLS = '''
from minions import tool

@tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()

@tool
def numbers(n: int) -> list[int]:
    """The numbers 1..n."""
    return list(range(1, n + 1))
'''


def write(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    (folder / "tools.py").write_text(TOOLS)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def run(recipe: AgentRecipe, model: Any = None, **inputs: Any) -> Any:
    return AgentExecutor(model=model).execute_sync(recipe, inputs)


def test_tool_loop_analysis_and_agent_steps_run_from_yaml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: demo
        inputs:
          n: {type: integer, default: 3}
        tools: [tools]
        steps:
          - id: nums
            tool: numbers
            params: {n: "{{ inputs.n }}"}
            save_as: values
          - id: loud
            depends_on: [nums]
            loop: "{{ values }}"
            parallel: 2
            tool: shout
            params: {text: "item {{ loop.item }}"}
          - id: judge
            tool: llm_analyze
            depends_on: [loud]
            context: Which item is the last?
            input: "{{ loud.output }}"
            output_format: {last: ""}
          - id: tell
            depends_on: [judge]
            goal: "Say {{ judge.output.last }}."
        """,
    )
    recipe = load_recipe(path)
    assert isinstance(recipe.step("nums"), ToolStep)
    assert isinstance(recipe.step("loud"), LoopStep)
    assert isinstance(recipe.step("judge"), AnalysisStep)
    model = ScriptedModel(['{"last": "ITEM 3"}', "ITEM 3 it is."])
    result = run(recipe, model)
    assert result.ok, result.error
    assert result.step("nums").output == [1, 2, 3]
    assert result.step("loud").output == ["ITEM 1", "ITEM 2", "ITEM 3"]
    assert result.step("judge").output == {"last": "ITEM 3"}
    assert "Say ITEM 3." in str(model.requests[1])
    assert result.output == "ITEM 3 it is."
    # Inputs from a command line arrive as text and are converted to the declared type.
    again = run(recipe, ScriptedModel(['{"last": "ITEM 2"}', "ok"]), n="2")
    assert again.step("nums").output == [1, 2]


def test_an_empty_loop_completes_with_an_empty_result(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: empty
        tools: [tools]
        inputs: {n: {type: integer, default: 0}}
        steps:
          - {id: nums, tool: numbers, params: {n: "{{ inputs.n }}"}}
          - {id: loud, depends_on: [nums], loop: "{{ nums.output }}", tool: shout, params: {text: "{{ loop.item }}"}}
        """,
    )
    result = run(load_recipe(path))
    assert result.ok
    assert result.step("loud").output == []


def test_inputs_are_checked_when_a_run_starts(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: needs
        inputs:
          topic: {type: string}
          count: {type: integer, default: 1}
        steps:
          - {id: a, goal: "About {{ inputs.topic }}"}
        """,
    )
    recipe = load_recipe(path)
    model = ScriptedModel([])
    with pytest.raises(InputError) as missing:
        run(recipe, model)
    assert str(missing.value).startswith("invalid inputs (1 problem)")
    assert "input 'topic' is required" in str(missing.value)
    with pytest.raises(RecipeError) as wrong:
        run(recipe, model, topic="bees", count="many", extra=1)
    text = str(wrong.value)
    assert "count" in text
    assert "unknown input 'extra'" in text
    assert model.requests == []  # nothing ran
    # The same check without running: defaults filled in, text converted.
    assert recipe.check_inputs({"topic": "bees", "count": "3"}) == {"topic": "bees", "count": 3}
    assert recipe.check_inputs({"topic": "bees"}) == {"topic": "bees", "count": 1}
    with pytest.raises(InputError):
        recipe.check_inputs({})


def test_routing_and_sequential_mode(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: route
        execution_mode: sequential
        steps:
          - id: classify
            goal: Classify.
            output: {topic: ""}
            next:
              - {step: billing, when: "output.topic == 'billing'"}
              - {step: other}
          - {id: billing, goal: Bill.}
          - {id: other, goal: Other.}
          - {id: x, goal: X.}
          - {id: y, goal: "Y after {{ x.output }}."}
        """,
    )
    recipe = load_recipe(path)
    assert recipe.transitions == (
        Transition("classify", "billing", when="output.topic == 'billing'"),
        Transition("classify", "other"),
    )
    events: list[Any] = []

    async def answer(prompt: Prompt) -> str:
        # A few turns of the event loop, in which other steps would start if they could.
        for _ in range(3):
            await asyncio.sleep(0)
        return '{"topic": "billing"}' if prompt.step_id == "classify" else str(prompt.step_id)

    model = FunctionModel(answer)
    result = AgentExecutor(model=model).execute_sync(recipe, listeners=[events.append])
    assert result.ok
    assert result.step("other").status is StepStatus.SKIPPED
    assert result.step("billing").output == "billing"
    running = peak = 0
    for event in events:
        if isinstance(event, StepStarted):
            running += 1
            peak = max(peak, running)
        elif event.kind in ("step_completed", "step_failed"):
            running -= 1
    assert peak == 1  # sequential: one at a time
    started = [e.step_id for e in events if isinstance(e, StepStarted)]
    assert started == ["classify", "billing", "x", "y"]  # in file order
    assert "Y after x." in str(model.requests[-1])  # an earlier step, without depends_on
    assert yaml.safe_load(dump_recipe(recipe))["execution_mode"] == "sequential"


def test_a_sub_recipe_runs_as_one_step_and_its_usage_counts(tmp_path: Path) -> None:
    write(
        tmp_path,
        """
        id: inner
        inputs: {word: {type: string}}
        steps:
          - {id: echo, goal: "Repeat {{ inputs.word }}."}
        """,
        name="inner.yaml",
    )
    path = write(
        tmp_path,
        """
        id: outer
        steps:
          - {id: first, goal: Pick a word.}
          - id: nested
            depends_on: [first]
            recipe: inner.yaml
            inputs: {word: "{{ first.output }}"}
          - {id: last, depends_on: [nested], goal: "Use {{ nested.output }}."}
        """,
    )
    model = FunctionModel(lambda p: f"<{p.step_id}:{p.messages[-1].content[-12:]}>")
    result = run(load_recipe(path), model)
    assert result.ok, result.error
    nested = result.step("nested")
    assert [e.step_id for e in nested.items] == ["echo"]
    assert "Repeat <first:" in str(model.requests[1])
    assert len(nested.model_calls) == 1
    assert result.usage.calls == 3
    assert result.usage.total_tokens == sum(e.usage.total_tokens for e in result.executions)


def test_sub_recipes_that_include_each_other_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "id: a\nsteps:\n  - {id: s, recipe: b.yaml}\n", name="a.yaml")
    write(tmp_path, "id: b\nsteps:\n  - {id: s, recipe: a.yaml}\n", name="b.yaml")
    with pytest.raises(
        RecipeError, match=r"recipes include each other: a\.yaml -> b\.yaml -> a\.yaml"
    ):
        load_recipe(tmp_path / "a.yaml")


def test_build_errors_name_file_line_step_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: broken
        tools: [tools, nowhere.module, tools:missing]
        steps:
          - id: a
            goal: "Use {{ papres.output }}."
            tools: [shout, shoot]
          - {id: b, depends_on: [a, c], goal: B.}
        """,
    )
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    lines = str(caught.value)
    assert "cannot import tools from 'nowhere.module'" in lines
    assert "'tools' has no 'missing'" in lines
    assert "unknown tool 'shoot'" in lines
    assert "papres" in lines
    assert "'c'" in lines
    problems = caught.value.problems
    assert all(p.file and p.file.endswith("recipe.yaml") for p in problems)
    assert all(p.line for p in problems)
    by_step = {p.step for p in problems}
    assert {"a", "b"} <= by_step


def test_yaml_round_trips(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: trip
        description: A round trip.
        tools: [tools]
        steps:
          - {id: nums, tool: numbers, params: {n: 2}}
          - {id: loud, depends_on: [nums], loop: "{{ nums.output }}", tool: shout, params: {text: "{{ loop.item }}"}}
          - {id: say, depends_on: [loud], goal: "Say {{ loud.output }}.", output: {said: ""}}
        """,
    )
    recipe = load_recipe(path)
    text = dump_recipe(recipe)
    again = parse_recipe(text, base=tmp_path)
    assert dump_recipe(again) == text
    assert [s.id for s in again.steps] == ["nums", "loud", "say"]


def test_a_python_recipe_writes_yaml_with_the_same_semantics(tmp_path: Path) -> None:
    recipe = AgentRecipe(
        id="py",
        description="Built in Python.",
        config={"max_parallel_steps": 2},
        steps=[
            DefaultStep(
                "plan",
                MessageBundle(system="Be brief.", goal="Plan {{ inputs.topic }}."),
                output=OutputInstructions(
                    {"type": "object", "properties": {"ok": {"type": "boolean"}}}
                ),
            ),
            AnalysisStep(
                "check", input="{{ plan.output }}", output={"fine": True}, depends_on=["plan"]
            ),
            DefaultStep(
                "done",
                "Finish.",
                depends_on=["check"],
                mode="sync",
                timeout=5,
                # A field given at its default value is written too: it overrides the run's.
                config=ExecutionConfig(max_model_calls_per_step=3, max_tool_call_retries=2),
            ),
        ],
        transitions=[Transition("plan", "check", when="output.ok")],
        inputs={"topic": "bees"},
    )
    data = yaml.safe_load(dump_recipe(recipe))
    assert data["config"] == {"max_parallel_steps": 2}
    assert data["steps"][0]["system"] == "Be brief."
    assert data["steps"][0]["next"] == [{"step": "check", "when": "output.ok"}]
    assert data["steps"][1]["analyze"] == "Analyse the data."
    assert data["steps"][2]["mode"] == "sync"
    assert data["steps"][2]["config"] == {"max_model_calls_per_step": 3, "max_tool_call_retries": 2}
    assert "config" not in data["steps"][1]  # an analysis step's own default is not written
    loaded = parse_recipe(dump_recipe(recipe), base=tmp_path)

    def reply(prompt: Any) -> str:
        return {"plan": '{"ok": true}', "check": '{"fine": true}'}.get(prompt.step_id, "end")

    first = run(recipe, FunctionModel(reply))
    second = run(loaded, FunctionModel(reply))
    assert first.ok
    assert second.ok
    assert [(e.step_id, e.status, e.output) for e in first.executions] == [
        (e.step_id, e.status, e.output) for e in second.executions
    ]


def test_what_has_no_yaml_form_is_named() -> None:
    recipe = AgentRecipe(
        id="py",
        steps=[DefaultStep("a", "A.", model=ScriptedModel([])), DefaultStep("b", "B.")],
        transitions=[Transition("a", "b", when=lambda output: True)],
    )
    with pytest.raises(RecipeError) as caught:
        dump_recipe(recipe)
    text = str(caught.value)
    assert "model object has no YAML form" in text
    assert "Python callable" in text


def test_a_misspelled_tool_in_a_loop_is_reported_once_at_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: typo
        tools: [tools]
        steps:
          - id: loud
            loop: [a, b]
            tool: shuot
            params: {text: "{{ loop.item }}"}
        """,
    )
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    [problem] = caught.value.problems
    assert problem.field == "tool"
    assert problem.line == 7
    assert "did you mean 'shout'?" in problem.message
