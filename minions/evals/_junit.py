"""An eval report as JUnit XML: a testsuite per target, a testcase per case."""

from __future__ import annotations

from collections.abc import Iterable
from xml.etree import ElementTree

from minions.evals._report import CaseReport, EvalReport

__all__ = ["junit_xml"]


def _verdict(case: CaseReport) -> str:
    rate = "no graded run" if case.pass_rate is None else f"pass rate {case.pass_rate:.2f}"
    flaky = ", flaky" if case.flaky else ""
    errors = f", {case.errors} could not be graded" if case.errors else ""
    return f"passed {case.passed} of {case.runs} runs ({rate}{flaky}{errors})"


def _details(case: CaseReport) -> str:
    lines = [f"{f.run_id}: {f.check}: {f.reason}" for f in case.failures]
    return "\n".join(lines)


def junit_xml(report: EvalReport) -> str:
    """The report as JUnit XML. A case is a testcase: an ``error`` when a run of it could not
    be graded, a ``failure`` when a run of it failed (its message says how many passed),
    ``skipped`` when none of its runs finished; its properties hold the pass rate, pass@k
    and flakiness."""
    root = ElementTree.Element(
        "testsuites",
        name=report.dataset,
        tests=str(len(report.cases)),
        failures=str(sum(1 for c in report.cases if c.failed and not c.errors)),
        errors=str(sum(1 for c in report.cases if c.errors)),
        time=f"{report.duration:.3f}",
    )
    targets: dict[str, list[CaseReport]] = {}
    for case in report.cases:
        targets.setdefault(case.target, []).append(case)
    for target, cases in targets.items():
        _suite(root, report, target, cases)
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, "unicode") + "\n"


def _suite(
    root: ElementTree.Element, report: EvalReport, target: str, cases: Iterable[CaseReport]
) -> None:
    cases = list(cases)
    suite = ElementTree.SubElement(
        root,
        "testsuite",
        name=f"{report.dataset}.{target}",
        tests=str(len(cases)),
        failures=str(sum(1 for c in cases if c.failed and not c.errors)),
        errors=str(sum(1 for c in cases if c.errors)),
        skipped=str(sum(1 for c in cases if not c.runs)),
        time=f"{sum(c.duration for c in cases):.3f}",
    )
    for case in cases:
        element = ElementTree.SubElement(
            suite,
            "testcase",
            name=case.id,
            classname=f"{report.dataset}.{target}",
            time=f"{case.duration:.3f}",
        )
        properties = ElementTree.SubElement(element, "properties")
        for name, value in (
            ("runs", case.runs),
            ("passed", case.passed),
            ("pass_rate", case.pass_rate),
            ("pass_at_k", case.pass_at_k),
            ("k", case.k),
            ("flaky", case.flaky),
            ("baseline", case.baseline),
            ("run_ids", " ".join(case.run_ids)),
        ):
            if value is not None:
                ElementTree.SubElement(
                    properties,
                    "property",
                    name=name,
                    value=str(value).lower() if isinstance(value, bool) else str(value),
                )
        if case.errors:
            ElementTree.SubElement(
                element, "error", message=_verdict(case), type="error"
            ).text = _details(case)
        elif case.failed:
            ElementTree.SubElement(
                element, "failure", message=_verdict(case), type="failure"
            ).text = _details(case)
        elif not case.runs:
            ElementTree.SubElement(element, "skipped", message="no run of this case finished")
