"""Conditions that can never hold as meant are caught: at load against the source step's
output schema (and unquoted literals), at run time by saying which value was missing, and in
the CLI summary when a router chose nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from minions import AgentExecutor, AgentRecipe, DefaultStep, OutputInstructions, Transition
from minions.cli._app import Settings, app
from minions.errors import RecipeError
from minions.recipes import parse_recipe
from minions.testing import FunctionModel, ScriptedModel

ROUTER = """\
id: router
steps:
  - id: classify
    analyze: Classify the ticket.
    input: my bill is wrong
    output: {{topic: "", detail: {{urgency: ""}}}}
    next:
      - {{step: billing, when: "{when}"}}
      - {{step: tech, when: "output.topic == 'tech'"}}
  - id: billing
    goal: Answer the billing question.
  - id: tech
    goal: Answer the tech question.
"""


def problems(when: str) -> list[str]:
    with pytest.raises(RecipeError) as raised:
        parse_recipe(ROUTER.format(when=when))
    return [p.message for p in raised.value.problems]


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (
            "output.topik == 'billing'",
            "condition of classify -> billing: {{ output.topik == 'billing' }}: output has no "
            "field 'topik' (did you mean 'topic'?); its fields: detail, topic",
        ),
        (
            "output.detail.urgancy == 'high'",
            "condition of classify -> billing: {{ output.detail.urgancy == 'high' }}: "
            "output.detail has no field 'urgancy' (did you mean 'urgency'?); its fields: urgency",
        ),
        (
            "output.topic == billing",
            "condition of classify -> billing: {{ output.topic == billing }} compares with the "
            "whole step 'billing'; to compare with the text, quote it: 'billing'",
        ),
    ],
)
def test_conditions_are_checked_against_the_output_schema(when: str, expected: str) -> None:
    assert problems(when) == [expected]


@pytest.mark.parametrize(
    "when",
    [
        "output.topic == 'billing'",
        "!(output.detail.urgency)",
        "length(output.topic) > `3`",
        "status == 'completed'",
        "output.detail.urgency == inputs.level || `false`",
    ],
)
def test_conditions_over_existing_fields_pass(when: str) -> None:
    text = ROUTER.format(when=when).replace("id: router\n", "id: router\ninputs: {level: {}}\n")
    assert parse_recipe(text).id == "router"


class Verdict(BaseModel):
    class Detail(BaseModel):
        urgency: str

    approved: bool
    detail: Detail


def test_a_pydantic_output_is_checked_through_its_references() -> None:
    recipe = AgentRecipe(
        id="r",
        steps=[
            DefaultStep("a", "Judge.", output=OutputInstructions(Verdict)),
            DefaultStep("b", "B"),
        ],
        transitions=[Transition("a", "b", when="output.detail.urgancy == 'high'")],
    )
    with pytest.raises(RecipeError, match=r"output\.detail has no field 'urgancy'"):
        AgentExecutor().graph(recipe)


def test_without_a_schema_a_missing_value_is_named_when_nothing_is_chosen() -> None:
    recipe = AgentRecipe(
        id="r",
        steps=[DefaultStep("a", "Classify."), DefaultStep("b", "B"), DefaultStep("c", "C")],
        transitions=[
            Transition("a", "b", when="output.topik == 'billing'"),
            Transition("a", "c", when="output.topic == 'tech'"),
        ],
    )
    result = AgentExecutor(model=ScriptedModel(['{"topic": "other"}'])).execute_sync(recipe)
    assert result.ok
    skipped = {e.step_id: e.error for e in result.executions if e.status.value == "skipped"}
    assert skipped == {
        "b": "not chosen: 'a' chose nothing (no condition held; no value for output.topik)",
        "c": "not chosen: 'a' chose nothing (no condition held; no value for output.topik)",
    }


def test_a_condition_that_fails_to_evaluate_fails_the_run_instead_of_being_false() -> None:
    recipe = AgentRecipe(
        id="r",
        steps=[DefaultStep("a", "Count."), DefaultStep("b", "B")],
        transitions=[Transition("a", "b", when="length(output.n) > `1`")],
    )
    result = AgentExecutor(model=ScriptedModel(['{"n": 5}'])).execute_sync(recipe)
    assert not result.ok
    assert "the condition of a -> b failed" in (result.error or "")
    assert "length" in (result.error or "")


def test_the_cli_summary_says_when_a_router_chose_nothing(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(ROUTER.format(when="output.topic == 'billing'"))

    def reply(prompt: Any) -> str:
        return '{"topic": "other", "detail": {"urgency": "low"}}'

    settings = Settings(resolve_model=lambda spec: FunctionModel(reply, name="m"))
    result = CliRunner().invoke(app, ["run", str(recipe), "--model", "m"], obj=settings)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert (
        "note: 'classify' chose no next step (no condition held), so billing, tech did not run"
        in said
    )
