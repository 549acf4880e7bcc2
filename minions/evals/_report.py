"""The report of an eval: per case and in total, as a pydantic model (the JSON of ``--json``
and ``--out``, which a run store can keep as it is)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minions.errors import MinionsError

__all__ = [
    "CaseReport",
    "CheckReport",
    "Comparison",
    "EvalReport",
    "Failure",
    "GateReport",
    "ReportError",
    "RunReport",
]

FORMAT: Literal["minions.eval-report/1"] = "minions.eval-report/1"

RunOutcome = Literal["passed", "failed", "error", "stopped"]
BaselineMark = Literal["regressed", "improved", "unchanged"]


class ReportError(MinionsError):
    """A report file cannot be used (missing, not JSON, not an eval report)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class CheckReport(_Model):
    """What one check said of one run."""

    check: str
    outcome: Literal["passed", "failed", "error"]
    reason: str


class RunReport(_Model):
    """One case run."""

    run_id: str
    repetition: int
    outcome: RunOutcome
    reason: str | None = None
    """Why it failed, could not be graded or was stopped (the first failing check's reason)."""
    tokens: int = 0
    duration: float = 0.0
    checks: list[CheckReport] = Field(default_factory=list)


class Failure(_Model):
    """A check that failed (or could not run: `kind` ``error``) in one run."""

    check: str
    reason: str
    run_id: str
    kind: Literal["failed", "error"] = "failed"


class CaseReport(_Model):
    """One case over its runs.

    `pass_rate` is passed / (passed + failed): runs that could not be graded (`errors`) or
    were stopped are counted apart, never as failures or passes. `pass_at_k` and `pass_hat_k`
    are the unbiased estimates of "at least one of k runs passes" and "k runs all pass"
    (``None`` when fewer than `k` runs were graded).
    """

    id: str
    target: str
    runs: int
    passed: int
    failed: int
    errors: int
    stopped: int = 0
    pass_rate: float | None
    pass_at_k: float | None
    pass_hat_k: float | None = None
    k: int = 1
    flaky: bool
    run_ids: list[str]
    failures: list[Failure] = Field(default_factory=list)
    tokens: int = 0
    duration: float = 0.0
    baseline: BaselineMark | None = None
    baseline_pass_rate: float | None = None
    p_value: float | None = None
    """Fisher's exact test of this case's runs against the baseline's (two-sided)."""
    baseline_run_id: str | None = None
    """The baseline's run of this case to compare a run of it with (one that passed, else
    its first): what the console diffs a regressed case's failed run against."""
    results: list[RunReport] = Field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.target, self.id


class Comparison(_Model):
    """A report against a baseline, case by case (paired by target and case id)."""

    baseline: str
    regressed: list[str] = Field(default_factory=list)
    improved: list[str] = Field(default_factory=list)
    unchanged: list[str] = Field(default_factory=list)
    new: list[str] = Field(default_factory=list)
    """Cases the baseline does not have."""
    missing: list[str] = Field(default_factory=list)
    """Cases of the baseline this report does not have."""
    pass_rate_change: float | None = None
    p_value: float = 1.0
    beyond_noise: bool = False
    method: str = "exact sign test on the cases that moved (two-sided, alpha 0.05)"
    tokens_change: float | None = None
    """The relative change of total tokens (0.1 is 10 % more)."""
    cost_change: float | None = None
    """The relative change of cost, when both costs are known."""


class GateReport(_Model):
    """One gate: what it asks, what the eval gave, whether it holds."""

    gate: str
    ok: bool
    reason: str


class EvalReport(_Model):
    """An eval: every case over its runs, the totals, and (with a baseline) the comparison
    and the gates. ``EvalReport.model_validate_json(text)`` reads one back; `load` reads a
    file."""

    format: Literal["minions.eval-report/1"] = FORMAT
    eval_id: str
    dataset: str
    target: str
    repeat: int
    k: int
    mode: Literal["live", "replay"]
    model: str | None = None
    judge_model: str | None = None
    started_at: float
    finished_at: float
    duration: float
    runs: int
    passed: int
    failed: int
    errors: int
    stopped: int = 0
    not_started: int = 0
    pass_rate: float | None
    interval: list[float] | None
    """The 95 % Wilson interval of `pass_rate`: ``[low, high]``."""
    usage: dict[str, int]
    judge_usage: dict[str, int] = Field(default_factory=dict)
    cost: float | None = None
    cost_note: str | None = None
    """Why `cost` is unknown (no prices, a model without one)."""
    note: str | None = None
    """What stopped the eval early, if something did."""
    cases: list[CaseReport]
    comparison: Comparison | None = None
    gates: list[GateReport] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every gate holds."""
        return all(g.ok for g in self.gates)

    def case(self, case_id: str, target: str | None = None) -> CaseReport:
        """The report of a case.

        Raises:
            KeyError: no such case.
        """
        for case in self.cases:
            if case.id == case_id and (target is None or case.target == target):
                return case
        raise KeyError(case_id)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> EvalReport:
        """Read a report file.

        Raises:
            ReportError: the file is missing, not JSON or not an eval report.
        """
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ReportError(f"no such report {str(file)!r}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"cannot read report {str(file)!r}: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ReportError(f"report {str(file)!r} is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ReportError(f"{str(file)!r} is not a minions eval report ({FORMAT})")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ReportError(
                f"report {str(file)!r} is not a valid eval report: {where}: {first['msg']}"
            ) from None
