"""`evaluate`: every repetition of every case as a real run, graded by its checks, summed up
in an `EvalReport`."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from minions._messages import Usage
from minions._sync import run_sync
from minions.errors import ConfigError
from minions.evals._checks import Check, CheckResult, Grading, run_check
from minions.evals._dataset import Dataset
from minions.evals._judge import Judge
from minions.evals._report import CaseReport, CheckReport, EvalReport, Failure, RunReport
from minions.evals._run import CaseRun
from minions.evals._runner import CaseJob, CaseRunner, ForegroundRunner, TokenBudget
from minions.evals._stats import pass_at_k, pass_hat_k, wilson_interval

if TYPE_CHECKING:
    from minions._step.settings import RunSettings
    from minions.events import EventListener
    from minions.models import Model

__all__ = ["CaseRunFinished", "CaseRunStarted", "GradedRun", "evaluate", "evaluate_sync"]

Prices = Mapping[str, Mapping[str, float]]
"""Dollars per million tokens by model name: ``{"gpt-4o-mini": {"input": 0.15, "output":
0.6}}``."""


@dataclass(frozen=True, kw_only=True)
class GradedRun:
    """A case run and what its checks said."""

    run: CaseRun
    outcome: Literal["passed", "failed", "error", "stopped"]
    checks: tuple[CheckResult, ...] = ()

    @property
    def reason(self) -> str | None:
        """Why it did not pass."""
        if self.outcome == "stopped":
            return "stopped: the eval's token budget was used"
        if self.run.problem is not None:
            return self.run.problem
        for result in self.checks:
            if result.outcome == self.outcome:
                return result.reason
        return None


@dataclass(frozen=True, kw_only=True)
class CaseRunStarted:
    """A case run started (progress)."""

    job: CaseJob
    total: int


@dataclass(frozen=True, kw_only=True)
class CaseRunFinished:
    """A case run ended and was graded (progress): `done` of `total`."""

    graded: GradedRun
    done: int
    total: int


Progress = Callable[[CaseRunStarted | CaseRunFinished], None]


async def grade(run: CaseRun, checks: Sequence[Check], grading: Grading) -> GradedRun:
    """What the checks say of a run. A run that failed fails (its checks are not asked); one
    that cannot be graded is an error; else an error of a check wins over a failure."""
    if run.stopped:
        return GradedRun(run=run, outcome="stopped")
    if run.problem is not None:
        return GradedRun(
            run=run,
            outcome="error",
            checks=(CheckResult(check="run", outcome="error", reason=run.problem),),
        )
    if not run.completed:
        reason = f"the run failed: {run.error}"
        return GradedRun(
            run=run,
            outcome="failed",
            checks=(CheckResult(check="run", outcome="failed", reason=reason),),
        )
    results = tuple(await asyncio.gather(*(run_check(c, run, grading) for c in checks)))
    outcomes = {r.outcome for r in results}
    outcome: Literal["passed", "failed", "error"] = (
        "error" if "error" in outcomes else "failed" if "failed" in outcomes else "passed"
    )
    return GradedRun(run=run, outcome=outcome, checks=results)


def recording_path(target: str, case: str, repetition: int, *, several: bool) -> PurePosixPath:
    """Where a case run's recording is kept in a recordings folder."""
    name = PurePosixPath(case) / f"{repetition}.recording.json"
    return PurePosixPath(target) / name if several else name


