"""Recipes are validated before anything runs: every problem collected, each naming its step
and field; and the graph exports Mermaid."""

from __future__ import annotations

from typing import Any

import pytest
from agent_helpers import step

from minions import (
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    LoopStep,
    MessageBundle,
    RecipeError,
    StepGraph,
    ToolRegistry,
    Transition,
    recipe_problems,
    tool,
)
from minions.errors import Problem
from minions.testing import ScriptedModel


def problems(
    recipe: AgentRecipe, tools: ToolRegistry | None = None
) -> list[tuple[str | None, str | None, str]]:
    return [(p.step, p.field, p.message) for p in recipe_problems(recipe, tools)]


def plain(step_id: str, goal: str = "Do it.", **options: Any) -> DefaultStep:
    return DefaultStep(step_id, goal, **options)


def test_a_valid_recipe_has_no_problems() -> None:
    recipe = AgentRecipe(
        id="ok",
        steps=[
            plain("a", "About {{ inputs.topic }}."),
            plain("b", "{{ a.output }}", depends_on=["a"]),
        ],
    )
    assert recipe_problems(recipe) == []
    graph = StepGraph(recipe)
    assert graph.order == ("a", "b")
    assert graph.dependents["a"] == ("b",)


def test_all_problems_are_collected_each_naming_step_and_field() -> None:
    recipe = AgentRecipe(
        id="bad",
        steps=[
            plain("wiki"),
            plain("wiki"),
            plain("papers", depends_on=["wikki"]),
            plain("report", "Use {{ papres.output }} and {{ inputs.anything }}.", tools=["search"]),
        ],
        transitions=[Transition("report", "nowhere"), Transition("nobody", "report")],
    )
    with pytest.raises(RecipeError) as caught:
        AgentExecutor().graph(recipe)
    found = [(p.step, p.field) for p in caught.value.problems]
    assert found == [
        ("wiki", "id"),
        ("report", "tools"),
        ("papers", "depends_on"),
        ("report", "transitions"),
        ("nobody", "transitions"),
        ("report", "goal"),
    ]
    text = str(caught.value)
    assert "invalid recipe (6 problems)" in text
    assert "duplicate step id" in text
    assert "unknown tool 'search'" in text
    assert "unknown step 'wikki' (did you mean 'wiki'?)" in text
    assert "unknown step 'nowhere'" in text
    assert "{{ papres.output }} refers to 'papres'" in text
    assert "did you mean 'papers'?" in text
    assert "inputs.anything" not in text  # any input name is fine


def test_a_cycle_in_depends_on_shows_its_path() -> None:
    recipe = AgentRecipe(
        id="cycle",
        steps=[
            plain("start"),
            plain("a", depends_on=["start", "c"]),
            plain("b", depends_on=["a"]),
            plain("c", depends_on=["b"]),
        ],
    )
    assert problems(recipe) == [
        (
            "a",
            "depends_on",
            "depends_on forms a cycle: a -> c -> b -> a (each step waits for the next)",
        )
    ]


def test_self_dependency_and_repeated_dependency() -> None:
    recipe = AgentRecipe(id="self", steps=[plain("a", depends_on=["a"]), plain("b")])
    assert problems(recipe) == [("a", "depends_on", "a step cannot depend on itself")]
    twice = AgentRecipe(id="twice", steps=[plain("a"), plain("b", depends_on=["a", "a"])])
    assert problems(twice) == [("b", "depends_on", "lists a step more than once")]


def test_a_loop_without_a_way_out_is_refused() -> None:
    recipe = AgentRecipe(
        id="forever",
        steps=[plain("draft"), plain("review", depends_on=["draft"])],
        transitions=[Transition("review", "draft")],
    )
    [(step_id, field, message)] = problems(recipe)
    assert (step_id, field) == ("review", "transitions")
    assert "the loop review -> draft has no condition and no other way out" in message


@pytest.mark.parametrize(
    "transitions",
    [
        [Transition("review", "draft", when="output.approved == `false`")],
        [Transition("review", "draft"), Transition("review", "publish")],  # a choice
        [Transition("review", "draft", when=lambda output: "no" in output)],
    ],
)
def test_a_loop_with_a_condition_or_a_choice_is_fine(transitions: list[Transition]) -> None:
    recipe = AgentRecipe(
        id="loop",
        steps=[plain("draft"), plain("review", depends_on=["draft"]), plain("publish")],
        transitions=transitions,
    )
    assert problems(recipe) == []
    assert StepGraph(recipe).loops == {("review", "draft")}


def test_conditions_are_checked() -> None:
    recipe = AgentRecipe(
        id="conditions",
        steps=[plain("a"), plain("b"), plain("c")],
        transitions=[
            Transition("a", "b", when="output.[oops"),
            Transition("a", "c", when="outptu.ok"),
            Transition("b", "c", when=42),  # type: ignore[arg-type]
        ],
    )
    found = problems(recipe)
    assert [(s, f) for s, f, _ in found] == [("a", "transitions")] * 2 + [("b", "transitions")]
    assert "invalid template expression" in found[0][2]
    assert "refers to 'outptu'" in found[1][2]
    assert "did you mean 'output'?" in found[1][2]
    assert "must be a string or a callable, not int" in found[2][2]


def test_conditions_may_read_the_run_state() -> None:
    recipe = AgentRecipe(
        id="state",
        steps=[plain("a"), plain("b"), plain("c")],
        transitions=[
            Transition("a", "b", when="inputs.go && status == 'completed' && visit < `3`")
        ],
    )
    assert problems(recipe) == []


