"""`minions eval` end to end against a real OpenAI-compatible server on 127.0.0.1 that answers
one case right on alternate calls: pass rates, flakiness, gates and exit codes, JSON and JUnit
that agree, baselines, record then replay with no request, and what a replay refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from evals_helpers import Alternating, write
from typer.testing import CliRunner

from minions.cli._app import Settings, app
from minions.testing import FakeOpenAIServer


@pytest.fixture
def server() -> Iterator[tuple[FakeOpenAIServer, Alternating]]:
    answers = Alternating()
    with FakeOpenAIServer(answers.reply) as fake:
        yield fake, answers


def invoke(server: FakeOpenAIServer | None, *args: str) -> Any:
    settings = Settings(resolve_model=lambda spec: server.model()) if server else Settings()
    return CliRunner().invoke(app, ["eval", *args], obj=settings)


def record(fake: FakeOpenAIServer, folder: Path) -> tuple[Path, Path]:
    """The dataset, recorded live into `folder`/recordings."""
    dataset, recordings = write(folder), folder / "recordings"
    result = invoke(fake, str(dataset), "--model", "fake", "--record", str(recordings), "-q")
    assert result.exit_code == 0, result.output
    return dataset, recordings


def test_a_case_right_on_alternate_calls_is_flaky_and_fails_the_gate(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, _ = server
    dataset = write(tmp_path)
    junit, out = tmp_path / "junit.xml", tmp_path / "report.json"
    result = invoke(
        fake, str(dataset), "--model", "fake", "--repeat", "4", "--min-pass-rate", "0.8",
        "--json", "--junit", str(junit), "--out", str(out), "--concurrency", "3",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report == json.loads(out.read_text())
    france, japan = report["cases"]
    assert (france["id"], france["runs"], france["passed"], france["pass_rate"]) == (
        "france",
        4,
        2,
        0.5,
    )
    assert france["flaky"] is True
    assert (japan["pass_rate"], japan["flaky"]) == (1.0, False)
    assert report["pass_rate"] == 0.75
    assert len(report["interval"]) == 2
    assert len(fake.chat_requests) == 8
    assert {f["reason"] for f in france["failures"]} == {
        "output is 'Lyon', expected 'Paris'",
        "contains(output, 'Paris') is false (output = 'Lyon')",
    }
    assert [g["ok"] for g in report["gates"]] == [True, False]
    # The JUnit file parses and says the same.
    root = ElementTree.parse(junit).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"france", "japan"}
    failure = cases["france"].find("failure")
    assert failure is not None
    assert failure.get("message") == "passed 2 of 4 runs (pass rate 0.50, flaky)"
    assert cases["japan"].find("failure") is None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    properties = {p.get("name"): p.get("value") for p in cases["france"].iter("property")}
    assert properties["pass_rate"] == str(france["pass_rate"])
    assert properties["flaky"] == "true"
    assert str(properties["run_ids"]).split() == france["run_ids"]


def test_a_baseline_where_the_case_always_passed_marks_it_regressed(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, answers = server
    dataset = write(tmp_path)
    answers.flaky = ()  # the baseline: France right every time
    base = tmp_path / "base.json"
    result = invoke(fake, str(dataset), "--model", "fake", "--out", str(base), "--quiet")
    assert result.exit_code == 0, result.output
    answers.flaky = ("France",)
    result = invoke(
        fake, str(dataset), "--model", "fake", "--baseline", str(base), "--max-regressions", "0",
        "--json",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    marks = {c["id"]: (c["baseline"], c["baseline_pass_rate"]) for c in report["cases"]}
    assert marks == {"france": ("regressed", 1.0), "japan": ("unchanged", 1.0)}
    comparison = report["comparison"]
    assert comparison["regressed"] == ["france"]
    assert comparison["beyond_noise"] is False  # one case moved: a sign test cannot tell
    assert report["gates"][-1] == {
        "gate": "regressions <= 0", "ok": False, "reason": "1 regressed: france",
    }  # fmt: skip
    shown = invoke(None, "compare", str(base), str(tmp_path / "new.json"))
    assert shown.exit_code == 2
    assert "no such report" in shown.output


def test_compare_prints_the_paired_comparison(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, answers = server
    dataset = write(tmp_path)
    answers.flaky = ()
    invoke(fake, str(dataset), "--model", "fake", "--out", str(tmp_path / "a.json"), "-q")
    answers.flaky = ("France",)
    invoke(fake, str(dataset), "--model", "fake", "--out", str(tmp_path / "b.json"), "-q")
    result = invoke(None, "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert result.exit_code == 0, result.output
    assert "regressed (1.00 -> 0.50)" in result.stdout
    assert (
        "1 regressed, 0 improved, 1 unchanged; within noise (sign test p = 1.000)" in result.stdout
    )
    data = json.loads(
        invoke(None, "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json").stdout
    )
    assert data["regressed"] == ["france"]
    assert [c["baseline"] for c in data["cases"]] == ["regressed", "unchanged"]


def test_record_then_replay_gives_the_same_results_with_no_request(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, _ = server
    dataset = write(tmp_path)
    recordings = tmp_path / "recordings"
    live = invoke(fake, str(dataset), "--model", "fake", "--record", str(recordings), "--json")
    assert live.exit_code == 0, live.output
    requests = len(fake.requests)
    replayed = invoke(None, str(dataset), "--replay", str(recordings), "--json")
    assert replayed.exit_code == 0, replayed.output
    assert len(fake.requests) == requests  # not one request reached the server

    def outcomes(output: str) -> list[Any]:
        report = json.loads(output)
        return [
            (c["id"], c["passed"], c["failed"], [r["outcome"] for r in c["results"]])
            for c in report["cases"]
        ]

    assert outcomes(replayed.stdout) == outcomes(live.stdout)
    assert json.loads(replayed.stdout)["mode"] == "replay"


def test_a_changed_prompt_in_a_replay_is_an_error_naming_the_call(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, _ = server
    dataset, recordings = record(fake, tmp_path)
    recipe = tmp_path / "capital.yaml"
    recipe.write_text(recipe.read_text().replace("city only", "city name only"))
    requests = len(fake.requests)
    result = invoke(None, str(dataset), "--replay", str(recordings), "--json")
    assert result.exit_code == 1  # errors fail the eval
    assert len(fake.requests) == requests
    report = json.loads(result.stdout)
    assert report["errors"] == 8
    assert report["pass_rate"] is None
    reason = report["cases"][0]["failures"][0]["reason"]
    assert reason == (
        "the prompt of model call 1 of step 'answer' (scope 'answer#1') differs from the "
        "recording: the recipe, the inputs or a prompt changed since it was recorded; record "
        "the eval again"
    )
    assert report["gates"][0]["ok"] is False


def test_a_replay_with_more_repeats_than_recorded_is_an_error_naming_the_run(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, _ = server
    dataset, recordings = record(fake, tmp_path)
    result = invoke(None, str(dataset), "--replay", str(recordings), "--repeat", "5", "--json")
    assert result.exit_code == 1
    france = json.loads(result.stdout)["cases"][0]
    assert (france["passed"], france["failed"], france["errors"]) == (2, 2, 1)
    reason = france["failures"][-1]["reason"]
    assert reason.startswith("no recording of case 'france' run 5 (")
    assert reason.endswith("record the eval with --record, with at least as many repeats")


def test_a_new_step_in_a_replay_misses_and_names_the_call(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, _ = server
    dataset, recordings = record(fake, tmp_path)
    recipe = tmp_path / "capital.yaml"
    recipe.write_text(
        recipe.read_text() + '  - {id: check, depends_on: [answer], goal: "Check it."}\n'
    )
    result = invoke(None, str(dataset), "--replay", str(recordings), "--json")
    report = json.loads(result.stdout)
    assert report["errors"] == 8
    assert report["cases"][0]["failures"][0]["reason"] == (
        "the recording has no reply for model call 1 of step 'check' (scope 'check#1'); record "
        "the run again"
    )


def test_the_progress_says_each_case_run_in_a_pipe(
    tmp_path: Path, server: tuple[FakeOpenAIServer, Alternating]
) -> None:
    fake, _ = server
    result = invoke(fake, str(write(tmp_path)), "--model", "fake", "--concurrency", "1")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == "eval capitals: 2 cases x repeats = 8 case runs on capital, model fake"
    assert lines[1].startswith("[1/8] france #1 passed (run ")
    assert lines[3].startswith("[3/8] france #2 failed (run ")
    assert lines[3].endswith("): output is 'Lyon', expected 'Paris'")
    assert result.stdout.splitlines()[1].split() == [
        "france", "4", "2", "0.50", "1.00", "0.00", "flaky", str(report_tokens(result.stdout)),
    ]  # fmt: skip
    assert (
        "pass rate 0.75 (95% CI 0.41-0.93) over 8 graded runs of 2 cases; 0 errors;"
        in result.stdout
    )


def report_tokens(table: str) -> int:
    return int(table.splitlines()[1].split()[-1].replace(",", ""))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replay", "nowhere"], "--replay 'nowhere': no such folder of recordings"),
        (["--record", "r", "--replay", "r"], "--record and --replay cannot be used together"),
        (["--max-regressions", "0"], "--max-regressions needs --baseline REPORT.json"),
        (["--min-pass-rate", "1.5"], "--min-pass-rate '1.5': give a fraction from 0 to 1"),
        (
            ["--max-cost-increase", "10%"],
            "--max-cost-increase needs --baseline REPORT.json and --prices FILE",
        ),
        (["--baseline", "capital.yaml"], "is not JSON"),
        ([], "recipe 'capital' names no model: give --model MODEL"),
        (["--junit", "no/such/dir/j.xml"], "--junit 'no/such/dir/j.xml': no such folder"),
    ],
)
def test_bad_input_exits_2_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIONS_MODEL", raising=False)
    write(tmp_path)
    result = invoke(None, "capitals.yaml", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_an_invalid_dataset_exits_2_naming_each_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "recipe: capital.yaml\ncases:\n  - id: a\n    expectd: 1\n")
    result = invoke(None, str(path), "--model", "x")
    assert result.exit_code == 2
    assert "invalid dataset: 1 problem" in result.stderr
    assert (
        "capitals.yaml:4: field 'cases[a].expectd': unknown key 'expectd' (did you mean 'expected'?)"
        in result.stderr
    )


def test_a_judge_without_a_judge_model_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "recipe: capital.yaml\ncases:\n  - id: a\n    inputs: {country: France}\n"
        "    checks: [{judge: Names a city.}]\n",
    )
    result = invoke(None, str(path), "--model", "x")
    assert result.exit_code == 2
    assert "case 'a' has a judge: check: give --judge-model MODEL" in result.stderr
