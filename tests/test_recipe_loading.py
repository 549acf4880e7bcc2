"""Loading YAML recipes: every field, every error located by file, line, step and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minions.errors import RecipeError
from minions.recipes._loader import coerce_inputs, load_spec, parse_spec
from minions.recipes._schema import InputSpec, RecipeSpec

FULL = """\
id: everything
description: Uses every field.
model: ollama:llama3.2:3b
config: {max_parallel_steps: 2, fail_fast: true, step_token_budget: 5000}
inputs:
  topic: string
  hours: {type: integer, default: 24, description: How far back.}
  mode: {type: string, enum: [fast, slow], default: fast}
tools: [tests.helpers:add, builtin_module]
workspace: data
http: {enabled: true, allowed_hosts: [example.org]}
execution_mode: sequential
steps:
  - id: now
    tool: current_datetime
    params: {hours_ago: "{{ inputs.hours }}"}
    save_as: since
  - id: decide
    analyze: Which items matter?
    input: "{{ since }}"
    output: {ids: [], reasoning: ""}
    depends_on: now
  - id: legacy
    tool: llm_analyze
    context: Rules here.
    input: "{{ since }}"
    output_format: {keep: true}
  - id: apply
    tool: add
    params: {a: "{{ loop.item }}", b: 1}
    loop: "{{ decide.output.ids }}"
    parallel: 3
    fill_missing: model
  - id: write
    goal: Write about {{ inputs.topic }}.
    system: You write.
    tools: [read_file]
    output: {title: ""}
    completion_marker: DONE
    next: [{step: review, when: "output.title != ''"}, apply]
    optional: true
    mode: sync
    timeout: 30
    memory: agent
    model: openai:gpt-4o-mini
    max_visits: 3
    config: {max_model_calls_per_step: 4}
  - id: review
    recipe: review.yaml
    inputs: {text: "{{ write.output }}"}
    mode: fire_and_forget
    loop: {items: [1, 2], parallel: 2, continue_on_error: true}
"""


def test_every_field_loads() -> None:
    spec, located = parse_spec(FULL, file="everything.yaml")
    assert spec.model == "ollama:llama3.2:3b"
    assert spec.inputs["topic"] == InputSpec(type="string")
    assert spec.inputs["hours"].default == 24
    assert spec.http != False  # noqa: E712
    assert [s.kind for s in spec.steps] == [
        "tool",
        "analysis",
        "analysis",
        "tool",
        "agent",
        "recipe",
    ]
    apply = spec.steps[3]
    assert apply.loop is not None
    assert (apply.loop.items, apply.parallel) == ("{{ decide.output.ids }}", 3)
    write = spec.steps[4]
    assert [(n.step, n.when) for n in write.next] == [
        ("review", "output.title != ''"),
        ("apply", None),
    ]
    assert write.depends_on == []
    assert spec.steps[1].depends_on == ["now"]
    assert spec.steps[5].loop is not None
    assert spec.steps[5].loop.continue_on_error is True
    assert located.line(("steps", 4, "timeout")) == 43


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            "    timeout: 30\n",
            "everything.yaml:43: step 'write', field 'timeout': Input should be greater than 0",
        ),
        (
            "    mode: sync\n",
            "everything.yaml:42: step 'write', field 'mode': Input should be 'async', 'sync' or 'fire_and_forget'",
        ),
        (
            "    memory: agent\n",
            "everything.yaml:44: step 'write', field 'memory': Input should be 'step' or 'agent'",
        ),
        (
            "    max_visits: 3\n",
            "everything.yaml:46: step 'write', field 'max_visits': Input should be greater than or equal to 1",
        ),
        (
            "    optional: true\n",
            "everything.yaml:41: step 'write', field 'optional': Input should be a valid boolean, unable to interpret input",
        ),
    ],
)
def test_bad_values_are_located(change: str, expected: str) -> None:
    bad = {
        "    timeout: 30\n": "    timeout: -1\n",
        "    mode: sync\n": "    mode: parallel\n",
        "    memory: agent\n": "    memory: global\n",
        "    max_visits: 3\n": "    max_visits: 0\n",
        "    optional: true\n": "    optional: maybe\n",
    }[change]
    with pytest.raises(RecipeError) as raised:
        parse_spec(FULL.replace(change, bad), file="everything.yaml")
    assert [str(p) for p in raised.value.problems] == [expected]


def test_all_problems_are_collected_with_hints() -> None:
    text = """\
