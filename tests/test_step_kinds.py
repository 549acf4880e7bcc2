"""Tool steps, analysis steps and loop steps; every step's `kind` and `uses_model`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conftest import FAST, Lookup, Offline, add

from minions import (
    AgentContext,
    AgentRecipe,
    Message,
    Prompt,
    StepDefinitionError,
    StepExecution,
    StepExecutor,
    StepRun,
    StepStatus,
    tool,
)
from minions._kinds.analysis import AnalysisStep
from minions._kinds.example import schema_from_example
from minions._kinds.loop import LoopStep
from minions._kinds.tool import ToolStep
from minions._step.agent import DefaultStep
from minions._step.step import Step, StepInput
from minions.recipes._subrecipe import RecipeStep
from minions.testing import FunctionModel, ScriptedModel

STATE = {"inputs": {"a": 2, "items": [3, 1, 2], "word": "x"}, "prev": {"output": {"b": 5}}}


def run(
    step: Any, model: Any = None, tools: list[Any] | None = None, **context: Any
) -> StepExecution:
    ctx = AgentContext(
        model=model or ScriptedModel([]), tools=tools or [add], config=FAST, **context
    )
    return asyncio.run(StepExecutor(step, ctx, state=STATE).execute())


def test_tool_step_calls_the_tool_with_rendered_params() -> None:
    model = ScriptedModel([])
    execution = run(
        ToolStep("sum", "add", {"a": "{{ inputs.a }}", "b": "{{ prev.output.b }}"}), model
    )
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == 7
    assert execution.tool_calls[0].arguments == {"a": 2, "b": 5}
    assert model.requests == []


def test_tool_step_fails_on_a_missing_value_naming_it() -> None:
    execution = run(ToolStep("sum", "add", {"a": "{{ inputs.a }}", "b": "{{ inputs.b }}"}))
    assert execution.status is StepStatus.FAILED
    assert (execution.error or "").startswith(
        "step 'sum', parameter 'b': template {{ inputs.b }} has no value"
    )


def test_tool_step_fails_when_the_tool_fails() -> None:
    # A rendered value of the wrong type is known only at run time: the step fails.
    execution = run(ToolStep("sum", "add", {"a": 1, "b": "{{ inputs.word }}"}))
    assert execution.status is StepStatus.FAILED
    assert (execution.error or "").startswith("step 'sum': Invalid arguments for tool 'add'")


def test_literal_tool_step_params_are_checked_before_anything_runs() -> None:
    with pytest.raises(StepDefinitionError) as raised:
        run(ToolStep("sum", "add", {"a": 1, "b": "x", "c": "{{ inputs.a }}"}))
    assert raised.value.problems == [
        "step 'sum': parameter 'b' of tool 'add': Input should be a valid integer, unable to "
        "parse string as an integer (got 'x')",
        "step 'sum': tool 'add' has no parameter 'c'; its parameters: a, b",
    ]


def test_fill_missing_asks_the_model_for_just_those_parameters() -> None:
    def extract(prompt: Prompt) -> str:
        schema = prompt.output.json_schema() if prompt.output else {}
        assert list(schema["properties"]) == ["b"]
        assert "Add the apples from the note: 4 apples" in prompt.messages[-1].content
        return '{"b": 4}'

    step = ToolStep(
        "sum",
        "add",
        {"a": "{{ inputs.a }}", "b": "{{ inputs.apples }}"},
        fill_missing="model",
        description="Add the apples from the note: 4 apples",
    )
    model = FunctionModel(extract)
    execution = run(step, model)
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == 6
    assert len(model.requests) == 1
    assert execution.usage.calls == 1


def test_fill_missing_results_are_validated_against_the_tool() -> None:
    step = ToolStep("sum", "add", {"a": 1, "b": "{{ inputs.nope }}"}, fill_missing="model")
    model = ScriptedModel(['{"b": "lots"}'] * 3)
    execution = run(step, model)
    assert execution.status is StepStatus.FAILED
    assert "could not fill the missing parameters b" in (execution.error or "")
    assert "'lots' is not of type 'integer'" in (execution.error or "")  # the tool's schema
    assert execution.tool_calls == []  # the tool was never called with a bad value
    assert len(model.requests) == 3


def test_schema_from_example() -> None:
    assert schema_from_example({"ids": [], "reasoning": "", "score": 0.5, "n": 1, "ok": True}) == {
        "type": "object",
        "properties": {
            "ids": {"type": "array"},
            "reasoning": {"type": "string"},
            "score": {"type": "number"},
            "n": {"type": "integer"},
            "ok": {"type": "boolean"},
        },
        "required": ["ids", "reasoning", "score", "n", "ok"],
    }
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    assert schema_from_example(schema) == schema
    assert schema_from_example({"type": "", "name": ""})["properties"]["type"] == {"type": "string"}


def test_analysis_step_makes_one_structured_call_over_its_input() -> None:
    model = ScriptedModel(['{"ids": [3], "reasoning": "3 is biggest"}'])
    step = AnalysisStep(
        "pick",
        input="{{ inputs.items }}",
        output={"ids": [], "reasoning": ""},
        goal="Pick the biggest number.",
    )
    execution = run(step, model)
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == {"ids": [3], "reasoning": "3 is biggest"}
    prompt = model.requests[0].messages[-1].content
    assert prompt.startswith("Pick the biggest number.\n\nThe data:\n```json\n[\n 3,")
    assert model.requests[0].output is not None
    assert execution.turns == 1


def test_analysis_step_reasks_invalid_output_once_per_note() -> None:
    model = ScriptedModel(['{"ids": "3"}', '{"ids": [3], "reasoning": "r"}'])
    step = AnalysisStep("pick", input=[1], output={"ids": [0], "reasoning": ""})
    execution = run(step, model)
    assert execution.status is StepStatus.COMPLETED
    assert "ids: '3' is not of type 'array'" in model.requests[1].messages[-1].content


def test_loop_collects_outputs_in_item_order_with_bounded_parallelism() -> None:
    running = 0
    peak = 0

    @tool
    async def slow_double(n: int) -> int:
        """Double n, slowly for small n."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)  # let the other item of the pair start: no clock involved
        running -= 1
        return n * 2

    body = ToolStep("double", "slow_double", {"n": "{{ loop.item }}"})
    events: list[Any] = []
    loop = LoopStep(body, "{{ inputs.items }}", parallel=2)
    execution = run(loop, tools=[slow_double], listeners=[events.append])
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == [6, 2, 4]
    assert peak == 2
    assert [item.step_id for item in execution.items] == ["double[0]", "double[1]", "double[2]"]
    assert len(execution.tool_calls) == 3
    started = [e.step_id for e in events if e.kind == "step_started"]
    assert started[0] == "double"
    assert sorted(started[1:]) == ["double[0]", "double[1]", "double[2]"]


