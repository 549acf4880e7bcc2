"""A report against a baseline, and the gates that decide an eval's exit code."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from minions.evals._report import BaselineMark, CaseReport, Comparison, EvalReport, GateReport
from minions.evals._stats import fisher_exact, sign_test

__all__ = ["Gates", "apply_gates", "compare_reports"]

ALPHA = 0.05


def _name(case: CaseReport, several: bool) -> str:
    return f"{case.target}/{case.id}" if several else case.id


def _change(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    if before == 0:
        return 0.0 if after == 0 else None
    return (after - before) / before


def compare_reports(baseline: EvalReport, report: EvalReport, *, name: str = "") -> EvalReport:
    """`report` with each case marked against the same case of `baseline` (paired by target
    and id): ``regressed`` when its pass rate went down, ``improved`` when it went up,
    ``unchanged`` otherwise, with Fisher's exact p-value of the case; and the comparison in
    total: whether the change is beyond noise (an exact sign test on the cases that moved).
    """
    before = {c.key: c for c in baseline.cases}
    several = len({c.target for c in (*baseline.cases, *report.cases)}) > 1
    marks: dict[BaselineMark, list[str]] = {"regressed": [], "improved": [], "unchanged": []}
    new, cases = [], []
    for case in report.cases:
        old = before.get(case.key)
        if old is None:
            new.append(_name(case, several))
            cases.append(case.model_copy(update={"baseline": None}))
            continue
        mark: BaselineMark | None = None
        p_value = None
        if old.pass_rate is not None and case.pass_rate is not None:
            if case.pass_rate < old.pass_rate:
                mark = "regressed"
            elif case.pass_rate > old.pass_rate:
                mark = "improved"
            else:
                mark = "unchanged"
            marks[mark].append(_name(case, several))
            p_value = fisher_exact(old.passed, old.failed, case.passed, case.failed)
        cases.append(
            case.model_copy(
                update={
                    "baseline": mark,
                    "baseline_pass_rate": old.pass_rate,
                    "p_value": p_value,
                    "baseline_run_id": _paired_run(old),
                }
            )
        )
    now = {c.key for c in report.cases}
    missing = [_name(c, several) for c in baseline.cases if c.key not in now]
    p_value = sign_test(len(marks["regressed"]), len(marks["improved"]))
    change = None
    if baseline.pass_rate is not None and report.pass_rate is not None:
        change = report.pass_rate - baseline.pass_rate
    comparison = Comparison(
        baseline=name or baseline.dataset,
        regressed=marks["regressed"],
        improved=marks["improved"],
        unchanged=marks["unchanged"],
        new=new,
        missing=missing,
        pass_rate_change=change,
        p_value=p_value,
        beyond_noise=p_value < ALPHA,
        tokens_change=_change(baseline.usage.get("total_tokens"), report.usage.get("total_tokens")),
        cost_change=_change(baseline.cost, report.cost),
    )
    return report.model_copy(update={"cases": cases, "comparison": comparison})


def _paired_run(case: CaseReport) -> str | None:
    """The run of a baseline's case that a run of the new report is compared with: one that
    passed, else its first."""
    passed = [r.run_id for r in case.results if r.outcome == "passed"]
    found = passed or case.run_ids
    return found[0] if found else None


@dataclass(frozen=True, kw_only=True)
class Gates:
    """What an eval must show to pass (its exit code 0).

    Attributes:
        min_pass_rate: the total pass rate at least this (0 to 1).
        max_regressions: at most this many cases regressed against the baseline.
        max_cost_increase: cost at most this much more than the baseline's (0.1 is 10 %).
        max_errors: at most this many case runs that could not be graded (0 by default:
            a check or a replay that cannot run fails the eval, never passes silently).
    """

    min_pass_rate: float | None = None
    max_regressions: int | None = None
    max_cost_increase: float | None = None
    max_errors: int = 0


def _percent(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def apply_gates(report: EvalReport, gates: Gates) -> EvalReport:
    """`report` with its gates checked: each one holds or not, with the numbers."""
    results: list[GateReport] = []
    add = results.append
    add(
        GateReport(
            gate=f"errors <= {gates.max_errors}",
            ok=report.errors <= gates.max_errors,
            reason=f"{report.errors} case runs could not be graded" + _first_errors(report.cases),
        )
    )
    if report.stopped or report.not_started:
        add(
            GateReport(
                gate="complete",
                ok=False,
                reason=report.note
                or f"{report.stopped + report.not_started} case runs did not finish",
            )
        )
    if gates.min_pass_rate is not None:
        rate = report.pass_rate
        add(
            GateReport(
                gate=f"pass rate >= {gates.min_pass_rate:.0%}",
                ok=rate is not None and rate >= gates.min_pass_rate,
                reason=f"pass rate {_percent(rate)} ({report.passed} of "
                f"{report.passed + report.failed} graded runs)",
            )
        )
    comparison = report.comparison
    if gates.max_regressions is not None:
        regressed = comparison.regressed if comparison is not None else []
        add(
            GateReport(
                gate=f"regressions <= {gates.max_regressions}",
                ok=comparison is not None and len(regressed) <= gates.max_regressions,
                reason="no baseline to compare with"
                if comparison is None
                else f"{len(regressed)} regressed"
                + (f": {', '.join(regressed)}" if regressed else ""),
            )
        )
    if gates.max_cost_increase is not None:
        change = comparison.cost_change if comparison is not None else None
        if comparison is None:
            reason, ok = "no baseline to compare with", False
        elif change is None:
            reason, ok = (
                "cannot be checked: the cost of "
                + ("the baseline" if report.cost is not None else "this eval")
                + f" is unknown ({report.cost_note or 'no prices for the baseline'})",
                False,
            )
        else:
            reason, ok = (
                f"cost {change:+.1%} against the baseline",
                change <= gates.max_cost_increase,
            )
        add(
            GateReport(gate=f"cost increase <= {gates.max_cost_increase:.0%}", ok=ok, reason=reason)
        )
    return report.model_copy(update={"gates": results})


def _first_errors(cases: Iterable[CaseReport]) -> str:
    for case in cases:
        for failure in case.failures:
            if failure.kind == "error":
                return f" (first: case {case.id!r}: {failure.reason})"
    return ""
