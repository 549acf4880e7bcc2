"""Evals from Python: datasets and their problems, every check kind (passing, failing, and
unable to run), repeats, budgets, several targets, record and replay."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from evals_helpers import Alternating, write

from minions import AgentRecipe, DefaultStep, ModelError, ModelOutputError, Prompt, Usage
from minions._messages import ModelCallResponse
from minions.evals import (
    Case,
    CaseRun,
    CheckResult,
    Dataset,
    DatasetError,
    ExprCheck,
    FunctionCheck,
    JudgeCheck,
    ToolExpectation,
    TrajectoryCheck,
    evaluate,
    load_dataset,
)
from minions.testing import FunctionModel, ScriptedModel

# -- datasets ------------------------------------------------------------------------------------


def test_a_yaml_dataset_loads_with_its_recipe_cases_and_checks(tmp_path: Path) -> None:
    dataset = load_dataset(write(tmp_path))
    assert dataset.name == "capitals"
    assert dataset.target == "capital"
    assert [c.id for c in dataset.cases] == ["france", "japan"]
    assert dataset.repeat == 4
    france = dataset.cases[0]
    assert france.expected == "Paris"
    assert france.line == 5
    assert [c.name for c in france.all_checks()] == ["expected", "expr: contains(output, 'Paris')"]


def problems(tmp_path: Path, dataset: str, **files: str) -> list[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    with pytest.raises(DatasetError) as caught:
        load_dataset(write(tmp_path, dataset))
    return [str(p) for p in caught.value.problems]


def test_an_unknown_key_is_named_with_its_line_and_a_suggestion(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
        recipe: capital.yaml
        cases:
          - id: france
            inputs: {country: France}
            checks:
              - expresion: "contains(output, 'Paris')"
          - id: japan
            input: {country: Japan}
        """,
    )
    assert found == [
        f"{tmp_path / 'capitals.yaml'}:6: field 'cases[france].checks[1].expresion': unknown key "
        "'expresion' (did you mean 'expr'?); known: name, expr, trajectory, judge, python",
        f"{tmp_path / 'capitals.yaml'}:8: field 'cases[japan].input': unknown key 'input' (did "
        "you mean 'inputs'?); known: id, description, inputs, expected, checks, repeat",
    ]


def test_every_problem_of_a_dataset_is_said_by_line(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
        recipe: capital.yaml
        cases:
          - id: france
            inputs: {country: France}
            checks:
              - expr: "contains(output, 'Paris'"
              - {expr: "x", judge: "y"}
              - trajectory: {order: sideways}
              - python: "scorers:nothing"
          - id: "no spaces"
            inputs: {country: Japan}
        """,
        **{"scorers.py": "def check_city(run):\n    return True\n"},
    )
    assert len(found) == 5, found
    assert ":6: field 'cases[france].checks[1].expr': invalid JMESPath" in found[0]
    assert (
        ":7: field 'cases[france].checks[2]': a check has exactly one of expr, trajectory, judge, python (it has expr, judge)"
        in found[1]
    )
    assert (
        ":8: field 'cases[france].checks[3].trajectory.order': Input should be 'exact'" in found[2]
    )
    assert "scorers has no function 'nothing'" in found[3]
    assert ":10: field 'cases[no spaces].id': case id 'no spaces' must be" in found[4]


def test_inputs_that_do_not_fit_the_recipe_are_refused_before_anything_runs(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
        recipe: capital.yaml
        cases:
          - id: france
            inputs: {contry: France}
        """,
    )
    assert (
        "capitals.yaml:3: field 'cases[france].inputs': inputs do not fit recipe 'capital'"
        in found[0]
    )
    assert "unknown input 'contry' (did you mean 'country'?)" in found[0]


