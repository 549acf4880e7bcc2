"""Evals: know whether an agent is good, and whether a change made it better.

A `Dataset` names a target recipe (or several) and its `Case` objects: inputs, the output
expected, and checks (`ExprCheck`: a JMESPath predicate over the run's result; `TrajectoryCheck`:
which tools and steps, in which order, within which bounds; `JudgeCheck`: a rubric a model
grades; `FunctionCheck`: a Python scorer). `evaluate` runs every repetition of every case as a
real run, grades it, and returns an `EvalReport`: pass rates with a Wilson interval, pass@k and
pass^k, flaky cases, the failing checks with their reasons. `compare_reports` marks each case
against a baseline and `apply_gates` decides whether the eval passes. See docs/evals.md.

    from minions.evals import Case, Dataset, ExprCheck, evaluate

    dataset = Dataset(recipe, [Case(id="france", inputs={"country": "France"}, expected="Paris")])
    report = await evaluate(dataset, model="openai:gpt-4o-mini", repeat=4)
    print(report.pass_rate, report.case("france").flaky)

The same from YAML: ``load_dataset("capitals.eval.yaml")``, or ``minions eval`` on the command
line.
"""

from minions.evals._add_case import add_case, case_text
from minions.evals._checks import (
    Check,
    CheckResult,
    ExpectedCheck,
    ExprCheck,
    FunctionCheck,
    Grading,
    JudgeCheck,
    ToolExpectation,
    TrajectoryCheck,
)
from minions.evals._compare import Gates, apply_gates, compare_reports
from minions.evals._dataset import NOT_GIVEN, Case, Dataset, DatasetError, Target
from minions.evals._durable import DurableRunner, evaluate_durable
from minions.evals._evaluate import (
    CaseRunFinished,
    CaseRunStarted,
    GradedRun,
    evaluate,
    evaluate_sync,
)
from minions.evals._judge import Judge, Verdict
from minions.evals._junit import junit_xml
from minions.evals._load import load_dataset, parse_dataset
from minions.evals._pytest import EvalCase, dataset_cases
from minions.evals._report import (
    CaseReport,
    CheckReport,
    Comparison,
    EvalReport,
    Failure,
    GateReport,
    ReportError,
    RunReport,
)
from minions.evals._run import CaseRun
from minions.evals._runner import CaseJob, CaseRunner, ForegroundRunner, TokenBudget
from minions.evals._stats import pass_at_k, pass_hat_k, wilson_interval

__all__ = [
    # datasets
    "NOT_GIVEN",
    "Case",
    "Dataset",
    "DatasetError",
    "Target",
    "load_dataset",
    "parse_dataset",
    "add_case",
    "case_text",
    # checks
    "Check",
    "CheckResult",
    "ExpectedCheck",
    "ExprCheck",
    "FunctionCheck",
    "Grading",
    "JudgeCheck",
    "ToolExpectation",
    "TrajectoryCheck",
    "Judge",
    "Verdict",
    # running
    "CaseJob",
    "CaseRun",
    "CaseRunFinished",
    "CaseRunStarted",
    "CaseRunner",
    "DurableRunner",
    "ForegroundRunner",
    "GradedRun",
    "TokenBudget",
    "evaluate",
    "evaluate_durable",
    "evaluate_sync",
    # reports
    "CaseReport",
    "CheckReport",
    "Comparison",
    "EvalReport",
    "Failure",
    "GateReport",
    "Gates",
    "ReportError",
    "RunReport",
    "apply_gates",
    "compare_reports",
    "junit_xml",
    "pass_at_k",
    "pass_hat_k",
    "wilson_interval",
    # pytest
    "EvalCase",
    "dataset_cases",
]
