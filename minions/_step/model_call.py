"""Runs one model call: budgets, timeout, transient-error retries, usage and events."""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from typing import TYPE_CHECKING, Any

from minions._messages import ModelCall, ModelCallResponse, Prompt, Usage
from minions._retry import RetryPolicy
from minions._step.capture import captured_answer, captured_messages
from minions._text import redact_url
from minions._values import ModeDemotion
from minions.errors import (
    BudgetExceededError,
    MinionsError,
    ModelError,
    ModelOutputError,
    TransientModelError,
    is_transient,
)
from minions.models import FallbackModel
from minions.models._internal import BLOCK, LEARNING_RUN, check_model, is_fallback

if TYPE_CHECKING:
    from minions._config import ExecutionConfig
    from minions._step.context import AgentContext
    from minions._step.execution import StepExecution
    from minions._step.waits import Waits
    from minions.events import ModelCallStarted, UsageRecord
    from minions.models import EndpointLimiter, EndpointWait, Model, TokenCallback

__all__ = ["ModelCallExecutor"]


def usage_record(usage: Usage) -> UsageRecord:
    # The event types load on first use: a run nobody listens to never builds an event, and
    # building their dataclasses is a fifth of `import minions`.
    from minions.events import UsageRecord

    return UsageRecord(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        calls=usage.calls,
        unknown_calls=usage.unknown_calls,
    )


@functools.lru_cache(maxsize=64)
def _policy(attempts: int, initial_delay: float, max_delay: float) -> RetryPolicy:
    """The (immutable) retry policy of a step's model calls, shared by the steps of a config
    (building one per step cost ~4 % of a one-call step)."""
    return RetryPolicy(
        attempts=attempts,
        retry_on=is_transient,
        initial_delay=initial_delay,
        max_delay=max_delay,
    )