def test_loop_index_and_sequential_order() -> None:
    seen: list[str] = []

    def reply(prompt: Prompt) -> str:
        seen.append(prompt.messages[-1].content)
        return "ok"

    body = DefaultStep("say", "Item {{ loop.index }} is {{ loop.item }}.")
    execution = run(LoopStep(body, ["x", "y"]), FunctionModel(reply))
    assert execution.output == ["ok", "ok"]
    assert seen == ["Item 0 is x.", "Item 1 is y."]


class _Adding(Step):
    """A kind of its own: adds the loop item to itself through a tool, and reports what its
    `StepRun` says about the execution."""

    def tool_names(self) -> frozenset[str]:
        return frozenset({"add"})

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []

    async def run(self, run: StepRun) -> None:
        n = run.state["loop"]["item"]
        response = await run.call_tool("add", {"a": n, "b": n})
        run.complete(
            {
                "sum": response.result,
                "step": run.step.id,
                "item": run.item,
                "name": run.name,
                "calls": [call.name for call in run.execution.tool_calls],
            }
        )


def test_a_kind_of_its_own_sees_its_step_item_and_execution() -> None:
    execution = run(LoopStep(_Adding("adding"), [3, 4]))
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == [
        {"sum": 6, "step": "adding", "item": 0, "name": "adding[0]", "calls": ["add"]},
        {"sum": 8, "step": "adding", "item": 1, "name": "adding[1]", "calls": ["add"]},
    ]
    assert [call.name for call in execution.tool_calls] == ["add", "add"]


