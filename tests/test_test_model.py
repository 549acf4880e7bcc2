"""`TestModel`: a model that needs no script. It calls each offered tool once with arguments
valid for its schema, then answers with output valid for the step's schema."""

from __future__ import annotations

import json
from datetime import date
from typing import Annotated, Any, Literal
from uuid import UUID

import jsonschema
import pytest
from pydantic import BaseModel, Field

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    AnalysisStep,
    DefaultStep,
    LoopStep,
    OutputInstructions,
    StepExecutor,
    StepStatus,
    ToolStep,
    Transition,
    tool,
)
from minions.events import Event, TokenDelta
from minions.testing import TestModel
from minions.testing._schema_data import SchemaDataError, example_for


class Address(BaseModel):
    street: str
    postcode: str = Field(pattern=r"^\d{4}-[A-Z]{2}$")


class Expense(BaseModel):
    merchant: str = Field(min_length=3, max_length=12)
    amount_eur: float = Field(gt=0, multiple_of=0.5)
    currency: Literal["EUR", "USD"]
    day: date
    receipt: UUID
    tags: list[str]
    billed_to: Address | None = None
    extra: dict[str, int] = {}


seen: list[dict[str, Any]] = []


@tool
def convert(amount: float, currency: Literal["USD", "GBP"], when: date) -> float:
    """Convert an amount to euros."""
    seen.append({"amount": amount, "currency": currency, "when": when})
    return amount * 0.9


@tool
def lookup(address: Address, limit: int = 3) -> str:
    """Look up an address."""
    return f"{address.street} ({limit})"


def test_a_step_calls_each_tool_once_with_valid_arguments_then_gives_valid_output() -> None:
    seen.clear()
    model = TestModel()
    step = DefaultStep(
        "categorise",
        "Categorise the expense.",
        tools={"convert", "lookup"},
        output=OutputInstructions(Expense),
    )
    context = AgentContext(model=model, tools=[convert, lookup])
    execution = StepExecutor(step, context).execute_sync()
    assert execution.status is StepStatus.COMPLETED, execution.error
    assert isinstance(execution.output, Expense)
    assert execution.output.currency == "EUR"
    assert execution.output.amount_eur > 0
    # Each tool once, with arguments its own validation accepted.
    assert [call.name for call in execution.tool_calls] == ["convert", "lookup"]
    assert all(call.response is not None and call.response.ok for call in execution.tool_calls)
    assert seen == [{"amount": 0.0, "currency": "USD", "when": date(2024, 1, 1)}]
    # Recorded like ScriptedModel: the second request saw the tool results.
    first, second = model.requests
    assert [spec.name for spec in first.tools] == ["convert", "lookup"]
    assert [m.role for m in second.messages][-2:] == ["tool", "tool"]
    assert execution.model_calls[-1].output_mode == "tool"  # the request offered tools


@pytest.mark.parametrize("mode", ["json_schema", "tool", "prompted_json"])
def test_structured_output_in_each_mode(
    mode: Literal["json_schema", "tool", "prompted_json"],
) -> None:
    model = TestModel(output_mode=mode)
    step = DefaultStep("s", "Give an expense.", output=OutputInstructions(Expense))
    execution = StepExecutor(step, AgentContext(model=model)).execute_sync()
    assert isinstance(execution.output, Expense)
    [call] = execution.model_calls
    assert call.output_mode == mode
    assert call.response is not None
    if mode == "tool":
        assert [c.name for c in call.response.tool_calls] == ["Expense"]
    else:
        assert json.loads(call.response.text)["currency"] == "EUR"


def test_without_an_output_schema_it_answers_with_the_tool_results() -> None:
    context = AgentContext(model=TestModel(), tools=[lookup])
    execution = StepExecutor(DefaultStep("s", "Find it.", tools={"lookup"}), context).execute_sync()
    assert execution.output == '{"lookup": "a (0)"}'
    plain = StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=TestModel())).execute_sync()
    assert plain.output == "success (no tool calls)"
    custom = TestModel(custom_output_text="Done.")
    assert (
        StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=custom)).execute_sync().output
        == "Done."
    )


