"""`{{ expression }}` templates over run state."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minions import AgentContext, DefaultStep, StepExecutor, StepStatus
from minions._templates import check_template, has_template, render, render_text, template_roots
from minions.errors import RecipeError, TemplateError, TemplateSyntaxError
from minions.recipes import parse_recipe
from minions.testing import ScriptedModel

STATE = {
    "inputs": {"topic": "bees", "n": 3, "tags": ["a", "b"], "empty": None},
    "search": {"output": {"hits": [{"title": "T1", "score": 0.9}, {"title": "T2", "score": 0.2}]}},
}


def test_a_whole_expression_keeps_its_type() -> None:
    assert render("{{ inputs.n }}", STATE) == 3
    assert render("  {{ inputs.tags }} ", STATE) == ["a", "b"]
    assert render("{{search.output.hits[0]}}", STATE) == {"title": "T1", "score": 0.9}


def test_embedded_expressions_become_text() -> None:
    assert render("About {{ inputs.topic }} x{{ inputs.n }}", STATE) == "About bees x3"
    assert render("tags: {{ inputs.tags }}", STATE) == 'tags: ["a", "b"]'
    assert render_text("{{ inputs.n }}", STATE) == "3"


def test_jmespath_filters_projections_and_functions() -> None:
    assert render("{{ search.output.hits[?score > `0.5`].title }}", STATE) == ["T1"]
    assert render("{{ search.output.hits[*].title }}", STATE) == ["T1", "T2"]
    assert render("{{ length(inputs.tags) }}", STATE) == 2
    assert render("{{ join(', ', inputs.tags) }}", STATE) == "a, b"


def test_nested_values_are_rendered_deeply() -> None:
    value = {"q": "{{ inputs.topic }}", "list": ["{{ inputs.n }}", 1], "plain": 2}
    assert render(value, STATE) == {"q": "bees", "list": [3, 1], "plain": 2}
    assert has_template(value)
    assert not has_template({"a": ["b"]})


def test_a_missing_value_is_an_error_naming_the_expression() -> None:
    with pytest.raises(TemplateError) as raised:
        render("Write about {{ inputs.subject }}.", STATE)
    assert raised.value.expression == "inputs.subject"
    assert str(raised.value).startswith("template {{ inputs.subject }} has no value")
    with pytest.raises(
        TemplateError, match=r"\{\{ search.output.hits\[\?score > `5`\].title \| \[0\] \}\}"
    ):
        render("{{ search.output.hits[?score > `5`].title | [0] }}", STATE)


def test_an_explicit_null_is_not_missing_and_defaults_work() -> None:
    assert render("{{ inputs.empty }}", STATE) is None
    assert render("[{{ inputs.empty }}]", STATE) == "[]"
    assert render("{{ inputs.subject || 'none' }}", STATE) == "none"


def test_syntax_errors_and_unknown_roots_are_reported_when_checked() -> None:
    assert check_template("{{ inputs.x }} {{ search.output }}", {"inputs", "search"}) == []
    problems = check_template("{{ serch.output }} and {{ inputs.[ }}", {"inputs", "search"})
    assert problems[1].startswith("invalid template expression {{ inputs.[ }}")
    assert problems[0] == (
        "template {{ serch.output }} refers to 'serch', which is not an input, a step or a "
        "saved result (did you mean 'search'?)"
    )
    with pytest.raises(TemplateSyntaxError):
        render("{{ inputs.[ }}", STATE)


def test_roots_of_complex_expressions() -> None:
    assert template_roots("{{ a.b[?c == d].e }}") == {"a"}
    assert template_roots("{{ length(g) }} {{ i || j.k }} {{ sort_by(x, &y) }}") == {
        "g",
        "i",
        "j",
        "x",
    }


def test_a_missing_value_in_a_goal_fails_the_step_and_never_reaches_the_model() -> None:
    model = ScriptedModel(["never"])
    step = DefaultStep("s", "Write about {{ inputs.subject }}.")
    context = AgentContext(model=model, inputs={"topic": "bees"})
    execution = StepExecutor(step, context).execute_sync()
    assert execution.status is StepStatus.FAILED
    assert (execution.error or "").startswith("template {{ inputs.subject }} has no value")
    assert model.requests == []


def test_goal_and_system_are_rendered_from_inputs() -> None:
    model = ScriptedModel(["ok"])
    step = DefaultStep("s", "Write {{ inputs.n }} lines on {{ inputs.topic }}.")
    context = AgentContext(model=model, inputs={"topic": "bees", "n": 3})
    StepExecutor(step, context).execute_sync()
    assert model.requests[0].messages[-1].content == "Write 3 lines on bees."


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)


@given(key=names, value=json_values.filter(lambda v: v is not None))
def test_whole_expressions_round_trip_any_json_value(key: str, value: Any) -> None:
    assert render(f"{{{{ inputs.{key} }}}}", {"inputs": {key: value}}) == value


@given(
    key=names,
    value=json_values.filter(lambda v: v is not None),
    prefix=st.text(alphabet="ab .,"),
    suffix=st.text(alphabet="ab .,"),
)
def test_embedded_expressions_render_as_text(
    key: str, value: Any, prefix: str, suffix: str
) -> None:
    text = render(f"x{prefix}{{{{ inputs.{key} }}}}{suffix}", {"inputs": {key: value}})
    expected = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    assert text == f"x{prefix}{expected}{suffix}"


@given(text=st.text().filter(lambda t: "{{" not in t))
def test_text_without_expressions_is_unchanged(text: str) -> None:
    assert render(text, STATE) == text


def test_a_negated_path_is_rejected_with_the_fix() -> None:
    """JMESPath reads ``!output.ok`` as ``(!output).ok``, which is never what was meant."""
    with pytest.raises(TemplateSyntaxError, match=r"write !\(output.ok\) instead"):
        render("{{ !output.ok }}", {"output": {"ok": False}})
    assert render("{{ !(output.ok) }}", {"output": {"ok": False}}) is True
    assert check_template("{{ !inputs.flag }}", ["inputs"])
    with pytest.raises(
        TemplateSyntaxError, match=r"put the whole path in parentheses: !\(x\.\.\.\)"
    ):
        render("{{ a && !x.y }}", {"a": True, "x": {"y": False}})


def test_a_jmespath_syntax_error_names_its_column() -> None:
    [problem] = check_template("Hi {{ inputs.[ }}", {"inputs"})
    assert problem == (
        "invalid template expression {{ inputs.[ }}: Invalid jmespath expression: Incomplete "
        "expression at column 9 of the expression"
    )


# -- Jinja habits: "templates are JMESPath, not Jinja", with what to write instead ---------------


@pytest.mark.parametrize(
    ("template", "written"),
    [
        ("{{ inputs['topic'] }}", "{{ inputs.topic }}"),
        ('{{ inputs["topic"] }}', "{{ inputs.topic }}"),
        ("{{ inputs['a b'].c }}", '{{ inputs."a b".c }}'),
        ("{{ inputs.tags.0 }}", "{{ inputs.tags[0] }}"),
        ("{{ inputs.a and inputs.b }}", "{{ inputs.a && inputs.b }}"),
        ("{{ not inputs.empty }}", "{{ !(inputs.empty) }}"),
        ("{{ inputs.subject | default('none') }}", "{{ inputs.subject || 'none' }}"),
        ('{{ inputs.tags | join(", ") }}', "{{ join(', ', inputs.tags) }}"),
        ("{{ inputs.tags | sort | join('-') }}", "{{ join('-', sort(inputs.tags)) }}"),
        ("{{ default(inputs.subject) }}", "{{ inputs.subject || 'default' }}"),
    ],
)
def test_jinja_that_cannot_run_says_what_to_write_in_jmespath(template: str, written: str) -> None:
    with pytest.raises(TemplateSyntaxError) as raised:
        render(template, STATE)
    message = str(raised.value)
    assert message.startswith(f"invalid template expression {template}: templates are JMESPath")
    assert message.endswith(f"write {written}")
    assert "Expecting: star" not in message
    # What it says to write works.
    inputs = {"topic": "bees", "tags": ["a", "b"], "empty": None, "a b": {"c": 1}, "a": 1, "b": 2}
    state = {"inputs": inputs}
    render(written, state)
    # The same message when a recipe is checked, before anything runs.
    assert check_template(template, {"inputs"}) == [message]


def test_a_jinja_filter_with_no_jmespath_form_says_what_to_do_instead() -> None:
    with pytest.raises(TemplateError) as raised:
        render("Weather in {{ inputs.topic | upper }}", STATE)
    assert str(raised.value) == (
        "template {{ inputs.topic | upper }} has no value: templates are JMESPath, not Jinja: "
        "'| upper' is a Jinja filter, and JMESPath has no upper; write {{ inputs.topic }} and "
        "say in the prompt what to do with it, or compute it in a tool step or in your code "
        "before the run"
    )
    with pytest.raises(TemplateSyntaxError, match=r"there is no upper\(\) in JMESPath; write "):
        render("{{ upper(inputs.topic) }}", STATE)
    with pytest.raises(TemplateSyntaxError, match=r"'\| round' is a Jinja filter"):
        render("{{ inputs.n | round(2) }}", STATE)
    # A filter that JMESPath spells as a function.
    with pytest.raises(TemplateError, match=r"write \{\{ length\(inputs.tags\) \}\}"):
        render("{{ inputs.tags | length }}", STATE)


def test_a_pipe_into_a_field_named_like_a_filter_still_reads_the_field() -> None:
    state = {"plan": {"output": {"title": "T", "upper": "U"}}}
    assert render("{{ plan.output | title }}", state) == "T"
    assert render("{{ plan.output | upper }}", state) == "U"
    # A recipe is told about the unlikely ones only (and how to read such a field).
    assert check_template("{{ plan.output | title }}", {"plan"}) == []
    [problem] = check_template("{{ plan.output | upper }}", {"plan"})
    assert problem.startswith(
        "template {{ plan.output | upper }}: templates are JMESPath, not Jinja: '| upper' is a "
        "Jinja filter"
    )
    assert problem.endswith("to read a field named 'upper', write it after a dot")


def test_unknown_functions_and_wrong_arities_are_caught_before_rendering() -> None:
    [problem] = check_template("{{ lenght(inputs.tags) }}", {"inputs"})
    assert problem.startswith(
        "invalid template expression {{ lenght(inputs.tags) }}: there is no function lenght() in "
        "JMESPath (did you mean 'length'?) (its functions: abs, avg,"
    )
    [problem] = check_template("{{ join(inputs.tags) }}", {"inputs"})
    assert problem == (
        "invalid template expression {{ join(inputs.tags) }}: join() takes 2 arguments, not 1"
    )
    assert check_template("{{ not_null(inputs.a, inputs.b, 'x') }}", {"inputs"}) == []


def test_jinja_blocks_are_reported_once_each() -> None:
    problems = check_template("{% if inputs.n %}many{% endif %} {{ inputs.n }}", {"inputs"})
    assert problems == [
        "template text '{% if inputs.n %}' is a Jinja block: templates are JMESPath, not Jinja, "
        "and have no {% %} blocks; choose text with {{ condition && 'yes' || 'no' }}, repeat a "
        "step with loop:, or write {{ '{%' }} for a literal '{%'"
    ]
    assert render("{{ '{%' }} raw %}", STATE) == "{% raw %}"
    assert check_template("100{%} of {{ inputs.n }}", {"inputs"}) == []


def test_a_recipe_with_jinja_fails_validation_naming_the_line() -> None:
    text = """\
