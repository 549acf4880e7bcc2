"""`minions eval`: run a dataset's cases, report, compare with a baseline, gate the exit code;
`minions eval compare` and `minions eval add-case` (see docs/evals.md).

Exit codes: 0 every gate holds, 1 a gate fails, 2 bad input (nothing ran), 130 interrupted.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from minions.cli._common import DatabaseOption, ProjectOption, cli_who, open_store, stdout
from minions.cli._errors import UsageError
from minions.cli._loop import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, event_loop
from minions.cli._report import plural
from minions.models import MODEL_ENV, Model

if TYPE_CHECKING:
    from minions.evals import CaseRunFinished, CaseRunStarted, Dataset, EvalReport

__all__: list[str] = []


class EvalGroup(TyperGroup):
    """``minions eval DATASET ...`` is ``minions eval run DATASET ...``; ``compare`` and
    ``add-case`` are commands of their own."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


EVAL_HELP = (
    "Run a dataset of cases on a recipe, repeated, graded by checks; compare with a "
    "baseline and gate the exit code (minions eval DATASET.yaml). Exit codes: 0 every gate "
    "holds, 1 a gate fails, 2 bad input, 130 interrupted."
)


def _err() -> Console:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = max(console.width, 200)
    return console


def _fraction(text: str, option: str) -> float:
    """``0.8`` or ``80%`` as 0.8."""
    given = text.strip()
    try:
        value = float(given.removesuffix("%")) / (100 if given.endswith("%") else 1)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise UsageError(
            f"{option} {text!r}: give a fraction from 0 to 1 or a percentage, e.g. 0.8 or 80%"
        )
    return value


def _percent(text: str, option: str) -> float:
    """``10%`` or ``10`` as 0.1."""
    try:
        value = float(text.strip().removesuffix("%")) / 100
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise UsageError(f"{option} {text!r}: give a percentage, e.g. 10%")
    return value


def _prices(path: Path) -> dict[str, dict[str, float]]:
    """A prices file: ``MODEL: {input: DOLLARS, output: DOLLARS}`` per million tokens."""
    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    from minions._yaml import load_yaml

    class Price(BaseModel):
        model_config = ConfigDict(extra="forbid")
        input: float = Field(ge=0)
        output: float = Field(ge=0)

    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path)).data
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prices {str(path)!r}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(
            f"--prices {str(path)!r}: give MODEL: {{input: $, output: $}} per million tokens"
        )
    prices = {}
    for name, price in data.items():
        try:
            prices[str(name)] = Price.model_validate(price).model_dump()
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "price"
            raise UsageError(
                f"--prices {str(path)!r}: model {name!r}: {where}: {first['msg']}"
            ) from None
    return prices


def _writable(path: Path | None, option: str) -> None:
    if path is not None and not path.parent.is_dir():
        raise UsageError(f"{option} {str(path)!r}: no such folder {str(path.parent)!r}")


def _resolver(ctx: typer.Context) -> Callable[[str], Model]:
    """How the command turns model strings into models: the `Settings` object the command
    was given (``CliRunner().invoke(app, ..., obj=Settings(...))``), else `infer_model`."""
    from minions.models import infer_model

    resolve = getattr(ctx.obj, "resolve_model", None)
    return resolve if callable(resolve) else infer_model


def _resolved(resolve: Callable[[str], Model], spec: str | None, option: str) -> Model | None:
    """The model `spec` names, or a usage error saying why it cannot be used."""
    from minions.errors import MinionsError

    if spec is None:
        return None
    try:
        return resolve(spec)
    except MinionsError as exc:
        raise UsageError(f"cannot use model {spec!r} ({option}): {exc}") from None


def _needs_a_model(dataset: Dataset) -> str | None:
    """A target that would call a model and names none (no `--model`, no `MINIONS_MODEL`)."""
    from minions.cli._model_choice import needs_model

    if os.environ.get(MODEL_ENV):
        return None
    for target in dataset.targets:
        if target.recipe.model is None and needs_model(target.recipe.steps):
            return target.id
    return None


def _uses_judge(dataset: Dataset) -> list[str]:
    from minions.evals import JudgeCheck

    return [
        case.id
        for case in dataset.cases
        if any(isinstance(c, JudgeCheck) for c in case.all_checks(dataset.checks))
    ]