async def evaluate(
    dataset: Dataset,
    *,
    model: Model | str | None = None,
    judge_model: Model | str | None = None,
    repeat: int | None = None,
    concurrency: int = 4,
    max_tokens: int | None = None,
    record: str | Path | None = None,
    replay: str | Path | None = None,
    k: int | None = None,
    prices: Prices | None = None,
    resolve: Callable[[str], Model] | None = None,
    settings: RunSettings | None = None,
    listeners: Sequence[EventListener] = (),
    progress: Progress | None = None,
    runner: CaseRunner | None = None,
    eval_id: str | None = None,
) -> EvalReport:
    """Run every repetition of every case of `dataset` on each of its targets, grade each run
    with the case's checks, and report.

    Args:
        dataset: the cases and their target recipes.
        model: answers for every model the recipes name (an A/B of models); ``None``: the
            recipes' own models.
        judge_model: grades `JudgeCheck` rubrics (else the dataset's ``judge_model``).
        repeat: runs of each case, over the dataset's and the cases' own.
        concurrency: case runs at once.
        max_tokens: tokens for the whole eval; once used, the runs in flight are cut short
            and no new one starts (the report says what ran).
        record: a folder to keep each case run's recording in (and the judge's verdicts).
        replay: a folder of recordings to run the whole eval from, offline: no model is
            called; a call without a recorded reply (or whose prompt changed) is an error
            of that case run, naming the call.
        k: the k of pass@k and pass^k (the repeat by default).
        prices: dollars per million input and output tokens by model name, for the cost.
        resolve: turns model strings into models (`infer_model` by default).
        settings: the runs' other settings (approver, limits...).
        listeners: receive every event of every case run.
        progress: receives `CaseRunStarted` and `CaseRunFinished` as they happen.
        runner: runs the case runs (a `ForegroundRunner` made of the arguments above by
            default).
        eval_id: the eval's id (in each `CaseJob.key`); a new one by default.

    Raises:
        ConfigError: the arguments conflict or are out of range.
    """
    started_at, started = time.time(), time.perf_counter()
    if concurrency < 1:
        raise ConfigError("concurrency must be at least 1")
    if repeat is not None and repeat < 1:
        raise ConfigError("repeat must be at least 1")
    if k is not None and k < 1:
        raise ConfigError("k must be at least 1")
    if record is not None and replay is not None:
        raise ConfigError("record and replay cannot be used together")
    if model is not None and replay is not None:
        raise ConfigError("a replay calls no model: give model or replay, not both")
    record_dir = Path(record) if record is not None else None
    replay_dir = Path(replay) if replay is not None else None
    if replay_dir is not None and not replay_dir.is_dir():
        raise ConfigError(f"no recordings folder {str(replay_dir)!r}")
    if record_dir is not None:
        record_dir.mkdir(parents=True, exist_ok=True)
    resolved = _model(model, resolve)
    judge = _judge(dataset, judge_model, resolve, record_dir, replay_dir)
    budget = TokenBudget(max_tokens) if max_tokens is not None else None
    if runner is None:
        runner = ForegroundRunner(
            model=resolved,
            resolve=resolve,
            record=record_dir,
            replay=replay_dir,
            budget=budget,
            settings=settings,
            listeners=listeners,
            meta={"dataset": dataset.name},
        )
    eval_id = eval_id or uuid.uuid4().hex[:12]
    jobs = _jobs(dataset, eval_id, repeat)
    grading = Grading(judge=judge)
    limit = asyncio.Semaphore(concurrency)
    graded: dict[str, GradedRun] = {}
    not_started = 0
    total = len(jobs)

    async def one(job: CaseJob) -> None:
        nonlocal not_started
        async with limit:
            if budget is not None and budget.exhausted:
                not_started += 1
                return
            if progress is not None:
                progress(CaseRunStarted(job=job, total=total))
            run = await runner.run(job)
            checks = job.case.all_checks(dataset.checks)
            result = graded[job.key] = await grade(run, checks, grading)
            if progress is not None:
                progress(CaseRunFinished(graded=result, done=len(graded), total=total))

    try:
        await asyncio.gather(*(one(job) for job in jobs))
    finally:
        if judge is not None and record_dir is not None:
            judge.save(record_dir)
    ordered = [graded[job.key] for job in jobs if job.key in graded]
    note = None
    stopped = sum(1 for g in ordered if g.outcome == "stopped")
    if budget is not None and (stopped or not_started):
        note = (
            f"--max-tokens {budget.limit:,} reached ({budget.used:,} tokens used): "
            f"{len(ordered) - stopped} of {total} case runs finished, {stopped} cut short, "
            f"{not_started} not started"
        )
    return build_report(
        dataset,
        ordered,
        eval_id=eval_id,
        repeat=repeat or dataset.repeat,
        k=k or repeat or dataset.repeat,
        mode="replay" if replay_dir is not None else "live",
        model=_label(model),
        judge=judge,
        prices=prices,
        started_at=started_at,
        duration=time.perf_counter() - started,
        not_started=not_started,
        note=note,
    )


def evaluate_sync(dataset: Dataset, **options: Any) -> EvalReport:
    """`evaluate` for code that is not async (same arguments); inside a running event loop, in
    a thread of its own while the loop waits (``await evaluate(...)`` keeps it free)."""
    return run_sync(lambda: evaluate(dataset, **options), name="evaluate(...)")


def _label(model: Model | str | None) -> str | None:
    if model is None or isinstance(model, str):
        return model
    return model.name


def _model(model: Model | str | None, resolve: Callable[[str], Model] | None) -> Model | None:
    if model is None or not isinstance(model, str):
        return model
    if resolve is not None:
        return resolve(model)
    from minions.models import infer_model

    return infer_model(model)


def _judge(
    dataset: Dataset,
    judge_model: Model | str | None,
    resolve: Callable[[str], Model] | None,
    record: Path | None,
    replay: Path | None,
) -> Judge | None:
    if replay is not None:
        recorded, verdicts = Judge.load(replay)
        label = _label(judge_model) or recorded or dataset.judge_model
        if label is None:
            return None
        return Judge(None, label=label, verdicts=verdicts, replay=True)
    given = judge_model if judge_model is not None else dataset.judge_model
    if given is None:
        return None
    model = _model(given, resolve)
    assert model is not None
    label = given if isinstance(given, str) else model.name
    return Judge(model, label=label)


def _jobs(dataset: Dataset, eval_id: str, repeat: int | None) -> list[CaseJob]:
    """Every case run, repetition by repetition (all first runs, then all second runs...): an
    eval stopped early has run every case as evenly as it could."""
    several = len(dataset.targets) > 1
    most = max(dataset.repeats(case, repeat) for case in dataset.cases)
    jobs = []
    for repetition in range(1, most + 1):
        for target in dataset.targets:
            for case in dataset.cases:
                if repetition <= dataset.repeats(case, repeat):
                    jobs.append(
                        CaseJob(
                            eval_id=eval_id,
                            target=target,
                            case=case,
                            repetition=repetition,
                            inputs=dataset.inputs_of(case),
                            recording=recording_path(
                                target.id, case.id, repetition, several=several
                            ),
                        )
                    )
    return jobs