def test_call_tools_chooses_which_tools_are_called() -> None:
    seen.clear()
    only = TestModel(call_tools=["lookup"])
    context = AgentContext(model=only, tools=[convert, lookup])
    step = DefaultStep("s", "Go.", tools={"convert", "lookup"})
    assert [c.name for c in StepExecutor(step, context).execute_sync().tool_calls] == ["lookup"]
    none = TestModel(call_tools=[])
    execution = StepExecutor(step, AgentContext(model=none, tools=[convert, lookup])).execute_sync()
    assert execution.tool_calls == []
    assert execution.output == "success (no tool calls)"
    assert seen == []
    with pytest.raises(ValueError, match=r"call_tools must be 'all' or a list of tool names"):
        TestModel(call_tools="none")


def test_custom_output_args_are_sent_as_they_are() -> None:
    good = {
        "merchant": "ACME",
        "amount_eur": 12.5,
        "currency": "USD",
        "day": "2025-02-03",
        "receipt": str(UUID(int=7)),
        "tags": ["food"],
    }
    step = DefaultStep("s", "Give an expense.", output=OutputInstructions(Expense))
    execution = StepExecutor(
        step, AgentContext(model=TestModel(custom_output_args=good))
    ).execute_sync()
    assert isinstance(execution.output, Expense)
    assert execution.output.merchant == "ACME"
    # One the schema refuses makes the step re-ask, then fail, as a wrong answer would.
    bad = TestModel(custom_output_args={"merchant": "A"})
    failed = StepExecutor(step, AgentContext(model=bad)).execute_sync()
    assert failed.status is StepStatus.FAILED
    assert len(bad.requests) > 1
    assert "merchant" in (failed.error or "")


def test_a_schema_it_cannot_satisfy_is_a_clear_error_naming_it() -> None:
    impossible = OutputInstructions(
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 3}},
            "required": ["n"],
            "title": "Count",
        }
    )
    execution = StepExecutor(
        DefaultStep("count", "Count.", output=impossible), AgentContext(model=TestModel())
    ).execute_sync()
    assert execution.status is StepStatus.FAILED
    assert execution.error == (
        "TestModel cannot make up output 'Count' for step 'count': /n: no integer lies between 5 "
        "and 3; give it with TestModel(custom_output_args=...)"
    )

    @tool
    def hard(code: Annotated[str, Field(pattern=r"^a$", min_length=2)]) -> str:
        """A tool no made-up argument satisfies."""
        return code

    step = DefaultStep("s", "Go.", tools={"hard"})
    failed = StepExecutor(step, AgentContext(model=TestModel(), tools=[hard])).execute_sync()
    assert failed.error == (
        "TestModel cannot call tool 'hard' of step 's': the value made up, {'code': 'aa'}, is "
        "not valid: code: 'aa' does not match '^a$'; leave it out with call_tools=[...], or "
        "script the call with ScriptedModel"
    )


def test_a_recipe_with_every_kind_of_step_runs_and_a_model_choice_gets_a_candidate() -> None:
    @tool
    def list_items() -> list[dict[str, int]]:
        """List the items."""
        return [{"id": 1}, {"id": 2}]

    @tool
    def touch(id: int) -> str:
        """Touch one item."""
        return f"touched {id}"

    recipe = AgentRecipe(
        id="everything",
        steps=[
            ToolStep("mine", "list_items"),
            DefaultStep("weather", "Weather in {{ inputs.city }}?", tools={"convert"}),
            AnalysisStep(
                "decide",
                goal="Which to touch?",
                input="{{ mine.output }}",
                output={"ids": [0], "reasoning": ""},
                depends_on=["mine"],
            ),
            LoopStep(
                DefaultStep("update", "Touch {{ loop.item }}.", tools={"touch"}),
                "{{ decide.output.ids }}",
                depends_on=["decide"],
            ),
            DefaultStep(
                "review",
                "Review.",
                depends_on=["weather", "update"],
                output=OutputInstructions(Expense),
            ),
            DefaultStep("publish", "Publish.", description="when it is good"),
            DefaultStep("archive", "Archive.", description="when it is not"),
        ],
        transitions=[Transition("review", "publish"), Transition("review", "archive")],
    )
    model = TestModel()
    executor = AgentExecutor(model=model, tools=[list_items, touch, convert])
    result = executor.execute_sync(recipe, inputs={"city": "Oslo"})
    assert result.status is StepStatus.COMPLETED
    assert result.step("decide").output == {"ids": [0], "reasoning": "a"}
    assert result.step("update").output == ['{"touch": "touched 0"}']
    assert isinstance(result.step("review").output, Expense)
    # The model chose among the candidates' ids (the first), and the other was skipped.
    assert result.step("publish").status is StepStatus.COMPLETED
    assert result.step("archive").status is StepStatus.SKIPPED
    routing = [r for r in model.requests if r.scope.endswith("/route")]
    [choice] = routing
    assert choice.tools[0].parameters["properties"]["step"]["enum"] == ["publish", "archive"]