id: broken
stpes: []
steps:
  - id: a
    goal: x
    dependson: [b]
  - id: b
    goal: y
    tool: z
  - goal: no id
  - id: c
"""
    with pytest.raises(RecipeError) as raised:
        parse_spec(text, file="broken.yaml")
    assert [str(p) for p in raised.value.problems] == [
        "broken.yaml:2: field 'stpes': unknown field 'stpes' (did you mean 'steps'?)",
        "broken.yaml:6: step 'a', field 'dependson': unknown field 'dependson' (did you mean 'depends_on'?)",
        "broken.yaml:7: step 'b': a step needs exactly one of goal (agent step), tool (tool step), "
        "analyze (analysis step) or recipe (sub-recipe step); it has goal, tool",
        "broken.yaml:10: step '#3', field 'id': is required",
        "broken.yaml:11: step 'c': a step needs exactly one of goal (agent step), tool (tool "
        "step), analyze (analysis step) or recipe (sub-recipe step); it has none",
    ]
    assert str(raised.value).startswith("invalid recipe (5 problems):\n  broken.yaml:2:")


def test_yaml_syntax_errors_and_files(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"x\.yaml:5: invalid YAML"):
        parse_spec("id: x\nsteps:\n  - id: a\n    goal: [open\n  - id: b\n", file="x.yaml")
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(RecipeError, match="a recipe must be a mapping"):
        parse_spec("- just a list", file="l.yaml")
    (tmp_path / "ok.yaml").write_text("id: ok\nsteps:\n  - id: a\n    goal: hi\n")
    spec, _ = load_spec(tmp_path / "ok.yaml")
    assert spec.steps[0].goal == "hi"


def test_json_schema_of_the_format() -> None:
    schema = RecipeSpec.model_json_schema()
    json.dumps(schema)
    assert set(schema["required"]) == {"id", "steps"}
    step = schema["$defs"]["StepSpec"]
    assert {"goal", "tool", "analyze", "recipe", "loop", "next", "save_as"} <= set(
        step["properties"]
    )
    assert step["additionalProperties"] is False


def test_inputs_are_checked_and_converted() -> None:
    specs = {
        "n": InputSpec(type="integer", default=3),
        "tags": InputSpec(type="array", default=[]),
        "flag": InputSpec(type="boolean", default=False),
        "topic": InputSpec(description="the topic"),
        "level": InputSpec(enum=["a", "b"], default="a"),
    }
    assert coerce_inputs(specs, {"n": "5", "tags": '["x"]', "flag": "yes", "topic": "t"}) == {
        "n": 5,
        "tags": ["x"],
        "flag": True,
        "topic": "t",
        "level": "a",
    }
    with pytest.raises(RecipeError) as raised:
        coerce_inputs(specs, {"n": "five", "topc": "t", "level": "c", "flag": 1})
    fields = [p.field for p in raised.value.problems]
    assert fields == ["inputs.topc", "inputs.n", "inputs.flag", "inputs.topic", "inputs.level"]
    assert [p.message for p in raised.value.problems] == [
        "unknown input 'topc' (did you mean 'topic'?); the recipe's inputs: n, tags, flag, topic, level",
        "input 'n' must be integer, got str 'five'",
        "input 'flag' must be boolean, got int 1",
        "input 'topic' is required (string: the topic)",
        "input 'level' must be one of ['a', 'b'], got 'c'",
    ]