def test_templates_in_system_prompts_and_step_order() -> None:
    recipe = AgentRecipe(
        id="order",
        steps=[
            DefaultStep(
                "a", MessageBundle(system="You are {{ inputs.role }} {{ b.output }}.", goal="Go.")
            ),
            DefaultStep("b", "Use {{ a.output }}.", depends_on=["a"]),
            DefaultStep("c", "Also {{ a.output }} and {{ c.output }}."),
        ],
    )
    found = problems(recipe)
    assert [(s, f) for s, f, _ in found] == [("a", "system"), ("c", "goal"), ("c", "goal")]
    assert "refers to step 'b', which never runs before 'a'; add 'b' to depends_on" in found[0][2]
    assert "refers to step 'a', which never runs before 'c'" in found[1][2]
    assert "refers to its own result" in found[2][2]


def test_a_loop_step_may_use_loop_and_aliases_are_names() -> None:
    body = DefaultStep("each", "Handle {{ loop.item }} for {{ since }}.")
    recipe = AgentRecipe(
        id="loops",
        steps=[
            plain("now"),
            LoopStep(body, "{{ inputs.items }}", depends_on=["now"]),
            plain("other", "{{ loop.item }}"),
        ],
        aliases={"since": "now"},
    )
    found = problems(recipe)
    assert [(s, f) for s, f, _ in found] == [("other", "goal")]
    bad = AgentRecipe(
        id="aliases",
        steps=[plain("a")],
        aliases={"a": "a", "x": "nope"},
        output_step="zzz",
    )
    assert [(s, f) for s, f, _ in problems(bad)] == [
        (None, "aliases"),
        (None, "aliases"),
        (None, "output_step"),
    ]


def test_step_definition_problems_name_their_field() -> None:
    recipe = AgentRecipe(
        id="defs",
        steps=[plain("a", mode="parallel", timeout=0, max_visits=0), plain("9lives")],
    )
    fields = [(s, f) for s, f, _ in problems(recipe)]
    assert fields == [("a", "mode"), ("a", "timeout"), ("a", "max_visits"), ("9lives", "id")]


def test_tools_are_checked_against_the_executor_and_recipe_tools() -> None:
    @tool
    def search(query: str) -> str:
        """Search."""
        return query

    recipe = AgentRecipe(id="tools", steps=[plain("a", tools=["search"])])
    with pytest.raises(RecipeError, match="unknown tool 'search'"):
        AgentExecutor().graph(recipe)
    assert AgentExecutor(tools=[search]).graph(recipe).steps["a"].id == "a"
    with_tools = AgentRecipe(id="tools", steps=[plain("a", tools=["search"])], tools=[search])
    assert AgentExecutor().graph(with_tools).tools is not None
    assert recipe_problems(recipe) == []  # without a registry, tool names are not checked


async def test_nothing_runs_when_a_recipe_is_invalid() -> None:
    model = ScriptedModel(["never"])
    recipe = AgentRecipe(
        id="invalid", steps=[DefaultStep("a", "Go.", model=model), plain("b", depends_on=["x"])]
    )
    with pytest.raises(RecipeError):
        await AgentExecutor().execute(recipe)
    assert model.requests == []


def test_problems_print_with_step_and_field() -> None:
    problem = Problem(message="unknown step 'x'", step="b", field="depends_on")
    assert str(problem) == "recipe: step 'b', field 'depends_on': unknown step 'x'"


def test_mermaid_shows_dependencies_transitions_conditions_and_modes() -> None:
    recipe = AgentRecipe(
        id="chart",
        steps=[
            plain("draft"),
            plain("review", depends_on=["draft"], mode="sync"),
            plain("publish"),
            plain("notify", depends_on=["review"], mode="fire_and_forget", optional=True),
            plain("end", depends_on=["publish"]),
        ],
        transitions=[
            Transition("review", "draft", when="output.verdict == 'rework'"),
            Transition("review", "publish", description='approved: "ok"'),
        ],
    )
    chart = StepGraph(recipe).to_mermaid()
    assert chart.splitlines()[0] == "flowchart TD"
    assert '    draft["draft"]' in chart
    assert '    review[["review<br/><i>sync</i>"]]' in chart
    assert '    notify>"notify<br/><i>fire_and_forget</i><br/><i>optional</i>"]' in chart
    assert '    end_["end"]' in chart  # `end` is a Mermaid keyword
    assert "    draft --> review" in chart
    assert "    review --> notify" in chart
    assert "    review -.->|\"loop: output.verdict == 'rework'\"| draft" in chart
    assert '    review -.->|"approved: #quot;ok#quot;"| publish' in chart
    assert "    publish --> end_" in chart
    assert "class review sync" in chart
    assert "class notify fireandforget" in chart


def test_recipe_is_data() -> None:
    steps = [step("a")]
    recipe = AgentRecipe(id="data", steps=steps, inputs={"k": 1})
    steps.append(step("b"))
    assert [s.id for s in recipe.steps] == ["a"]
    assert recipe.step("a") is steps[0]
    with pytest.raises(KeyError):
        recipe.step("b")
    assert repr(recipe) == "AgentRecipe('data', steps=['a'])"
    assert str(Transition("a", "b", when="output.ok")) == "a -> b when output.ok"