def test_it_completes_through_complete_step_when_offered_and_streams_text() -> None:
    events: list[Event] = []
    model = TestModel(custom_output_text="All done here.")
    context = AgentContext(model=model, listeners=[events.append])
    step = DefaultStep("s", "Go.", completion_tool=True)
    execution = StepExecutor(step, context).execute_sync()
    assert execution.output == "All done here."
    assert [c.name for c in execution.model_calls[0].response.tool_calls] == ["complete_step"]  # type: ignore[union-attr]
    streamed = StepExecutor(DefaultStep("t", "Go."), context).execute_sync()
    assert streamed.output == "All done here."
    text = "".join(e.text for e in events if isinstance(e, TokenDelta))
    assert text == "All done here."


# -- the values it makes up -------------------------------------------------------------------


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


SCHEMAS: list[dict[str, Any]] = [
    Expense.model_json_schema(),
    Tree.model_json_schema(),
    {"type": "array", "items": {"type": "integer"}, "minItems": 3, "uniqueItems": True},
    {"type": ["null", "string"], "format": "email"},
    {"type": "string", "format": "date-time"},
    {"oneOf": [{"type": "null"}, {"type": "integer", "exclusiveMinimum": 10}]},
    {
        "allOf": [
            {"properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"const": 3}}, "required": ["b"]},
        ]
    },
    {"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 2},
    {"type": "array", "prefixItems": [{"type": "string"}, {"enum": [7]}], "items": False},
    {"type": "string", "pattern": r"^[A-Z]{3}-\d{2,}(x|y)?$", "maxLength": 8},
    {"type": "number", "minimum": -5, "maximum": -2, "multipleOf": 0.5},
    {},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_made_up_values_are_valid_and_the_same_every_time(schema: dict[str, Any]) -> None:
    value = example_for(schema)
    jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    ).validate(value)
    assert example_for(schema) == value


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (False, "the top level: the schema is `false` (no value)"),
        ({"enum": []}, "the top level: the enum is empty"),
        (
            {"properties": {"a": {"$ref": "#/$defs/Nope"}}},
            "/a: the $ref '#/$defs/Nope' points at nothing",
        ),
        (
            {"type": "object", "properties": {"a": {"not": {}}}, "required": ["a"]},
            "is not valid: a:",
        ),
    ],
)
def test_schemas_no_value_satisfies_are_named(schema: Any, problem: str) -> None:
    with pytest.raises(SchemaDataError) as raised:
        example_for(schema)
    assert problem in str(raised.value)


def test_a_loop_back_chosen_by_the_model_runs_again_then_ends() -> None:
    recipe = AgentRecipe(
        id="drafts",
        steps=[
            DefaultStep("draft", "Draft.", max_visits=3),
            DefaultStep("review", "Review.", depends_on=["draft"]),
            DefaultStep("publish", "Publish."),
        ],
        transitions=[Transition("review", "draft"), Transition("review", "publish")],
    )
    result = AgentExecutor(model=TestModel()).execute_sync(recipe)
    assert result.status is StepStatus.COMPLETED, result.error
    assert [e.step_id for e in result.executions] == [
        "draft", "review", "draft", "review", "publish"
    ]  # fmt: skip