def test_empty_loop_completes_with_an_empty_result() -> None:
    execution = run(LoopStep(ToolStep("double", "add", {"a": 1, "b": 1}), []))
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == []


def test_loop_item_failures_are_recorded() -> None:
    body = ToolStep("sum", "add", {"a": "{{ loop.item }}", "b": 1})
    failed = run(LoopStep(body, [1, "x", 2, "y"]))
    assert failed.status is StepStatus.FAILED
    # Each item named once: not "sum[1]: step 'sum': ...".
    assert (failed.error or "").startswith("2 of 4 loop items failed: sum[1]: Invalid arguments")
    assert [i.status for i in failed.items] == [
        StepStatus.COMPLETED,
        StepStatus.FAILED,
        StepStatus.COMPLETED,
        StepStatus.FAILED,
    ]
    tolerant = run(LoopStep(body, [1, "x", 2], continue_on_error=True))
    assert tolerant.status is StepStatus.COMPLETED
    assert tolerant.output == [2, None, 3]


def test_loop_over_something_else_than_a_list_fails_clearly() -> None:
    execution = run(LoopStep(ToolStep("sum", "add", {"a": 1, "b": 1}), "{{ inputs.a }}"))
    assert execution.error == "step 'sum': loop needs a list, but '{{ inputs.a }}' gave int"


def test_loop_items_have_their_own_replay_scopes() -> None:
    model = ScriptedModel(["a", "b"])
    run(LoopStep(DefaultStep("say", "Say {{ loop.item }}."), [1, 2]), model)
    assert [p.scope for p in model.requests] == ["say#1[0]", "say#1[1]"]
    assert json.dumps([p.step_id for p in model.requests]) == '["say", "say"]'


def test_analysis_data_from_a_dependency_is_shown_once_and_text_is_not_called_json() -> None:
    from minions import AgentExecutor, AgentRecipe

    analysis_model = ScriptedModel(['{"words": 2}'])
    recipe = AgentRecipe(
        id="a",
        steps=[
            DefaultStep("src", "Fetch.", model=ScriptedModel(["DOC TEXT"])),
            DefaultStep("other", "Other.", model=ScriptedModel(["OTHER RESULT"])),
            AnalysisStep(
                "count",
                input="{{ src.output }}",
                output={"words": 0},
                goal="Count the words.",
                depends_on=["src", "other"],
                model=analysis_model,
            ),
        ],
    )
    result = AgentExecutor().execute_sync(recipe)
    assert result.ok, result.error
    prompt = analysis_model.requests[0].messages[-1].content
    assert prompt.count("DOC TEXT") == 1
    assert "The data:\n```\nDOC TEXT\n```" in prompt
    assert "[other]\nOTHER RESULT" in prompt
    assert prompt.index("Task: Count the words.") < prompt.index("The data:")


def test_steps_say_their_kind_and_whether_they_may_call_their_model() -> None:
    agent = DefaultStep("a", "Say hi.")
    named = DefaultStep("n", "Say hi.", model="openai:gpt-4o")
    tool = ToolStep("t", "add", {"a": 1, "b": 2})
    cases: list[tuple[Step, str, bool]] = [
        (agent, "agent", True),
        (named, "agent", True),
        (AnalysisStep("an", input="x", output={"ok": True}), "analysis", True),
        (tool, "tool", False),
        (ToolStep("f", "add", fill_missing="model"), "tool", True),
        (LoopStep(agent, [1]), "loop", True),
        # A body naming its own model does not call the one the loop is given.
        (LoopStep(named, [1]), "loop", False),
        (LoopStep(tool, [1]), "loop", False),
        (RecipeStep("r", AgentRecipe(id="inner", steps=[agent])), "recipe", True),
        (RecipeStep("r", AgentRecipe(id="inner", steps=[agent], model="x:y")), "recipe", False),
        (RecipeStep("r", AgentRecipe(id="inner", steps=[named, tool])), "recipe", False),
        (Lookup("l"), "custom", True),
        (Offline("o"), "offline", False),
    ]
    assert [(s.kind, s.uses_model()) for s, _, _ in cases] == [(k, u) for _, k, u in cases]
