"""Evals on the workers of a run store (``minions eval --durable``): `DurableRunner` submits
each case run to the store under its `CaseJob.key` as the idempotency key and builds the
`CaseRun` from what the store kept; `evaluate_durable` opens the eval in the store (or finds
it again, unfinished: it resumes), runs it, and keeps its report there for the console.

The workers run each case run as they run any run: the store's limits, budgets and step
cache apply, and a worker that dies has its runs taken over. An eval process that dies
leaves its case runs to the workers; started again with the same dataset and recipes, it
submits the same keys, gets the same runs back (none is run twice) and waits for those that
have not ended.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minions._fold import Details, Execution, ModelCall, RunStates
from minions._messages import Usage
from minions._text import jsonable
from minions.errors import ConfigError, MinionsError
from minions.evals._compare import Gates, apply_gates, compare_reports
from minions.evals._dataset import Dataset
from minions.evals._evaluate import _jobs, evaluate
from minions.evals._report import EvalReport
from minions.evals._run import CaseRun
from minions.evals._runner import CaseJob, CaseRunner
from minions.events import StepFailed

if TYPE_CHECKING:
    from minions.events import Event
    from minions.runs import Actor, EvalRecord, RunRecord, RunStore

__all__ = ["DurableRunner", "evaluate_durable"]


class DurableRunner(CaseRunner):
    """Runs case runs on the workers of a run store: each is submitted under its
    `CaseJob.key` (a case run submitted again gives back its run), followed to its end, and
    read back from the store. Only recipe files run on workers (`Target.path`).

    Args:
        store: the run store whose workers run the case runs.
        project: the case runs' project.
        actor: who submits them (the audit log's ``run.submit`` entries, their
            `queued_by`).

    Attributes:
        submitted: case runs this runner submitted anew.
        found: case runs the store had already (an eval resumed): not run again.
    """

    def __init__(
        self, store: RunStore, *, project: str = "default", actor: str | Actor | None = None
    ) -> None:
        self.store = store
        self.project = project
        self.actor = actor
        self.submitted = 0
        self.found = 0

    async def run(self, job: CaseJob) -> CaseRun:
        base = CaseRun(
            case=job.case, target=job.target.id, repetition=job.repetition, run_id="-",
            status="failed",
        )  # fmt: skip
        path = job.target.path
        if path is None:
            return dataclasses.replace(base, problem=_NO_FILE.format(job.target.id))
        try:
            submitted = await self.store.submit(
                path, job.inputs, idempotency_key=job.key, project=self.project, actor=self.actor
            )
        except MinionsError as exc:
            return dataclasses.replace(base, problem=f"the run could not be submitted: {exc}")
        if submitted.created:
            self.submitted += 1
        else:
            self.found += 1
        run_id = submitted.run_id
        # The run's stored events, then new ones until it ends (token deltas are not stored).
        events = [e async for e in self.store.follow(run_id) if e.kind != "token_delta"]
        return case_run_of(job, await self.store.get(run_id), events)


_NO_FILE = (
    "target {!r} is not a recipe file: a durable eval runs recipe files on the workers "
    "(a recipe or a step built in Python runs in the foreground)"
)


def case_run_of(job: CaseJob, record: RunRecord, events: Sequence[Event]) -> CaseRun:
    """The `CaseRun` of a stored run: its result document from the run's record (status,
    output, each step's last visit) and its events (tool calls, model calls, the order the
    steps started in)."""
    case = job.case
    base = CaseRun(
        case=case, target=job.target.id, repetition=job.repetition, run_id=record.run_id,
        status="failed",
    )  # fmt: skip
    if record.status not in ("completed", "failed"):
        return dataclasses.replace(
            base, problem=f"run {record.run_id} was {record.status}: it says nothing of the agent"
        )
    trail = _Trail.of(events)
    model_calls, tool_calls = trail.model_calls, trail.tool_calls
    steps: dict[str, dict[str, Any]] = {}
    for step_record in record.steps:
        previous = steps.get(step_record.step_id)
        steps[step_record.step_id] = {
            "status": step_record.status,
            "output": step_record.output,
            "error": step_record.error,
            "visits": (previous["visits"] + 1) if previous else 1,
            "model_calls": model_calls.get(step_record.step_id, 0),
            "usage": _usage(step_record.usage),
            "duration": step_record.duration or 0.0,
            "tool_calls": [
                {k: v for k, v in c.items() if k != "step"}
                for c in tool_calls
                if c["step"] == step_record.step_id
            ],
        }
    usage = _usage(record.usage)
    duration = (
        record.finished_at - record.started_at
        if record.finished_at is not None and record.started_at is not None
        else 0.0
    )
    completed = record.status == "completed"
    problem = None
    if not completed and trail.unanswered is not None:
        # A run that failed for want of a model (unreachable, refused, timed out) says nothing
        # of the agent: a failed step whose last model call got no answer at all.
        name, why = trail.unanswered
        problem = f"the model could not be used in step {name!r}: {why}"
    expected = case.expected if case.has_expected else None
    document = {
        "run_id": record.run_id,
        "target": job.target.id,
        "status": "completed" if completed else "failed",
        "output": record.output,
        "error": record.error,
        "inputs": record.inputs,
        "expected": jsonable(expected),
        "usage": usage,
        "duration": duration,
        "model_calls": sum(model_calls.values()),
        "steps": steps,
        "tool_calls": tool_calls,
        "step_order": trail.order,
    }
    return dataclasses.replace(
        base,
        status="completed" if completed else "failed",
        output=record.output,
        error=record.error,
        document=document,
        usage=Usage(
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            calls=usage["calls"],
            unknown_calls=usage["unknown_calls"],
        ),
        duration=duration,
        problem=problem,
        models={name: used for name, used in trail.models.items() if name},
    )


@dataclass
class _Trail:
    """What a stored run's events tell of its executions (a step's visit, or a loop item),
    as the one fold of events tells them (`RunStates`, with details), each by the calls of
    its last start: a worker that died mid-step left the calls of a start that a survivor
    made again."""

    order: list[str] = field(default_factory=list)
    """The steps in the order they started (not their loop items)."""
    model_calls: dict[str, int] = field(default_factory=dict)
    """Model calls (attempts) by step."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    unanswered: tuple[str, str] | None = None
    """The first execution that failed whose last model call got no answer at all (no
    token), and why."""
    models: dict[str, Usage] = field(default_factory=dict)
    """Tokens by the model asked."""

    @classmethod
    def of(cls, events: Sequence[Event]) -> _Trail:
        states = RunStates(details=True)
        failed: list[Execution] = []
        for event in events:
            changed = states.fold(event)
            if isinstance(event, StepFailed):
                failed.append(changed[0])  # the execution that failed, in the order they did
        trail = cls()
        trail.order = [e.step_id for e in states.started if e.item is None]
        ended: list[ModelCall] = []
        for execution in states.executions:
            details = _details(execution)
            last = [c for c in details.model_calls if c.start == execution.starts]
            step = execution.step
            trail.model_calls[step] = trail.model_calls.get(step, 0) + len(last)
            ended.extend(c for c in details.model_calls if c.finished_at is not None)
        for execution in states.started:
            trail.tool_calls.extend(
                {
                    "step": execution.step,
                    "name": call.name,
                    "arguments": jsonable(call.arguments),
                    "result": call.result,
                    "error": call.error,
                }
                for call in _details(execution).tool_calls
                if call.start == execution.starts
            )
        # Each answer's tokens by the model asked, in the order the calls ended.
        for call in sorted(ended, key=_finished):
            if call.error is None and call.usage is not None:
                trail.models[call.model] = trail.models.get(call.model, Usage()) + Usage(
                    prompt_tokens=call.usage.prompt_tokens,
                    completion_tokens=call.usage.completion_tokens,
                    calls=call.usage.calls,
                    unknown_calls=call.usage.unknown_calls,
                )
        for execution in failed:
            calls = [c for c in _details(execution).model_calls if c.finished_at is not None]
            if calls and calls[-1].error and calls[-1].usage is not None:
                used = calls[-1].usage
                if not used.prompt_tokens + used.completion_tokens:
                    trail.unanswered = (execution.step_id, calls[-1].error)
                    break
        return trail