class _Progress:
    """Progress of the case runs on stderr: a bar on a terminal, a line per finished case run
    in a pipe."""

    def __init__(self, err: Console, *, quiet: bool, total: int) -> None:
        self.err = err
        self.quiet = quiet
        self.bar: Progress | None = None
        self.task: Any = None
        self.passed = self.failed = self.errors = 0
        if not quiet and err.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]eval"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            )
            self.task = self.bar.add_task("", total=total)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, event: CaseRunStarted | CaseRunFinished) -> None:
        from minions.evals import CaseRunFinished

        if self.quiet or not isinstance(event, CaseRunFinished):
            return
        graded = event.graded
        run = graded.run
        outcome = graded.outcome
        self.passed += outcome == "passed"
        self.failed += outcome == "failed"
        self.errors += outcome == "error"
        if self.bar is not None:
            counts = f"{self.passed} passed, {self.failed} failed, {self.errors} errors"
            self.bar.update(self.task, completed=event.done, description=counts)
            if outcome == "error":
                self.bar.console.print(
                    f"error: {run.case.id} #{run.repetition}: {graded.reason}", markup=False
                )
            return
        reason = f": {graded.reason}" if graded.reason and outcome != "passed" else ""
        self.err.print(
            f"[{event.done}/{event.total}] {run.case.id} #{run.repetition} {outcome} "
            f"(run {run.run_id}, {run.usage.total_tokens} tokens, {run.duration:.2f}s){reason}",
            markup=False,
        )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report_table(report: EvalReport) -> Table:
    """The cases of a report, one row each."""
    several = len({c.target for c in report.cases}) > 1
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    if several:
        table.add_column("target")
    for name in (
        "case",
        "runs",
        "passed",
        "rate",
        f"pass@{report.k}",
        f"pass^{report.k}",
        "flaky",
        "errors",
        "tokens",
    ):
        table.add_column(name, justify="left" if name == "case" else "right")
    baseline = report.comparison is not None
    if baseline:
        table.add_column("baseline")
    for case in report.cases:
        row = [case.target] if several else []
        row += [
            case.id,
            str(case.runs),
            str(case.passed),
            _rate(case.pass_rate),
            _rate(case.pass_at_k),
            _rate(case.pass_hat_k),
            "flaky" if case.flaky else "",
            str(case.errors) if case.errors else "",
            f"{case.tokens:,}",
        ]
        if baseline:
            mark: str = case.baseline or "new"
            if case.baseline in ("regressed", "improved"):
                mark += f" ({_rate(case.baseline_pass_rate)} -> {_rate(case.pass_rate)})"
            row.append(mark)
        table.add_row(*row)
    return table


def comparison_line(report: EvalReport) -> str | None:
    """The comparison with the baseline in one line, if there is one."""
    comparison = report.comparison
    if comparison is None:
        return None
    change = comparison.pass_rate_change
    shown = "" if change is None else f"pass rate {change:+.2f}; "
    noise = "beyond noise" if comparison.beyond_noise else "within noise"
    return (
        f"against {comparison.baseline}: {shown}{len(comparison.regressed)} regressed, "
        f"{len(comparison.improved)} improved, {len(comparison.unchanged)} unchanged; "
        f"{noise} (sign test p = {comparison.p_value:.3f})"
    )


def summary_lines(report: EvalReport) -> list[str]:
    """What the report says in total, its first failure per case, and its gates."""
    lines = []
    several = len({c.target for c in report.cases}) > 1
    for case in report.cases:
        name = f"{case.target}/{case.id}" if several else case.id
        seen = set()
        for failure in case.failures:
            if failure.check in seen:
                continue
            seen.add(failure.check)
            lines.append(
                f"  {name}: {failure.kind}: {failure.check}: {failure.reason} "
                f"(run {failure.run_id})"
            )
    rate = "no graded run"
    if report.pass_rate is not None and report.interval is not None:
        low, high = report.interval
        rate = f"pass rate {report.pass_rate:.2f} (95% CI {low:.2f}-{high:.2f})"
    cost = f"cost ${report.cost:.4f}" if report.cost is not None else f"cost {report.cost_note}"
    lines.append(
        f"{rate} over {plural(report.passed + report.failed, 'graded run')} of "
        f"{plural(len(report.cases), 'case')}; {report.errors} errors; "
        f"{report.usage.get('total_tokens', 0):,} tokens; {cost}; {report.duration:.2f}s"
        + (" (replay)" if report.mode == "replay" else "")
    )
    if report.note:
        lines.append(f"stopped: {report.note}")
    line = comparison_line(report)
    if line is not None:
        lines.append(line)
    for gate in report.gates:
        lines.append(f"gate {gate.gate}: {'ok' if gate.ok else 'FAILED'} ({gate.reason})")
    return lines


