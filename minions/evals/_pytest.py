"""A dataset as pytest tests: one per case, failing with its checks' reasons, offline from
recordings by default."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions.evals._dataset import Dataset

if TYPE_CHECKING:
    import pytest

    from minions.evals._report import CaseReport

__all__ = ["EvalCase", "dataset_cases"]


class EvalCase:
    """One case of a dataset, as a pytest parameter: ``case.check()`` runs it (every
    repetition) and fails the test with the reasons of the checks that failed."""

    def __init__(self, dataset: Dataset, case_id: str, options: dict[str, Any]) -> None:
        self.dataset = dataset
        self.id = case_id
        self.options = options

    def run(self) -> CaseReport:
        """Run the case's repetitions; its report."""
        from minions.evals._dataset import Dataset
        from minions.evals._evaluate import evaluate_sync

        case = next(c for c in self.dataset.cases if c.id == self.id)
        only = Dataset(
            list(self.dataset.targets),
            [case],
            name=self.dataset.name,
            inputs=self.dataset.inputs,
            repeat=self.dataset.repeat,
            checks=self.dataset.checks,
            judge_model=self.dataset.judge_model,
            path=self.dataset.path,
        )
        report = evaluate_sync(only, **self.options)
        return report.cases[0]

    def check(self, *, min_pass_rate: float = 1.0) -> CaseReport:
        """Run the case and fail (``AssertionError``) unless its pass rate is at least
        `min_pass_rate` with no error, saying which checks failed and why."""
        report = self.run()
        rate = report.pass_rate
        if report.errors or rate is None or rate < min_pass_rate:
            shown = "none graded" if rate is None else f"{rate:.2f}"
            lines = [
                f"case {self.id!r}: passed {report.passed} of {report.runs} runs "
                f"(pass rate {shown}, {report.errors} errors)"
            ]
            lines += [
                f"  {f.kind}: {f.check}: {f.reason} (run {f.run_id})" for f in report.failures
            ]
            raise AssertionError("\n".join(lines))
        return report

    def __repr__(self) -> str:
        return self.id


def dataset_cases(
    dataset: Dataset | str | Path,
    *,
    replay: str | Path | None = None,
    live: bool = False,
    **options: Any,
) -> pytest.MarkDecorator:
    """The cases of a dataset as pytest parameters, one test each::

        from minions.evals import dataset_cases

        @dataset_cases("evals/capitals.eval.yaml", replay="evals/recordings")
        def test_capitals(case):
            case.check()

    Replays the recordings in `replay` by default (offline, deterministic, free); with
    ``live=True`` the cases run on the recipes' models (or ``model=...``). Other keyword
    arguments go to `evaluate` (``repeat``, ``model``, ``judge_model``...).

    Raises:
        ValueError: neither `replay` nor `live` is given.
    """
    import pytest

    from minions.evals._load import load_dataset

    loaded = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    if replay is None and not live:
        raise ValueError("give replay=FOLDER (the recordings to run from) or live=True")
    if replay is not None and not live:
        options["replay"] = replay
    cases = [EvalCase(loaded, case.id, options) for case in loaded.cases]
    return pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])