def _details(execution: Execution) -> Details:
    return execution.details or Details()  # folded with details: never made here


def _finished(call: ModelCall) -> float:
    return call.finished_at or 0.0


def _usage(data: Mapping[str, int]) -> dict[str, int]:
    prompt, completion = int(data.get("prompt_tokens", 0)), int(data.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "calls": int(data.get("calls", 0)),
        "unknown_calls": int(data.get("unknown_calls", 0)),
        "total_tokens": prompt + completion,
    }


def fingerprint(dataset: Dataset, jobs: Sequence[CaseJob]) -> str:
    """What makes an eval the same one to resume: its dataset's name and each case run's
    target (its recipe file's text), case, repetition and inputs. A change to any of them
    (a recipe edited, a case added, another repeat) is a new eval."""
    recipes: dict[str, str] = {}
    for target in dataset.targets:
        if target.path is None:
            raise ConfigError(_NO_FILE.format(target.id))
        try:
            recipes[target.id] = target.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read recipe {str(target.path)!r}: {exc}") from None
    runs = [
        [job.target.id, job.case.id, job.repetition, jsonable(dict(job.inputs))] for job in jobs
    ]
    text = json.dumps(
        {"dataset": dataset.name, "recipes": recipes, "runs": runs},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def summary_of(report: EvalReport) -> dict[str, Any]:
    """What a listing of kept evals shows of a report."""
    return {
        "pass_rate": report.pass_rate,
        "interval": report.interval,
        "runs": report.runs,
        "passed": report.passed,
        "failed": report.failed,
        "errors": report.errors,
        "cases": len(report.cases),
        "flaky": sum(1 for c in report.cases if c.flaky),
        "regressed": sum(1 for c in report.cases if c.baseline == "regressed"),
        "baseline": report.comparison.baseline if report.comparison is not None else None,
        "ok": report.ok,
        "tokens": report.usage.get("total_tokens", 0),
        "duration": report.duration,
    }


async def evaluate_durable(
    dataset: Dataset,
    store: RunStore,
    *,
    repeat: int | None = None,
    baseline: EvalReport | None = None,
    baseline_name: str = "",
    gates: Gates | None = None,
    opened: Callable[[EvalRecord, bool, DurableRunner], None] | None = None,
    project: str = "default",
    actor: str | Actor | None = None,
    **options: Any,
) -> EvalReport:
    """Run the eval on the workers of `store` and keep its report there.

    The eval is opened in the store by its fingerprint (its dataset, recipes, cases, repeats
    and inputs): an unfinished eval of the same one resumes, its case runs submitted before
    given back by their idempotency keys (not run again). Each case run is graded here, as
    it ends; the report, compared with `baseline` and its `gates` applied, is kept with the
    eval (`RunStore.eval`) and returned.

    Args:
        dataset: the cases and their target recipe files.
        store: the run store whose workers run the case runs.
        repeat: runs of each case, over the dataset's and the cases' own.
        baseline: a report to mark each case against (`compare_reports`), named
            `baseline_name`.
        gates: the gates to check (`apply_gates`; the errors gate by default).
        opened: told the eval (and whether it resumes) before any case run is submitted.
        project: the eval's project, and its case runs'.
        actor: who runs it: the audit log records it as starting the eval
            (``eval.start``), submitting its case runs and finishing it (``eval.finish``).
        **options: more arguments of `evaluate` (`judge_model`, `concurrency`, `k`,
            `prices`, `resolve`, `progress`...); not `model`, `record`, `replay` or
            `max_tokens`: the workers run the recipes with their own models, limits and
            budgets.

    Raises:
        ConfigError: a target is not a recipe file, or an option cannot apply.
    """
    refused = sorted({"model", "record", "replay", "max_tokens", "runner", "eval_id"} & {
        k for k, v in options.items() if v is not None
    })  # fmt: skip
    if refused:
        raise ConfigError(
            f"a durable eval cannot take {', '.join(refused)}: its case runs run on the "
            "store's workers, with their models, limits and budgets"
        )
    jobs = _jobs(dataset, "-", repeat)
    record, resumed = await store.open_eval(
        fingerprint(dataset, jobs),
        dataset=dataset.name,
        target=dataset.target,
        total=len(jobs),
        project=project,
        actor=actor,
    )
    runner = DurableRunner(store, project=project, actor=actor)
    if opened is not None:
        opened(record, resumed, runner)
    report = await evaluate(
        dataset, repeat=repeat, runner=runner, eval_id=record.eval_id, **options
    )
    if baseline is not None:
        report = compare_reports(baseline, report, name=baseline_name)
    report = apply_gates(report, gates or Gates())
    await store.keep_eval(
        record, report.model_dump(mode="json"), summary=summary_of(report), actor=actor
    )
    return report
