"""OutputInstructions: structured output from pydantic models and raw JSON Schemas."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import FAST
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from minions import (
    AgentContext,
    DefaultStep,
    ModelCallResponse,
    OutputInstructions,
    OutputValidationError,
    StepDefinitionError,
    StepExecution,
    StepExecutor,
    StepStatus,
    Usage,
)
from minions._messages import Message
from minions._output import extract_json
from minions.testing import ScriptedModel


class City(BaseModel):
    name: str
    population: int


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name"],
    "title": "Place",
}


def run(output: OutputInstructions, *replies: Any) -> tuple[StepExecution, ScriptedModel]:
    model = ScriptedModel(list(replies))
    step = DefaultStep("s", "Describe a city.", output=output)
    execution = asyncio.run(StepExecutor(step, AgentContext(model=model, config=FAST)).execute())
    return execution, model


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "Oslo", "population": 700000}',
        '```json\n{"name": "Oslo", "population": 700000}\n```',
        'Here you go:\n```\n{"name": "Oslo", "population": 700000}\n```\nAnything else?',
        'Sure! {"name": "Oslo", "population": 700000} Hope that helps.',
        '{"name": "Oslo", "population": 700000,}',
        [("City", {"name": "Oslo", "population": 700000})],
        [("City", '{"name": "Oslo", "population": "700000"}')],
    ],
)
def test_output_as_text_or_tool_call_fenced_or_not(reply: Any) -> None:
    execution, _ = run(OutputInstructions(City), reply)
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == City(name="Oslo", population=700000)


def test_raw_json_schema_gives_a_dict() -> None:
    instructions = OutputInstructions(SCHEMA, instructions="Use lowercase tags.")
    execution, model = run(
        instructions, '{"name": "Oslo", "tags": 3}', '{"name": "Oslo", "tags": ["cold"]}'
    )
    assert execution.output == {"name": "Oslo", "tags": ["cold"]}
    assert model.requests[1].messages[-1].content == (
        "Your output did not match the required schema: tags: 3 is not of type 'array'."
    )
    assert model.requests[0].messages[-1].content == "Describe a city.\n\nUse lowercase tags."
    assert instructions.tool_name == "Place"


def test_any_type_pydantic_can_validate() -> None:
    execution, _ = run(OutputInstructions(list[int], name="numbers"), "[1, 2, 3]")
    assert execution.output == [1, 2, 3]


def test_provider_validated_output_is_taken_as_is() -> None:
    city = City(name="Oslo", population=1)
    reply = ModelCallResponse(
        message=Message.assistant('{"name": "Oslo", "population": 1}'),
        usage=Usage.of_call(5, 5),
        output=city,
        output_mode="json_schema",
    )
    execution, _ = run(OutputInstructions(City), reply)
    assert execution.output is city
    assert execution.model_calls[0].output_mode == "json_schema"
    assert execution.decisions[0].reason == "structured output (json_schema)"


def test_next_step_in_the_output_is_the_steps_suggestion() -> None:
    class Route(BaseModel):
        answer: str
        next_step: str

    execution, _ = run(OutputInstructions(Route), '{"answer": "x", "next_step": "review"}')
    assert execution.next_step == "review"


def test_invalid_json_schema_is_a_definition_error_naming_the_step() -> None:
    with pytest.raises(StepDefinitionError) as raised:
        DefaultStep("shape", "x", output=OutputInstructions({"type": "objekt"}))
    assert str(raised.value).startswith("step 'shape': output schema is not valid JSON Schema")
    with pytest.raises(
        StepDefinitionError, match="step 'shape': output must be a type, a JSON Schema dict"
    ):
        DefaultStep("shape", "x", output="City")  # type: ignore[call-overload]


def test_validation_errors_are_short_and_capped() -> None:
    class Many(BaseModel):
        a: int
        b: int
        c: int
        d: int
        e: int
        f: int
        g: int

    with pytest.raises(OutputValidationError) as raised:
        OutputInstructions(Many).validate_python({})
    assert str(raised.value) == (
        "Your output did not match the required schema: a: Field required; b: Field required; "
        "c: Field required; d: Field required; e: Field required (and 2 more)."
    )


def test_render_instructions_holds_the_schema() -> None:
    output = OutputInstructions(City, instructions="Be exact.")
    text = output.render_instructions()
    assert text.startswith("Reply with only a JSON object that matches this JSON Schema:\n{")
    assert '"population"' in text
    assert "Be exact." not in text  # the step's prompt carries the instructions, once
    after_tools = output.render_instructions(with_tools=True)
    assert after_tools.startswith("When you have the final answer, reply with only a JSON")


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=8,
    ).filter(lambda v: isinstance(v, dict | list) and bool(v))
)
def test_extract_json_finds_any_object_in_fences_and_prose(value: Any) -> None:
    import json

    text = json.dumps(value)
    assert extract_json(text) == value
    assert extract_json(f"```json\n{text}\n```") == value
    assert extract_json(f"Here it is: {text}\nThanks.") == value
