"""Running case runs: the `CaseRunner` interface and `ForegroundRunner`, which runs each
repetition of each case as a real run in this process (its own run id, events and usage)
through `AgentExecutor`, recording or replaying each run's model calls.

A runner on the workers of a run store (``--durable``) implements the same interface: it
submits each `CaseJob` (its `CaseJob.key` makes the idempotency key, so an eval resumed
after a crash does not run a finished case run again), follows the run to its end and
builds the `CaseRun` from the stored run.
"""

from __future__ import annotations

import dataclasses
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from minions._messages import ModelCallResponse, Prompt, Usage
from minions._text import jsonable
from minions.errors import MinionsError, ModelError, ModelOutputError, TransientModelError
from minions.evals._dataset import Case, Target
from minions.evals._run import CaseRun, result_document
from minions.models import Model, TokenCallback

if TYPE_CHECKING:
    from minions._step.result import AgentResult
    from minions._step.settings import RunSettings
    from minions.events import EventListener
    from minions.models import Recording, ReplayModel

__all__ = ["CaseJob", "CaseRunner", "ForegroundRunner", "TokenBudget"]


@dataclass(frozen=True, kw_only=True)
class CaseJob:
    """One repetition of one case on one target: what a `CaseRunner` runs.

    Attributes:
        eval_id: the eval it belongs to.
        target: the recipe to run.
        case: the case.
        repetition: 1, 2, ... up to the case's repeat.
        inputs: the run's inputs (the dataset's, under the case's).
        recording: where the run's recording is kept in a recordings folder (relative):
            ``CASE/N.recording.json``, under ``TARGET/`` when the dataset has several.
    """

    eval_id: str
    target: Target
    case: Case
    repetition: int
    inputs: Mapping[str, Any] = field(default_factory=dict)
    recording: PurePosixPath = field(default_factory=lambda: PurePosixPath("run.recording.json"))

    @property
    def key(self) -> str:
        """``eval_id/target/case/repetition``: names this case run in the eval."""
        return f"{self.eval_id}/{self.target.id}/{self.case.id}/{self.repetition}"


class TokenBudget:
    """Tokens an eval may use over all its case runs (``--max-tokens``). Once used, no model
    call starts: the runs in flight are cut short (and not graded), and no new one starts."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a token budget must be at least 1")
        self.limit = limit
        self.used = 0

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def spend(self, tokens: int) -> None:
        self.used += tokens


class CaseRunner(ABC):
    """Runs case runs. `ForegroundRunner` runs them in this process."""

    @abstractmethod
    async def run(self, job: CaseJob) -> CaseRun:
        """Run one case run to its end. Never raises for the run's own failure: a run that
        fails is a `CaseRun` with status ``failed``; one that cannot be graded has a
        `CaseRun.problem`."""

    async def aclose(self) -> None:  # noqa: B027 (most runners hold nothing)
        """Release what the runner holds (connections, a store)."""


class EvalStoppedError(ModelError):
    """The eval's token budget is used: no more model calls."""


@dataclass
class _Tally:
    """What the models of one case run saw."""

    models: dict[str, Usage] = field(default_factory=dict)
    problem: str | None = None
    stopped: bool = False
    failures: dict[str, BaseException] = field(default_factory=dict)
    """The last exception of each step's model calls, cleared by an answer."""


class _Watch(Model):
    """Wraps each model of a case run: stops at the eval's budget, counts tokens by the model
    that answered, and in a replay refuses a call whose prompt differs from the recorded one
    (the recording no longer says what this run would get)."""

    def __init__(
        self,
        model: Model,
        tally: _Tally,
        budget: TokenBudget | None,
        replay: ReplayModel | None,
    ) -> None:
        self.model = model
        self.name = model.name
        self._tally = tally
        self._budget = budget
        self._replay = replay

    @property
    def endpoint(self) -> tuple[str, str] | None:
        return self.model.endpoint

    async def check(self) -> None:
        await self.model.check()

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        from minions.models import ReplayMissError

        tally, budget, step = self._tally, self._budget, prompt.step_id or "_"
        if budget is not None and budget.exhausted:
            tally.stopped = True
            raise EvalStoppedError(
                f"the eval's token budget ({budget.limit:,} tokens) is used: no more model calls"
            )
        replay = self._replay
        changed = len(replay.changed_prompts) if replay is not None else 0
        try:
            response = await self.model.call(prompt, on_token=on_token)
        except ReplayMissError as exc:
            tally.problem = tally.problem or str(exc)
            raise
        except Exception as exc:
            tally.failures[step] = exc
            raise
        if replay is not None and len(replay.changed_prompts) > changed:
            scope, _, number = replay.changed_prompts[-1].rpartition("/")
            message = (
                f"the prompt of model call {number} of step {prompt.step_id!r} (scope "
                f"{scope!r}) differs from the recording: the recipe, the inputs or a prompt "
                "changed since it was recorded; record the eval again"
            )
            tally.problem = tally.problem or message
            raise ReplayMissError(message)
        tally.failures.pop(step, None)
        answered = response.model or self.name
        tally.models[answered] = tally.models.get(answered, Usage()) + response.usage
        if budget is not None:
            budget.spend(response.usage.total_tokens)
        return response