def eval_command(
    ctx: typer.Context,
    dataset_path: Annotated[
        Path, typer.Argument(metavar="DATASET.yaml", help="The dataset file.", show_default=False)
    ],
    repeat: Annotated[
        int | None,
        typer.Option(
            "--repeat",
            metavar="N",
            min=1,
            max=1000,
            help="Runs of each case (default: the dataset's).",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            metavar="MODEL",
            help="Answer every model the recipes name with this one (A/B of models). "
            "Default: the recipes' own, else $MINIONS_MODEL.",
            show_default=False,
        ),
    ] = None,
    judge_model: Annotated[
        str | None,
        typer.Option(
            "--judge-model",
            metavar="MODEL",
            help="The model grading judge: rubrics (default: the dataset's judge_model).",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", metavar="K", min=1, max=256, help="Case runs at once.")
    ] = 4,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            metavar="DIR",
            help="Keep each case run's recording (and the judge's verdicts) in DIR.",
            show_default=False,
        ),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            metavar="DIR",
            help="Run the whole eval from the recordings in DIR, offline: no model is called.",
            show_default=False,
        ),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            metavar="REPORT.json",
            help="Mark each case regressed, improved or unchanged against this report.",
            show_default=False,
        ),
    ] = None,
    min_pass_rate: Annotated[
        str | None,
        typer.Option(
            "--min-pass-rate",
            metavar="X",
            help="Gate: the total pass rate at least X (0.8 or 80%).",
            show_default=False,
        ),
    ] = None,
    max_regressions: Annotated[
        int | None,
        typer.Option(
            "--max-regressions",
            metavar="N",
            min=0,
            help="Gate: at most N cases regressed (needs --baseline).",
            show_default=False,
        ),
    ] = None,
    max_cost_increase: Annotated[
        str | None,
        typer.Option(
            "--max-cost-increase",
            metavar="P%",
            help="Gate: cost at most P% over the baseline's (needs --baseline and --prices).",
            show_default=False,
        ),
    ] = None,
    max_errors: Annotated[
        int,
        typer.Option(
            "--max-errors",
            metavar="N",
            min=0,
            help="Gate: at most N case runs that could not be graded.",
        ),
    ] = 0,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            metavar="N",
            min=1,
            help="Tokens for the whole eval; once used it stops, saying what ran.",
            show_default=False,
        ),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option(
            "--prices",
            metavar="FILE",
            help="Dollars per million tokens by model (YAML: MODEL: {input: 0.15, "
            "output: 0.6}), for the cost.",
            show_default=False,
        ),
    ] = None,
    k: Annotated[
        int | None,
        typer.Option(
            "--k",
            metavar="K",
            min=1,
            help="The k of pass@k and pass^k (default: the repeat).",
            show_default=False,
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON, and nothing else, on stdout.")
    ] = False,
    junit: Annotated[
        Path | None,
        typer.Option(
            "--junit",
            metavar="FILE",
            help="Write a JUnit XML report (a testcase per case).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="REPORT.json",
            help="Write the report as JSON (a baseline for later).",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    durable: Annotated[
        bool,
        typer.Option(
            "--durable",
            help="Run the case runs on the workers of the run store (--database-url): its "
            "limits, budgets and step cache apply; the report is kept there; the same "
            "command started again resumes an eval cut short.",
        ),
    ] = False,
    project: ProjectOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Run every case of a dataset, repeated, and grade each run.

    The table of cases goes to stdout (or the JSON report with --json), progress to stderr.
    """
    from minions.evals import (
        EvalReport,
        Gates,
        apply_gates,
        compare_reports,
        evaluate,
        evaluate_durable,
        junit_xml,
        load_dataset,
    )
    from minions.runs import EvalRecord

    resolve = _resolver(ctx)
    if replay is not None and record is not None:
        raise UsageError("--record and --replay cannot be used together")
    if replay is not None and model is not None:
        raise UsageError("--model and --replay cannot be used together: a replay calls no model")
    if replay is not None and not replay.is_dir():
        raise UsageError(f"--replay {str(replay)!r}: no such folder of recordings")
    if max_regressions is not None and baseline is None:
        raise UsageError("--max-regressions needs --baseline REPORT.json")
    if durable:
        _durable_options(model=model, record=record, replay=replay, max_tokens=max_tokens)
    elif database_url is not None:
        raise UsageError("--database-url goes with --durable (the store whose workers run it)")
    elif project is not None:
        raise UsageError("--project goes with --durable (the project of the eval's runs)")
    cost_gate = _percent(max_cost_increase, "--max-cost-increase") if max_cost_increase else None
    if cost_gate is not None and (baseline is None or prices is None):
        raise UsageError("--max-cost-increase needs --baseline REPORT.json and --prices FILE")
    gates = Gates(
        min_pass_rate=_fraction(min_pass_rate, "--min-pass-rate") if min_pass_rate else None,
        max_regressions=max_regressions,
        max_cost_increase=cost_gate,
        max_errors=max_errors,
    )
    for path, option in ((junit, "--junit"), (out, "--out")):
        _writable(path, option)
    price_table = _prices(prices) if prices is not None else None
    base = EvalReport.load(baseline) if baseline is not None else None
    dataset = load_dataset(dataset_path)
    judging = _uses_judge(dataset)
    if judging and replay is None and judge_model is None and dataset.judge_model is None:
        raise UsageError(
            f"case {judging[0]!r} has a judge: check: give --judge-model MODEL (or judge_model: "
            "in the dataset)"
        )
    chosen = _resolved(resolve, model, "--model")
    if replay is None and chosen is None and not durable:
        lacking = _needs_a_model(dataset)
        if lacking is not None:
            raise UsageError(
                f"recipe {lacking!r} names no model: give --model MODEL, set {MODEL_ENV}, or "
                "--replay DIR to run from recordings"
            )
    judge = _resolved(
        resolve, judge_model or (dataset.judge_model if replay is None else None), "--judge-model"
    )
    err = _err()
    total = sum(dataset.repeats(case, repeat) for case in dataset.cases for _ in dataset.targets)
    if not quiet and not json_output and not err.is_terminal:
        where = (
            f"replay of {replay}"
            if replay is not None
            else f"model {model}"
            if model
            else "the workers of the run store"
            if durable
            else "the recipes' models"
        )
        err.print(
            f"eval {dataset.name}: {plural(len(dataset.cases), 'case')} x repeats = "
            f"{plural(total, 'case run')} on {dataset.target}, {where}",
            markup=False,
        )
    report = None
    opened: dict[str, Any] = {}  # the durable eval's id and runner, once opened
    with event_loop(err) as loop, _Progress(err, quiet=quiet, total=total) as progress:
        common: dict[str, Any] = {
            "judge_model": judge if judge is not None else judge_model,
            "repeat": repeat,
            "concurrency": concurrency,
            "k": k,
            "prices": price_table,
            "resolve": resolve,
            "progress": progress,
        }
        if durable:

            def told(record: EvalRecord, resumed: bool, runner: Any) -> None:
                opened.update(eval_id=record.eval_id, runner=runner)
                if not quiet:
                    said = "resuming eval" if resumed else "eval"
                    err.print(
                        f"{said} {record.eval_id} on the workers of the run store",
                        markup=False,
                    )

            async def on_workers() -> EvalReport:
                store = open_store(database_url, create=True)
                try:
                    return await evaluate_durable(
                        dataset,
                        store,
                        baseline=base,
                        baseline_name=str(baseline) if baseline is not None else "",
                        gates=gates,
                        opened=told,
                        project=project or "default",
                        actor=cli_who(),
                        **common,
                    )
                finally:
                    await store.aclose()

            report = loop.run(on_workers())
        else:
            report = loop.run(
                evaluate(
                    dataset,
                    model=chosen,
                    max_tokens=max_tokens,
                    record=record,
                    replay=replay,
                    **common,
                )
            )
    if report is None:
        resume = (
            f"; its case runs go on on the workers: the same command resumes eval "
            f"{opened['eval_id']}"
            if opened
            else ""
        )
        err.print(
            f"interrupted: {progress.passed + progress.failed + progress.errors} of {total} case "
            f"runs had finished; no report written{resume}",
            style="yellow",
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    if durable and not quiet:
        runner = opened["runner"]
        err.print(
            f"eval {report.eval_id}: {runner.submitted} case runs submitted, {runner.found} "
            "found in the store (submitted before: not run again); its report is kept there",
            markup=False,
        )
    if not durable:  # a durable eval compared and gated its report before keeping it
        if base is not None:
            report = compare_reports(base, report, name=str(baseline))
        report = apply_gates(report, gates)
    if out is not None:
        report.save(out)
    if junit is not None:
        junit.write_text(junit_xml(report), encoding="utf-8")
    if json_output:
        typer.echo(report.to_json())
    else:
        console = stdout()
        console.print(report_table(report))
        for line in summary_lines(report):
            console.print(line, markup=False)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FAILED)


def _durable_options(
    *, model: str | None, record: Path | None, replay: Path | None, max_tokens: int | None
) -> None:
    """What a durable eval cannot take: its case runs run on the store's workers."""
    for given, option, why in (
        (model, "--model", "the workers answer with the recipes' models (or their own --model)"),
        (record, "--record", "the workers keep no recordings"),
        (replay, "--replay", "a replay runs in this process: drop --durable"),
        (max_tokens, "--max-tokens", "the store's budgets apply (docs/limits.md)"),
    ):
        if given is not None:
            raise UsageError(f"--durable cannot take {option}: {why}")


def compare_command(
    base: Annotated[
        Path, typer.Argument(metavar="BASE.json", help="The baseline report.", show_default=False)
    ],
    new: Annotated[
        Path, typer.Argument(metavar="NEW.json", help="The new report.", show_default=False)
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the comparison as JSON.")
    ] = False,
) -> None:
    """Compare two eval reports case by case (paired by case id); runs nothing."""
    from minions.evals import EvalReport, compare_reports

    compared = compare_reports(EvalReport.load(base), EvalReport.load(new), name=str(base))
    comparison = compared.comparison
    assert comparison is not None
    if json_output:
        data = {
            "baseline": str(base),
            "report": str(new),
            **comparison.model_dump(mode="json"),
            "cases": [
                {
                    "id": c.id,
                    "target": c.target,
                    "baseline": c.baseline,
                    "baseline_pass_rate": c.baseline_pass_rate,
                    "pass_rate": c.pass_rate,
                    "p_value": c.p_value,
                }
                for c in compared.cases
            ],
        }
        typer.echo(json.dumps(data, indent=2))
        raise typer.Exit(EXIT_OK)
    console = stdout()
    console.print(report_table(compared))
    console.print(comparison_line(compared) or "", markup=False)
    if comparison.missing:
        console.print(f"not in {new}: {', '.join(comparison.missing)}", markup=False)


def add_case_command(
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", help="A stored run.", show_default=False)
    ],
    dataset_path: Annotated[
        Path,
        typer.Argument(
            metavar="DATASET.yaml", help="The dataset to append to.", show_default=False
        ),
    ],
    case_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            metavar="CASE_ID",
            help="The new case's id (default: run- and the run id's start).",
            show_default=False,
        ),
    ] = None,
    recording: Annotated[
        Path | None,
        typer.Option(
            "--recording",
            metavar="FILE",
            help="A recording of the run (minions run --record) to keep as the case's.",
            show_default=False,
        ),
    ] = None,
    recordings: Annotated[
        Path | None,
        typer.Option(
            "--recordings",
            metavar="DIR",
            help="The eval's recordings folder to keep --recording in "
            "(as CASE_ID/1.recording.json).",
            show_default=False,
        ),
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Append a case made of a stored run to a dataset: its inputs, and its output as
    `expected` (check it). The file's comments and layout stay."""
    from minions.evals import add_case
    from minions.models import Recording
    from minions.runs import RunStore

    if (recording is None) != (recordings is None):
        raise UsageError("--recording FILE and --recordings DIR go together")
    if not dataset_path.is_file():
        raise UsageError(f"no dataset file {str(dataset_path)!r}")
    kept = Recording.load(recording) if recording is not None else None

    async def fetch() -> Any:
        store = RunStore(database_url)
        try:
            return await store.get(run_id)
        finally:
            await store.aclose()

    record = asyncio.run(fetch())
    new_id = add_case(record, dataset_path, case_id=case_id, recording=kept, recordings=recordings)
    where = (
        f"; its recording is {recordings}/{new_id}/1.recording.json"
        if kept is not None
        else ("; the store keeps no model replies, so it runs live until recorded (--record DIR)")
    )
    typer.echo(
        f"added case {new_id!r} to {dataset_path} (from run {run_id}, {record.status}){where}"
    )