def test_two_cases_with_one_id_and_a_missing_recipe_are_problems(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
        recipe: capital.yaml
        cases:
          - {id: a, inputs: {country: France}}
          - {id: a, inputs: {country: Japan}}
        """,
    )
    assert found == [
        f"{tmp_path / 'capitals.yaml'}:4: field 'cases[a].id': two cases have the id 'a' (case 1 too)"
    ]
    found = problems(tmp_path, "recipe: nowhere.yaml\ncases: [{id: a}]\n")
    assert found == [
        f"{tmp_path / 'capitals.yaml'}:1: field 'recipe': no recipe file {str(tmp_path / 'nowhere.yaml')!r}"
    ]


def test_without_importing_code_a_python_check_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "scorers.py").write_text("raise SystemExit('imported!')\n")
    path = write(
        tmp_path,
        "recipe: capital.yaml\ncases:\n  - id: a\n    inputs: {country: France}\n"
        "    checks: [{python: 'scorers:check'}]\n",
    )
    with pytest.raises(DatasetError, match="scorers run only from the command line or Python"):
        load_dataset(path, import_code=False)


# -- running -------------------------------------------------------------------------------------

RECIPE = AgentRecipe(
    id="capital",
    steps=[DefaultStep("answer", "What is the capital of {{ inputs.country }}? City only.")],
)


async def test_repeats_give_pass_rates_pass_at_k_and_flaky_cases() -> None:
    dataset = Dataset(
        RECIPE,
        [
            Case(id="france", inputs={"country": "France"}, expected="Paris"),
            Case(id="japan", inputs={"country": "Japan"}, expected="Tokyo"),
        ],
        repeat=4,
    )
    report = await evaluate(dataset, model=Alternating().model(), concurrency=3)
    france, japan = report.case("france"), report.case("japan")
    assert (france.runs, france.passed, france.pass_rate, france.flaky) == (4, 2, 0.5, True)
    assert france.pass_at_k == 1.0
    assert france.pass_hat_k == 0.0
    assert (japan.passed, japan.flaky) == (4, False)
    assert len(set(france.run_ids + japan.run_ids)) == 8  # every repetition is a run of its own
    assert report.pass_rate == 0.75
    assert report.interval is not None
    assert report.interval[0] < 0.75 < report.interval[1]
    assert {f.reason for f in france.failures} == {"output is 'Lyon', expected 'Paris'"}
    assert report.cost is None
    assert report.cost_note == "unknown: no prices given (--prices FILE)"


async def test_cost_is_known_only_where_every_model_has_a_price() -> None:
    dataset = Dataset(RECIPE, [Case(id="france", inputs={"country": "France"})])
    model = ScriptedModel(["Paris"], name="priced")
    report = await evaluate(dataset, model=model, prices={"priced": {"input": 1.0, "output": 2.0}})
    usage = report.usage
    expected = usage["prompt_tokens"] * 1e-6 + usage["completion_tokens"] * 2e-6
    assert report.cost == pytest.approx(expected)
    report = await evaluate(
        dataset,
        model=ScriptedModel(["Paris"], name="other"),
        prices={"priced": {"input": 1, "output": 2}},
    )
    assert (report.cost, report.cost_note) == (None, "unknown: no price for model 'other'")


def run_of(output: Any, document: dict[str, Any] | None = None) -> CaseRun:
    case = Case(id="c", inputs={"country": "France"})
    return CaseRun(
        case=case, target="t", repetition=1, run_id="r", status="completed", output=output,
        document=document if document is not None else {"output": output, "status": "completed"},
    )  # fmt: skip


async def outcome(check: Any, run: CaseRun, judge: Any = None) -> tuple[str, str]:
    from minions.evals import Grading
    from minions.evals._checks import run_check

    result = await run_check(check, run, Grading(judge=judge))
    return result.outcome, result.reason


async def test_expr_passes_fails_and_cannot_run() -> None:
    run = run_of("Paris", {"output": "Paris", "steps": {"answer": {"status": "completed"}}})
    assert await outcome(ExprCheck("contains(output, 'Paris')"), run) == (
        "passed", "contains(output, 'Paris') is true",
    )  # fmt: skip
    assert await outcome(ExprCheck("output == 'Rome'"), run) == (
        "failed", "output == 'Rome' is false (output = 'Paris')",
    )  # fmt: skip
    state, reason = await outcome(ExprCheck("ouput == 'Paris'"), run)
    assert state == "error"
    assert reason == (
        "\"ouput == 'Paris'\" reads 'ouput', which the result does not have (did you mean "
        "'output'?) (it has: output, steps)"
    )
    state, reason = await outcome(ExprCheck("steps.anwser.status == 'completed'"), run)
    assert state == "error"
    assert reason.endswith(
        "reads 'steps.anwser.status', which the result does not have (did you mean 'answer'?) "
        "(it has: answer)"
    )
    assert (await outcome(ExprCheck("output"), run))[0] == "error"  # not a predicate
    state, reason = await outcome(
        ExprCheck("contains(steps.answer, `1`) == `true`"), run_of(1, {"steps": {"answer": 3}})
    )
    assert state == "error"
    assert "cannot be evaluated" in reason
    with pytest.raises(ValueError, match="invalid JMESPath"):
        ExprCheck("contains(output")


def calls(*names_args: tuple[str, dict[str, Any]]) -> CaseRun:
    return run_of(
        "x",
        {
            "tool_calls": [{"name": n, "arguments": a} for n, a in names_args],
            "step_order": ["plan", "act"],
            "model_calls": 3,
            "usage": {"total_tokens": 500},
            "duration": 2.0,
        },
    )


@pytest.mark.parametrize(
    ("order", "expected", "passes"),
    [
        ("exact", ["search", "lookup", "search"], True),
        ("exact", ["search", "lookup"], False),
        ("in_order", ["lookup", "search"], True),
        ("in_order", ["lookup", "lookup"], False),
        ("any", ["lookup", "search", "search"], True),
        ("any", ["lookup", "search"], False),
        ("superset", ["lookup"], True),
        ("superset", ["lookup", "lookup"], False),
        ("subset", ["lookup", "search", "fetch"], True),
        ("subset", ["search"], False),
    ],
)
async def test_trajectory_orders(order: Any, expected: list[str], passes: bool) -> None:
    run = calls(("search", {"q": "bees"}), ("lookup", {"id": 1}), ("search", {"q": "wasps"}))
    state, reason = await outcome(TrajectoryCheck(tools=expected, order=order), run)
    assert state == ("passed" if passes else "failed"), reason


async def test_trajectory_arguments_bounds_and_repeats() -> None:
    run = calls(("search", {"q": "bees", "n": 3}), ("search", {"q": "bees", "n": 3}))
    with_args = TrajectoryCheck(tools=[ToolExpectation(name="search", args={"q": "bees"})])
    assert (await outcome(with_args, run))[0] == "passed"
    wrong = TrajectoryCheck(tools=[{"name": "search", "args": {"q": "ants"}}])
    state, reason = await outcome(wrong, run)
    assert state == "failed"
    assert "never came to search" in reason
    bounded = TrajectoryCheck(
        max_model_calls=2, max_tokens=400, max_seconds=1.5, no_repeated_calls=True
    )
    state, reason = await outcome(bounded, run)
    assert state == "failed"
    assert reason == (
        "3 model calls, more than the 2 allowed; 500 tokens, more than the 400 allowed; "
        '2.00 seconds, more than the 1.5 allowed; search({"q": "bees", "n": 3}) was called more than once'
    )
    steps = TrajectoryCheck(steps=["plan", "act"], order="exact")
    assert (await outcome(steps, run))[0] == "passed"


def test_a_trajectory_naming_a_step_the_recipe_lacks_is_refused(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        "recipe: capital.yaml\ncases:\n  - id: a\n    inputs: {country: France}\n"
        "    checks: [{trajectory: {steps: [anwser]}}]\n",
    )
    assert found == [
        f"{tmp_path / 'capitals.yaml'}:5: field 'cases[a].checks[1].trajectory': step 'anwser' "
        "is not a step of recipe 'capital' (did you mean 'answer'?)"
    ]


def judge_model(verdicts: dict[str, Any]) -> FunctionModel:
    def answer(prompt: Prompt) -> str:
        text = prompt.messages[-1].content
        for word, verdict in verdicts.items():
            if word in text:
                if isinstance(verdict, Exception):
                    raise verdict
                return json.dumps(verdict)
        return "not JSON at all"

    return FunctionModel(answer, name="judge")


async def test_judge_passes_fails_is_cached_and_cannot_run() -> None:
    from minions.evals import Judge

    model = judge_model(
        {
            "Paris": {"passed": True, "reason": "names Paris"},
            "Lyon": {"passed": False, "reason": "Lyon is not the capital"},
            "Down": ModelError("judge server down"),
        }
    )
    judge = Judge(model, label="judge")
    check = JudgeCheck("Names the capital of {{ inputs.country }} and nothing else.")
    run = run_of("Paris", {"output": "Paris", "inputs": {"country": "France"}})
    assert await outcome(check, run, judge) == ("passed", "names Paris")
    assert await outcome(check, run, judge) == ("passed", "names Paris")
    assert len(model.requests) == 1  # cached by (rubric, output, judge model)
    assert "Names the capital of France and nothing else." in model.requests[0].messages[-1].content
    lyon = run_of("Lyon", {"output": "Lyon", "inputs": {"country": "France"}})
    assert await outcome(check, lyon, judge) == ("failed", "Lyon is not the capital")
    down = run_of("Down", {"output": "Down", "inputs": {"country": "France"}})
    state, reason = await outcome(check, down, judge)
    assert state == "error"
    assert reason.startswith("judge 'judge' did not answer:")
    assert "judge server down" in reason
    state, reason = await outcome(check, run_of("Paris", {"output": "Paris", "inputs": {}}), judge)
    assert (state, "the rubric cannot be rendered" in reason) == ("error", True)
    assert (await outcome(check, run))[0] == "error"  # no judge at all


async def test_python_scorers_pass_fail_and_cannot_run() -> None:
    run = run_of("Paris")
    assert await outcome(FunctionCheck(lambda r: r.output == "Paris"), run) == (
        "passed",
        "returned True",
    )
    assert await outcome(FunctionCheck(lambda r: (False, "too short")), run) == (
        "failed",
        "too short",
    )

    async def scorer(r: CaseRun) -> CheckResult:
        return CheckResult(check="mine", outcome="passed", reason="fine")

    assert await outcome(FunctionCheck(scorer), run) == ("passed", "fine")
    state, reason = await outcome(FunctionCheck(lambda r: 1 / 0), run)
    assert (state, reason) == ("error", "the scorer raised ZeroDivisionError: division by zero")
    state, reason = await outcome(FunctionCheck(lambda r: 0.7), run)
    assert state == "error"
    assert reason.startswith("the scorer returned 0.7; return True/False")


def test_a_python_check_is_imported_from_the_datasets_folder(tmp_path: Path) -> None:
    (tmp_path / "scorers.py").write_text(
        "def check_city(run):\n    return run.output == 'Paris', f'said {run.output}'\n"
    )
    path = write(
        tmp_path,
        "recipe: capital.yaml\ncases:\n  - id: a\n    inputs: {country: France}\n"
        "    checks: [{python: 'scorers:check_city'}]\n",
    )
    (check,) = load_dataset(path).cases[0].all_checks()
    assert check.name == "python: scorers:check_city"
    found = problems(
        tmp_path,
        "recipe: capital.yaml\ncases:\n  - id: a\n    inputs: {country: France}\n"
        "    checks: [{python: 'nowhere:check'}]\n",
    )
    assert "python check 'nowhere:check': cannot import tools from 'nowhere'" in found[0]


async def test_a_failed_run_fails_and_an_unusable_model_is_an_error() -> None:
    def answer(prompt: Prompt) -> str:
        if "France" in prompt.messages[-1].content:
            raise ModelError("connection refused by the model server")
        return "Tokyo"

    dataset = Dataset(
        RECIPE,
        [
            Case(id="france", inputs={"country": "France"}),
            Case(id="japan", inputs={"country": "Japan"}),
        ],
        checks=[ExprCheck("output == 'Tokyo'")],
    )
    report = await evaluate(dataset, model=FunctionModel(answer))
    france = report.case("france")
    assert (france.errors, france.failed, france.pass_rate) == (1, 0, None)
    assert france.failures[0].kind == "error"
    assert "the model could not be used in step 'answer'" in france.failures[0].reason
    assert report.pass_rate == 1.0  # japan; france says nothing about the agent

    def garbled(prompt: Prompt) -> str:
        raise ModelOutputError("the answer was not JSON", reason="the answer was not JSON")

    dataset = Dataset(RECIPE, [Case(id="a", inputs={"country": "France"})])
    report = await evaluate(dataset, model=FunctionModel(garbled))
    case = report.case("a")
    assert (case.failed, case.errors) == (1, 0)
    assert case.failures[0].reason.startswith("the run failed:")
    assert "not JSON" in case.failures[0].reason


async def test_max_tokens_stops_cleanly_and_says_what_ran() -> None:
    def answer(prompt: Prompt) -> ModelCallResponse:
        from minions import Message

        return ModelCallResponse(
            message=Message.assistant("Paris"),
            usage=Usage(prompt_tokens=90, completion_tokens=10, calls=1),
        )

    dataset = Dataset(
        RECIPE, [Case(id=f"c{i}", inputs={"country": "France"}) for i in range(5)], repeat=2
    )
    report = await evaluate(dataset, model=FunctionModel(answer), max_tokens=250, concurrency=1)
    assert report.usage["total_tokens"] == 300  # the call in flight when the budget ran out
    assert report.runs == 3
    assert report.not_started == 7
    assert (
        report.note
        == "--max-tokens 250 reached (300 tokens used): 3 of 10 case runs finished, 0 cut short, 7 not started"
    )


async def test_several_targets_run_every_case() -> None:
    other = AgentRecipe(
        id="capital_v2", steps=[DefaultStep("answer", "Capital of {{ inputs.country }}?")]
    )
    dataset = Dataset(
        [RECIPE, other], [Case(id="france", inputs={"country": "France"}, expected="Paris")]
    )
    report = await evaluate(dataset, model=ScriptedModel(["Paris", "Lyon"]), concurrency=1)
    assert [(c.target, c.id, c.passed) for c in report.cases] == [
        ("capital", "france", 1), ("capital_v2", "france", 0),
    ]  # fmt: skip
    assert report.target == "capital, capital_v2"


async def test_a_step_is_a_target_and_a_function_a_check() -> None:
    step = DefaultStep("shout", "Say {{ inputs.word }} in capitals.")
    dataset = Dataset(
        step, [Case(id="hi", inputs={"word": "hi"}, checks=[lambda run: run.output == "HI"])]
    )
    report = await evaluate(dataset, model=FunctionModel(lambda p: "HI"))
    assert report.case("hi").passed == 1


async def test_record_then_replay_gives_the_same_results_offline(tmp_path: Path) -> None:
    dataset = Dataset(
        RECIPE,
        [Case(id="france", inputs={"country": "France"}, expected="Paris")],
        repeat=4,
        checks=[JudgeCheck("Is a city.")],
    )
    model = Alternating().model()
    judge = judge_model(
        {
            "Paris": {"passed": True, "reason": "a city"},
            "Lyon": {"passed": True, "reason": "a city too"},
        }
    )
    live = await evaluate(dataset, model=model, judge_model=judge, record=tmp_path / "rec")
    assert sorted(p.name for p in (tmp_path / "rec" / "france").iterdir()) == [
        f"{n}.recording.json" for n in range(1, 5)
    ]
    assert (tmp_path / "rec" / "judge.json").is_file()
    asked = len(model.requests), len(judge.requests)
    replayed = await evaluate(dataset, replay=tmp_path / "rec")
    assert (len(model.requests), len(judge.requests)) == asked  # no model was called
    assert replayed.mode == "replay"
    assert replayed.judge_model == "judge"
    assert [r.outcome for r in replayed.case("france").results] == [
        r.outcome for r in live.case("france").results
    ]
    assert replayed.usage == live.usage