id: weather
inputs:
  city: {type: string}
steps:
  - id: report
    goal: "Weather in {{ inputs['city'] }}"
  - id: shout
    goal: "{{ report.output | upper }}"
    depends_on: [report]
"""
    with pytest.raises(RecipeError) as raised:
        parse_recipe(text)
    assert [str(p) for p in raised.value.problems] == [
        "recipe:6: step 'report', field 'goal': invalid template expression "
        "{{ inputs['city'] }}: templates are JMESPath, not Jinja: write {{ inputs.city }}",
        "recipe:8: step 'shout', field 'goal': template {{ report.output | upper }}: templates are "
        "JMESPath, not Jinja: '| upper' is a Jinja filter, and JMESPath has no upper; write "
        "{{ report.output }} and say in the prompt what to do with it, or compute it in a tool "
        "step or in your code before the run; to read a field named 'upper', write it after a "
        "dot",
    ]


def test_a_step_whose_goal_pipes_into_a_filter_fails_with_the_hint() -> None:
    model = ScriptedModel(["never"])
    step = DefaultStep("s", "Weather in {{ inputs.city | upper }}")
    execution = StepExecutor(
        step, AgentContext(model=model, inputs={"city": "Oslo"})
    ).execute_sync()
    assert execution.status is StepStatus.FAILED
    assert "templates are JMESPath, not Jinja" in (execution.error or "")
    assert "give a default" not in (execution.error or "")
    assert model.requests == []
