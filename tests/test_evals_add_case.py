"""`minions eval add-case`: a stored run becomes a case of a dataset, its text appended with
the file's comments and layout kept; and a dataset as pytest tests."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from evals_helpers import Alternating, write
from runs_helpers import run_here
from typer.testing import CliRunner

from minions.cli._app import app
from minions.evals import Case, Dataset, EvalCase, load_dataset
from minions.runs import RunStore
from minions.testing import FunctionModel

DATASET = """\
# Capitals, by hand.
recipe: capital.yaml   # the recipe under test
repeat: 2

cases:
  # The easy one.
  - id: france
    inputs: {country: France}
    expected: Paris

    # a note after the last case
# trailing comment at the top level
judge_model: null
"""


def stored_run(tmp_path: Path, country: str, answer: str) -> tuple[str, str]:
    """A completed run of the capital recipe in a store: (database url, run id)."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def go() -> str:
        store = RunStore(url, create=True)
        try:
            run_id, _ = await store.submit(tmp_path / "capital.yaml", {"country": country})
            await run_here(url, run_id, model=FunctionModel(lambda prompt: answer))
            assert (await store.get(run_id)).status == "completed"
            return run_id
        finally:
            await store.aclose()

    return url, asyncio.run(go())


def test_a_stored_run_is_appended_as_a_case_keeping_comments(tmp_path: Path) -> None:
    path = write(tmp_path, DATASET)
    url, run_id = stored_run(tmp_path, "Peru", "Lima")
    before = path.read_text()
    result = CliRunner().invoke(
        app, ["eval", "add-case", run_id, str(path), "--id", "peru", "--database-url", url]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"added case 'peru' to {path} (from run {run_id}, completed)")
    after = path.read_text()
    day = time.strftime("%Y-%m-%d")
    block = (
        f"  # from run {run_id} of capital (completed, {day}): check that `expected` is what "
        "it should be\n"
        '  - id: "peru"\n'
        '    inputs: {"country": "Peru"}\n'
        '    expected: "Lima"\n'
    )
    assert after == before.replace("expected: Paris\n", "expected: Paris\n" + block)
    dataset = load_dataset(path)
    assert [c.id for c in dataset.cases] == ["france", "peru"]
    assert dataset.cases[1].expected == "Lima"
    again = CliRunner().invoke(
        app, ["eval", "add-case", run_id, str(path), "--id", "peru", "--database-url", url]
    )
    assert again.exit_code == 2
    assert "a case has the id 'peru' already: give another with --id" in again.stderr
    assert path.read_text() == after


def test_an_unknown_run_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, DATASET)
    url, _ = stored_run(tmp_path, "Peru", "Lima")
    result = CliRunner().invoke(app, ["eval", "add-case", "nope", str(path), "--database-url", url])
    assert result.exit_code == 2
    assert "nope" in result.stderr


# -- pytest --------------------------------------------------------------------------------------


def test_dataset_cases_runs_one_test_per_case_failing_with_the_reasons(tmp_path: Path) -> None:
    from minions import AgentRecipe, DefaultStep

    recipe = AgentRecipe(
        id="capital", steps=[DefaultStep("answer", "The capital of {{ inputs.country }}?")]
    )
    dataset = Dataset(
        recipe,
        [Case(id="france", inputs={"country": "France"}, expected="Paris"),
         Case(id="japan", inputs={"country": "Japan"}, expected="Tokyo")],
        repeat=2,
    )  # fmt: skip
    from minions.evals import dataset_cases

    marker = dataset_cases(dataset, live=True, model=Alternating().model())
    cases: list[EvalCase] = list(marker.args[1])
    assert [repr(c) for c in cases] == ["france", "japan"]
    with pytest.raises(AssertionError) as failed:
        cases[0].check()
    head, reason = str(failed.value).splitlines()
    assert head == "case 'france': passed 1 of 2 runs (pass rate 0.50, 0 errors)"
    assert reason.startswith("  failed: expected: output is 'Lyon', expected 'Paris' (run ")
    assert cases[1].check().passed == 2
    with pytest.raises(ValueError, match="give replay=FOLDER"):
        dataset_cases(dataset)