_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The models a `StreamingWarning` was given for: once each (held weakly: a model made
after another was dropped may have its id, and is warned of all the same)."""


def _first_warning(model: object) -> bool:
    """Whether `model` was given no `StreamingWarning` yet (and is now counted as given)."""
    try:
        if model in _WARNED:
            return False
        _WARNED.add(model)
    except TypeError:  # a user's model that cannot be hashed or weakly referenced
        return True
    return True


def _usage_of_failure(error: BaseException) -> Usage:
    usage = getattr(error, "usage", None)
    if isinstance(usage, Usage):
        return usage
    if getattr(error, "status_code", None) is not None:
        return Usage(calls=1)  # The server refused the request: nothing was generated.
    return Usage(calls=1, unknown_calls=1)  # A timeout may have cost tokens nobody reported.


class ModelCallExecutor:
    """Makes the model calls of one step.

    Each attempt is recorded on the execution as a `ModelCall`, with its usage, whether it
    succeeded or not, and the model and endpoint it asked. Transient errors are retried here
    with backoff (tenacity), honouring a `retry_after` hint; `ModelOutputError` is raised to
    the step loop, which re-asks; other errors are raised as they are. Token budgets (step and
    run) are checked before every attempt.

    For a `FallbackModel`, each of its models in turn gets those retries, and the next one is
    asked when they are spent on transient errors; the model that answered serves the later
    calls of this executor (the rest of the step).
    """

    def __init__(
        self,
        model: Model,
        *,
        context: AgentContext,
        execution: StepExecution,
        config: ExecutionConfig,
        waits: Waits | None = None,
    ) -> None:
        self.model = model
        self.waits = waits
        """Where the time its calls wait for their endpoint's limits is counted (the step's)."""
        self.context = context
        self.execution = execution
        self.config = config
        self._attempts: dict[int, int] = {}
        self._policy = _policy(
            1 + config.max_model_retries, config.retry_initial_delay, config.retry_max_delay
        )
        self._models: tuple[Model, ...] = (model,)
        if is_fallback(model):
            assert isinstance(model, FallbackModel)
            self._models = model.resolved()
        self._gave_up: tuple[str, ...] = ()
        """What each model a fallback left said, for the error when none answers."""
        self._use(0)

    def _use(self, index: int) -> None:
        """Call the model at `index` of the fallback (the model itself, when there is none)."""
        self._index = index
        self._active = active = self._models[index]
        endpoint = active.endpoint
        self._served = None if endpoint is None else redact_url(endpoint[0])
        # The limits of the model's endpoint, when some apply (else one check per call).
        self._limiter: EndpointLimiter | None = None
        self._endpoint: tuple[str, str] | None = None
        limiter = self.context.settings.limiter
        if limiter is not None and endpoint is not None and limiter.rules(endpoint):
            self._limiter, self._endpoint = limiter, endpoint
        metrics = self.context.settings.metrics
        self._meter = None if metrics is None else metrics.model(active)

    def _check_budgets(self) -> None:
        budget = self.config.step_token_budget
        used = self.execution.usage
        if budget is not None and used.total_tokens >= budget:
            raise BudgetExceededError(
                f"step token budget of {budget} exhausted: {used.total_tokens} tokens used over "
                f"{used.calls} model calls"
            )
        self.context.check_run_budget()

    def _record(self, call: ModelCall) -> None:
        execution = self.execution
        execution.model_calls.append(call)
        execution.usage = execution.usage + call.usage
        self.context.record_usage(call.usage)

    async def _limited(self, prompt: Prompt, turn: int) -> ModelCallResponse:
        """`_attempt` once the endpoint's limits let the call go (see `Limits`)."""
        from minions.models._internal import estimate_prompt

        limiter, endpoint = self._limiter, self._endpoint
        assert limiter is not None
        assert endpoint is not None
        attempt = self._attempts.get(turn, 0) + 1  # the attempt `_attempt` is about to number
        waiting: list[bool] = []

        def on_wait(wait: EndpointWait) -> None:
            waiting.append(True)
            if self.waits is not None:
                self.waits.enter()
            if self._meter is not None:
                self._meter.waiting()
            self._announce_wait(wait, turn, attempt)

        # Waited for outside the call's own timeout (the wait is not the endpoint's slowness)
        # and inside the step's (a step's timeout counts it).
        try:
            permit = await limiter.acquire(
                endpoint, tokens=estimate_prompt(prompt), on_wait=on_wait
            )
        finally:
            if waiting:
                if self.waits is not None:
                    self.waits.leave()
                if self._meter is not None:
                    self._meter.waited()
        if permit is None:
            return await self._attempt(prompt, turn)
        used: int | None = None
        try:
            response = await self._attempt(prompt, turn)
            used = response.usage.total_tokens or None
            return response
        except TransientModelError as exc:
            if exc.status_code == 429 and exc.retry_after:
                # Every run calling the endpoint waits, not only this one.
                limiter.pause(endpoint, exc.retry_after, by=self.context.run_id)
            raise
        finally:
            limiter.release(permit, tokens=used)

    def _announce_wait(self, wait: EndpointWait, turn: int, attempt: int) -> None:
        from minions.events import ModelCallWaiting  # events load on first use

        limiter = self._limiter
        assert limiter is not None
        delay = None if wait.until is None else max(0.0, wait.until - limiter.clock())
        self.context.events.emit(
            ModelCallWaiting(
                step_id=self.execution.step_id,
                turn=turn,
                attempt=attempt,
                model=self._active.name,
                endpoint=redact_url(wait.match),
                reason=wait.reason,
                delay=delay,
            )
        )

    async def _attempt(self, prompt: Prompt, turn: int) -> ModelCallResponse:
        self._check_budgets()
        attempt = self._attempts[turn] = self._attempts.get(turn, 0) + 1
        step_id = self.execution.step_id
        events = self.context.events
        on_token = None
        if events.active:
            from minions.events import ModelCallStarted, TokenDelta

            streamed = False

            if self.context.settings.capture_content:
                events.emit(self._started_with_content(prompt, turn, attempt))
            else:
                events.emit(
                    ModelCallStarted(
                        step_id=step_id,
                        turn=turn,
                        attempt=attempt,
                        model=self._active.name,
                        endpoint=self._served or "",
                    )
                )

            def on_token(text: str) -> None:
                nonlocal streamed
                streamed = True
                events.emit(TokenDelta(step_id=step_id, turn=turn, attempt=attempt, text=text))

        model = self._active
        started_at = time.time()
        started = time.perf_counter()
        timeout = self.config.model_call_timeout
        tracer = self.context.settings.tracer
        meter = self._meter
        if meter is not None:
            meter.started()
        try:
            if self._served is not None and BLOCK.get() is not None:
                check_model(model)  # inside `block_real_models()`: refused, like a provider
            if tracer is None:
                if timeout is None:
                    response = await model.call(prompt, on_token=on_token)
                else:
                    async with asyncio.timeout(timeout):
                        response = await model.call(prompt, on_token=on_token)
            else:
                with tracer.chat(model, prompt, attempt=attempt) as span:
                    response = await self._call(prompt, on_token, timeout)
                    span.answered(response)
        except Exception as exc:
            duration = time.perf_counter() - started
            if isinstance(exc, ModelError):
                self._announce_demotions(exc.demoted)
            usage = _usage_of_failure(exc)
            if isinstance(exc, ModelOutputError):
                error, mode = exc.reason, exc.mode  # for people; the note is the model's
            else:
                error, mode = _describe(exc, timeout), None
            self._record(
                ModelCall(
                    step_id=step_id,
                    turn=turn,
                    attempt=attempt,
                    prompt=prompt,
                    error=error,
                    usage=usage,
                    output_mode=mode,
                    model=model.name,
                    endpoint=self._served,
                    started_at=started_at,
                    duration=duration,
                )
            )
            from minions.events import ModelCallFailed

            events.emit(
                ModelCallFailed(
                    step_id=step_id,
                    turn=turn,
                    attempt=attempt,
                    error=error,
                    usage=usage_record(usage),
                    output_mode=mode,
                    duration=duration,
                )
            )
            if meter is not None:
                meter.failed(duration, exc, usage)
            if isinstance(exc, TimeoutError) and not str(exc):
                raise TimeoutError(error) from None
            raise
        except BaseException:
            if meter is not None:
                meter.stopped()  # cancelled
            raise
        duration = time.perf_counter() - started
        if meter is not None:
            meter.answered(duration, response)
        if on_token is not None and not streamed and response.text and events.listeners:
            self._unstreamed(prompt, response.text, on_token)
        self._announce_demotions(response.demoted)
        self._record(
            ModelCall(
                step_id=step_id,
                turn=turn,
                attempt=attempt,
                prompt=prompt,
                response=response,
                usage=response.usage,
                output_mode=response.output_mode,
                model=model.name,
                endpoint=self._served,
                started_at=started_at,
                duration=duration,
            )
        )
        if events.active:
            from minions.events import ModelCallCompleted

            events.emit(
                ModelCallCompleted(
                    step_id=step_id,
                    turn=turn,
                    attempt=attempt,
                    usage=usage_record(response.usage),
                    finish_reason=response.finish_reason,
                    output_mode=response.output_mode,
                    tool_calls=tuple(call.name for call in response.tool_calls),
                    duration=duration,
                    answer=(
                        captured_answer(response.text)
                        if self.context.settings.capture_content
                        else None
                    ),
                )
            )
        return response

    def _unstreamed(self, prompt: Prompt, text: str, on_token: TokenCallback) -> None:
        """The model answered whole while the run's listeners could have had its deltas:
        when the caller streams, the answer is one delta (a stream never stays silent);
        either way, a `StreamingWarning` says so, once per model."""
        if prompt.stream:
            on_token(text)
        model = self.model
        if self.context.checkpoints is not None or not _first_warning(model):
            # A durable run: its worker streams every model that can, of its own accord (a
            # model that cannot is no mistake of anyone's).
            return
        import warnings

        from minions.errors import StreamingWarning

        if prompt.stream:
            message = (
                f"model {model.name!r} cannot stream: streamed steps get each of its answers "
                "as one text delta"
            )
        else:
            message = (
                f"model {model.name!r} answered without streaming, so this run's listeners "
                "get no TokenDelta events: stream the step (step.stream(), "
                "StepExecutor.stream(), AgentExecutor.stream()) or make the model stream by "
                "default (OpenAIChatModel(stream=True))"
            )
        warnings.warn(StreamingWarning(message), stacklevel=2)

    def _started_with_content(self, prompt: Prompt, turn: int, attempt: int) -> ModelCallStarted:
        """The attempt's `ModelCallStarted` carrying its request (content capture is on)."""
        from minions.events import ModelCallStarted

        messages, omitted = captured_messages(prompt.messages)
        return ModelCallStarted(
            step_id=self.execution.step_id,
            turn=turn,
            attempt=attempt,
            model=self._active.name,
            endpoint=self._served or "",
            messages=messages,
            messages_omitted=omitted,
        )

    async def _call(
        self, prompt: Prompt, on_token: TokenCallback | None, limit: float | None
    ) -> ModelCallResponse:
        if limit is None:
            return await self._active.call(prompt, on_token=on_token)
        async with asyncio.timeout(limit):
            return await self._active.call(prompt, on_token=on_token)

    def _announce_demotions(self, demoted: tuple[ModeDemotion, ...]) -> None:
        if not demoted:
            return
        from minions.events import OutputModeDemoted

        for demotion in demoted:
            self.context.events.emit(
                OutputModeDemoted(
                    step_id=self.execution.step_id,
                    model=self._active.name,
                    mode=demotion.mode,
                    reason=demotion.reason,
                    base_url=demotion.base_url,
                )
            )

    async def call(self, prompt: Prompt, *, turn: int) -> ModelCallResponse:
        """Call the model for `turn`, retrying transient errors.

        Raises:
            ModelOutputError: the answer is unusable; re-ask with its note.
            BudgetExceededError: a token budget is used up.
            ModelError: the model failed for good (retries spent, or not retryable).
        """
        before = self._attempts.get(turn, 0)
        # What the answers teach of the endpoint is this run's own until several runs agree
        # (a recipe step's inner run, "RUN.step", learns as its run).
        learning = LEARNING_RUN.set(self.context.run_id.partition(".")[0])
        try:
            # Without limits, the attempt itself: not one frame more on the step loop's path.
            attempt = self._attempt if self._limiter is None else self._limited
            return await self._policy.run(attempt, prompt, turn, before_sleep=self._announce_retry)
        except Exception as exc:
            if not is_transient(exc):
                raise
            attempts = self._attempts.get(turn, 1) - before
            if self._index + 1 < len(self._models):
                return await self._fall_back(prompt, turn, exc, attempts)
            description = f"after {attempts} attempts: {_describe(exc, None)}"
            if self._gave_up:
                gave_up = "; ".join([*self._gave_up, f"{self._active.name} {description}"])
                message = f"every model of the fallback failed: {gave_up}"
            else:
                message = f"model call failed {description}"
            raise ModelError(message, status_code=getattr(exc, "status_code", None)) from exc
        finally:
            LEARNING_RUN.reset(learning)

    async def _fall_back(
        self, prompt: Prompt, turn: int, error: BaseException, attempts: int
    ) -> ModelCallResponse:
        """`call` again with the next model of the fallback, once the one before gave up."""
        failed = self._active.name
        self._gave_up += (f"{failed} after {attempts} attempts: {_describe(error, None)}",)
        if self._meter is not None:  # counted as a retry at the endpoint that gave up
            from minions._tracing.metrics import retry_reason

            self._meter.retried(retry_reason(error))
        self._use(self._index + 1)
        from minions.events import RetryScheduled

        self.context.events.emit(
            RetryScheduled(
                step_id=self.execution.step_id,
                target="model",
                attempt=self._attempts.get(turn, 1),
                reason=f"{failed} gave up ({_describe(error, None)}); trying {self._active.name}",
            )
        )
        return await self.call(prompt, turn=turn)

    def reasked(self) -> None:
        """The step re-asks the model for its answer was unusable (a retry of the call)."""
        if self._meter is not None:
            self._meter.retried("invalid_output")

    def _announce_retry(self, attempt: int, error: BaseException, delay: float) -> None:
        from minions.events import RetryScheduled

        if self._meter is not None:
            from minions._tracing.metrics import retry_reason

            self._meter.retried(retry_reason(error))

        self.context.events.emit(
            RetryScheduled(
                step_id=self.execution.step_id,
                target="model",
                attempt=attempt,
                delay=delay,
                reason=str(error) or type(error).__name__,
            )
        )


def _describe(error: BaseException, timeout: float | None) -> str:
    if isinstance(error, TimeoutError) and not str(error):
        return f"model call timed out after {timeout}s" if timeout else "model call timed out"
    text = str(error)
    if isinstance(error, MinionsError) and text:
        return text  # minions' own errors say what happened; their class name adds nothing
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