def _usage(usage: Usage) -> dict[str, int]:
    return {**dataclasses.asdict(usage), "total_tokens": usage.total_tokens}


def cost_of(models: Mapping[str, Usage], prices: Prices | None) -> tuple[float | None, str | None]:
    """The cost of the tokens of each model, or ``None`` and why it is unknown."""
    if prices is None:
        return None, "unknown: no prices given (--prices FILE)"
    total = 0.0
    for name, usage in models.items():
        price = prices.get(name)
        if price is None:
            price = next((p for key, p in prices.items() if key.partition(":")[2] == name), None)
        if price is None:
            return None, f"unknown: no price for model {name!r}"
        total += usage.prompt_tokens * price.get("input", 0.0) / 1e6
        total += usage.completion_tokens * price.get("output", 0.0) / 1e6
    return round(total, 6), None


def _case_report(target: str, case_id: str, runs: Sequence[GradedRun], k: int) -> CaseReport:
    passed = sum(1 for g in runs if g.outcome == "passed")
    failed = sum(1 for g in runs if g.outcome == "failed")
    errors = sum(1 for g in runs if g.outcome == "error")
    stopped = sum(1 for g in runs if g.outcome == "stopped")
    graded = passed + failed
    failures = [
        Failure(check=r.check, reason=r.reason, run_id=g.run.run_id, kind=r.outcome)
        for g in runs
        for r in g.checks
        if r.outcome in ("failed", "error")
    ]
    return CaseReport(
        id=case_id,
        target=target,
        runs=len(runs) - stopped,
        passed=passed,
        failed=failed,
        errors=errors,
        stopped=stopped,
        pass_rate=passed / graded if graded else None,
        pass_at_k=pass_at_k(graded, passed, k),
        pass_hat_k=pass_hat_k(graded, passed, k),
        k=k,
        flaky=passed > 0 and failed > 0,
        run_ids=[g.run.run_id for g in runs],
        failures=failures,
        tokens=sum(g.run.usage.total_tokens for g in runs),
        duration=round(sum(g.run.duration for g in runs), 4),
        results=[
            RunReport(
                run_id=g.run.run_id,
                repetition=g.run.repetition,
                outcome=g.outcome,
                reason=g.reason if g.outcome != "passed" else None,
                tokens=g.run.usage.total_tokens,
                duration=round(g.run.duration, 4),
                checks=[
                    CheckReport(check=r.check, outcome=r.outcome, reason=r.reason) for r in g.checks
                ],
            )
            for g in runs
        ],
    )


def build_report(
    dataset: Dataset,
    runs: Sequence[GradedRun],
    *,
    eval_id: str,
    repeat: int,
    k: int,
    mode: Literal["live", "replay"],
    model: str | None,
    judge: Judge | None,
    prices: Prices | None,
    started_at: float,
    duration: float,
    not_started: int = 0,
    note: str | None = None,
) -> EvalReport:
    """The report of graded runs (`evaluate` makes it; a durable eval makes it from the runs
    its store kept)."""
    by_case: dict[tuple[str, str], list[GradedRun]] = {}
    for target in dataset.targets:
        for case in dataset.cases:
            by_case[(target.id, case.id)] = []
    for graded in runs:
        by_case.setdefault((graded.run.target, graded.run.case.id), []).append(graded)
    cases = [
        _case_report(target, case_id, sorted(found, key=lambda g: g.run.repetition), k)
        for (target, case_id), found in by_case.items()
    ]
    passed = sum(c.passed for c in cases)
    failed = sum(c.failed for c in cases)
    usage = sum((g.run.usage for g in runs), Usage())
    models: dict[str, Usage] = {}
    for graded in runs:
        for name, used in graded.run.models.items():
            models[name] = models.get(name, Usage()) + used
    cost, cost_note = cost_of(models, prices)
    interval = wilson_interval(passed, passed + failed)
    return EvalReport(
        eval_id=eval_id,
        dataset=dataset.name,
        target=dataset.target,
        repeat=repeat,
        k=k,
        mode=mode,
        model=model,
        judge_model=judge.label if judge is not None else None,
        started_at=started_at,
        finished_at=started_at + duration,
        duration=round(duration, 4),
        runs=sum(c.runs for c in cases),
        passed=passed,
        failed=failed,
        errors=sum(c.errors for c in cases),
        stopped=sum(c.stopped for c in cases),
        not_started=not_started,
        pass_rate=passed / (passed + failed) if passed + failed else None,
        interval=list(interval) if interval is not None else None,
        usage=_usage(usage),
        judge_usage=_usage(judge.usage) if judge is not None else {},
        cost=cost,
        cost_note=cost_note,
        note=note,
        cases=cases,
    )