def _unreachable(result: AgentResult, tally: _Tally) -> str | None:
    """Why a failed run says nothing about the agent: a failed step's last model call failed
    for want of a model (unreachable, refused, timed out), not because of its answer."""
    for step_id in result.failed:
        exc = tally.failures.get(step_id)
        if exc is None or isinstance(exc, ModelOutputError | EvalStoppedError):
            continue
        if isinstance(exc, ModelError | TransientModelError | ConnectionError | TimeoutError):
            return f"the model could not be used in step {step_id!r}: {exc}"
    return None


class ForegroundRunner(CaseRunner):
    """Runs case runs in this process, each through its own `AgentExecutor` run.

    Args:
        model: answers for every model the recipes and their steps name (``--model``: an
            A/B of models); ``None``: each recipe's own model (``resolve`` turns model
            strings into models).
        resolve: turns the model strings recipes name into models (`infer_model` when not
            given).
        record: a folder to keep each case run's recording in (see `CaseJob.recording`).
        replay: a folder of recordings to answer every model call from: no model is called;
            a call the recording has no reply for, or whose prompt changed, makes the case
            run an error naming the call.
        budget: the eval's token budget.
        settings: the runs' other settings (approver, limits, tracer...); their model,
            resolver and wrapper are the runner's.
        listeners: receive every event of every case run.
        meta: stored in each new recording's metadata.
    """

    def __init__(
        self,
        *,
        model: Model | None = None,
        resolve: Callable[[str], Model] | None = None,
        record: Path | None = None,
        replay: Path | None = None,
        budget: TokenBudget | None = None,
        settings: RunSettings | None = None,
        listeners: Sequence[EventListener] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        from minions._step.settings import RunSettings

        if record is not None and replay is not None:
            raise ValueError("record and replay cannot be used together")
        if model is not None and replay is not None:
            raise ValueError("a replay calls no model: give model or replay, not both")
        self.model = model
        self.resolve = resolve
        self.record = record
        self.replay = replay
        self.budget = budget
        self.settings = settings or RunSettings()
        self.listeners = tuple(listeners)
        self.meta = dict(meta or {})

    def _resolver(self, replay: ReplayModel | None) -> Callable[[Model | str | None], Model] | None:
        if replay is not None:
            return lambda _spec: replay
        model = self.model
        if model is not None:
            return lambda _spec: model
        resolve = self.resolve
        if resolve is None:
            return self.settings.model_resolver
        from minions._step.context import resolve_model

        return lambda spec: resolve(spec) if isinstance(spec, str) else resolve_model(spec)

    def _replay_model(self, job: CaseJob) -> tuple[ReplayModel | None, str | None]:
        from minions.errors import RecordingError
        from minions.models import Recording, ReplayModel

        assert self.replay is not None
        file = self.replay / job.recording
        if not file.is_file():
            return None, (
                f"no recording of case {job.case.id!r} run {job.repetition} ({file}): record "
                "the eval with --record, with at least as many repeats"
            )
        try:
            recording = Recording.load(file)
        except RecordingError as exc:
            return None, str(exc)
        name = recording.meta.get("model")
        return ReplayModel(recording, name=name if isinstance(name, str) else "replay"), None

    async def run(self, job: CaseJob) -> CaseRun:
        from minions._agent.executor import AgentExecutor
        from minions.models import Recording, RecordingModel

        run_id = uuid.uuid4().hex[:12]
        case = job.case
        base = CaseRun(
            case=case,
            target=job.target.id,
            repetition=job.repetition,
            run_id=run_id,
            status="failed",
        )
        replay = None
        if self.replay is not None:
            replay, problem = self._replay_model(job)
            if problem is not None:
                return dataclasses.replace(base, problem=problem)
        tally = _Tally()
        recording: Recording | None = None
        if self.record is not None:
            recording = Recording(
                meta={
                    **self.meta,
                    "target": job.target.id,
                    "case": case.id,
                    "repetition": job.repetition,
                    "inputs": jsonable(dict(job.inputs)),
                    **({"model": self.model.name} if self.model is not None else {}),
                }
            )
        budget = self.budget

        def wrap(model: Model) -> Model:
            inner = RecordingModel(model, recording) if recording is not None else model
            return _Watch(inner, tally, budget, replay)

        settings = dataclasses.replace(
            self.settings, model_resolver=self._resolver(replay), model_wrapper=wrap
        )
        executor = AgentExecutor(settings=settings, listeners=self.listeners)
        try:
            result = await executor.execute(job.target.recipe, job.inputs, run_id=run_id)
        except MinionsError as exc:
            return dataclasses.replace(base, problem=f"the run could not start: {exc}")
        if recording is not None and self.record is not None and not tally.stopped:
            if recording.meta.get("model") is None and tally.models:
                recording.meta["model"] = next(iter(tally.models))
            file = self.record / job.recording
            file.parent.mkdir(parents=True, exist_ok=True)
            recording.save(file)
        problem = tally.problem or (None if result.ok else _unreachable(result, tally))
        expected = case.expected if case.has_expected else None
        return dataclasses.replace(
            base,
            status="completed" if result.ok else "failed",
            output=jsonable(result.output),
            error=result.error,
            document=result_document(result, target=job.target.id, expected=expected),
            result=result,
            usage=result.usage,
            duration=result.duration,
            problem=problem,
            stopped=tally.stopped and not result.ok,
            models=dict(tally.models),
        )
