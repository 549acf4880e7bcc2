"""Runs one tool call: look the tool up, validate arguments, call it with retries, serialize."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from minions._config import ExecutionConfig
from minions._emitter import EventEmitter
from minions._messages import ToolCall, ToolCallResponse
from minions._retry import RetryHook, RetryPolicy
from minions.errors import ApprovalRequiredError, MissingDepsError, ToolError
from minions.tools import (
    ApprovalDecision,
    ApprovalRequest,
    Approver,
    Tool,
    ToolContext,
    ToolRegistry,
)
from minions.tools._internal import enter, leave

if TYPE_CHECKING:
    from minions._step.waits import Waits
    from minions._tracing.tracer import RunTracer

__all__ = ["ToolCallExecutor"]


@functools.lru_cache(maxsize=64)
def _policy(attempts: int, initial_delay: float, max_delay: float) -> RetryPolicy:
    """The (immutable) retry policy of a step's tool calls, shared by the steps of a config
    (building one per step cost ~4 % of a one-call step)."""
    return RetryPolicy(
        attempts=attempts, retry_on=_retryable, initial_delay=initial_delay, max_delay=max_delay
    )


def serialize_result(name: str, result: Any) -> str:
    """The text a model sees for a tool's result: strings as they are, the rest as JSON.

    Raises:
        ToolError: the result cannot be serialized to JSON.
    """
    if isinstance(result, str):
        return result
    import pydantic_core

    try:
        return pydantic_core.to_json(result).decode()
    except pydantic_core.PydanticSerializationError as exc:
        raise ToolError(
            f"Tool {name!r} returned a {type(result).__name__}, which is not JSON-serializable "
            f"({exc})."
        ) from None


REJECTED_NOTE = "Do not make it again as it was."
"""Told the model after a person rejected its call (its result's content); never shown to a
person (the call's `error`, its events, the step's and the run's errors do not carry it)."""


class _Rejected(ToolError):
    """A person rejected the call (the message is what people see)."""


def _retryable(error: BaseException) -> bool:
    # A ToolError is the tool's own answer for the model; missing deps never pass; everything
    # else may be passing.
    if isinstance(error, MissingDepsError):
        return False
    return not isinstance(error, ToolError) or error.retryable


class ToolCallExecutor:
    """Executes the tool calls of one step.

    A tool that raises is retried up to `max_tool_call_retries` times (a `ToolError` it raises
    is not retried unless `retryable=True`). An unknown tool, invalid arguments, a tool still
    failing after its retries, or a result that is not JSON: the error becomes the call's
    result, so the model can adapt. `execute` never raises except on cancellation.

    With a `tracer`, each attempt is an ``execute_tool {name}`` span (a failed attempt is a
    failed span, then the next attempt's), and a call that fails before the tool runs is one
    failed span.
    """

    deps: object = None
    """The run's deps, for tools taking a `ToolContext` (``None``: none given); the step
    loop sets them from its context."""

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        config: ExecutionConfig | None = None,
        emitter: EventEmitter | None = None,
        step_id: str | None = None,
        scope: str | None = None,
        approver: Approver | None = None,
        visit: int = 1,
        item: int | None = None,
        approve_every_call: bool = False,
        tracer: RunTracer | None = None,
        before_call: Callable[[], Awaitable[None]] | None = None,
        waits: Waits | None = None,
    ) -> None:
        self.registry = registry
        self.waits = waits
        """Where the time a call waits for approval is counted (the step's)."""
        self.tracer = tracer
        self.before_call = before_call
        """Awaited before each attempt of a call starts: a durable run confirms it still
        holds the run (a worker frozen past its lease starts no side effect)."""
        self.config = config or ExecutionConfig()
        self.emitter = emitter or EventEmitter("")
        self.step_id = step_id
        self.scope = scope or f"{step_id}#1"
        """The step execution the calls belong to (``step#visit[item]``), for their
        idempotency keys."""
        self.approver = approver
        self.visit = visit
        self.item = item
        self.approve_every_call = approve_every_call
        """Every call needs approval (a YAML tool step with ``requires_approval: true``)."""
        self._policy = _policy(
            1 + self.config.max_tool_call_retries,
            self.config.tool_retry_initial_delay,
            self.config.retry_max_delay,
        )

    def _announce(self, call: ToolCall) -> RetryHook:
        def before_sleep(attempt: int, error: BaseException, delay: float) -> None:
            from minions.events import RetryScheduled  # events load on first use

            self.emitter.emit(
                RetryScheduled(
                    step_id=self.step_id,
                    target="tool",
                    attempt=attempt,
                    delay=delay,
                    reason=f"{call.name} ({call.id}): {type(error).__name__}: {error}",
                )
            )

        return before_sleep

    async def _invoke(
        self, tool: Tool, arguments: Mapping[str, Any], context: ToolContext[Any]
    ) -> Any:
        timeout = self.config.tool_call_timeout
        given = (context,) if tool.takes_context else ()
        try:
            async with (
                asyncio.timeout(timeout) if timeout is not None else contextlib.nullcontext()
            ):
                if tool.is_async:
                    return await tool.fn(*given, **arguments)
                if tool.run_in_thread:
                    return await asyncio.to_thread(tool.fn, *given, **arguments)
                return tool.fn(*given, **arguments)
        except TimeoutError:
            if not tool.is_async and tool.run_in_thread:
                # A thread cannot be stopped: running the tool again would run it twice at once
                # (and its side effects with it).
                raise ToolError(
                    f"Tool {tool.name!r} did not finish within {timeout}s; it may still be "
                    "running, so it is not tried again."
                ) from None
            raise ToolError(
                f"Tool {tool.name!r} did not finish within {timeout}s.", retryable=True
            ) from None

    def _started(self, call: ToolCall, attempt: int) -> None:
        if self.emitter.active:
            from minions.events import ToolCallStarted  # events load on first use

            self.emitter.emit(
                ToolCallStarted(
                    step_id=self.step_id,
                    call_id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                    attempt=attempt,
                )
            )

    async def _approval(self, call: ToolCall, arguments: dict[str, Any]) -> ApprovalDecision:
        """Ask the approver about `call`, saying so in events."""
        call_id = f"{self.scope}/{call.id}"
        if self.approver is None:
            raise ApprovalRequiredError(
                f"tool {call.name!r} (step {self.step_id!r}) needs a person's approval, and "
                "nobody can be asked: run it on a terminal, pass --approve-all, or give the "
                "executor an approver"
            )
        from minions.events import ApprovalRequested, ApprovalResolved

        emitter = self.emitter
        if emitter.active:
            emitter.emit(
                ApprovalRequested(
                    step_id=self.step_id, call_id=call_id, name=call.name, arguments=arguments
                )
            )
        request = ApprovalRequest(
            run_id=emitter.run_id,
            step_id=self.step_id or "",
            visit=self.visit,
            item=self.item,
            call_id=call_id,
            tool=call.name,
            arguments=dict(arguments),
        )
        waits = self.waits
        if waits is not None:
            waits.enter()
        try:
            decision = await self.approver(request)
        except Exception as exc:
            raise ApprovalRequiredError(
                f"asking for approval of {call.name!r} (step {self.step_id!r}) failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if waits is not None:
                waits.leave()
        if emitter.active:
            emitter.emit(
                ApprovalResolved(
                    step_id=self.step_id,
                    call_id=call_id,
                    name=call.name,
                    approved=decision.approved,
                    reason=decision.reason,
                    actor=decision.decided_by,
                )
            )
        return decision

    def _refused(
        self, call: ToolCall, error: BaseException, attempts: int, started_ns: int
    ) -> None:
        """Trace a call that failed before the tool ran (its attempts have their spans)."""
        if self.tracer is not None and attempts == 0:
            self.tracer.tool_refused(call, error=error, started_ns=started_ns)

    async def execute(self, call: ToolCall) -> ToolCall:
        """Run `call` and return it with its `response` set."""
        emitter = self.emitter
        self._started(call, 1)
        started = time.perf_counter()
        started_ns = time.time_ns()
        attempts = 0
        result: Any = None
        error: str | None = None
        content = ""
        try:
            tool = self.registry.require(call.name)
            arguments = tool.validate(call.arguments)
            if tool.requires_approval or self.approve_every_call:
                decision = await self._approval(call, arguments)
                if not decision.approved:
                    who = (
                        "Nobody approved this call to {!r} in time"
                        if decision.timed_out
                        else "A person rejected this call to {!r}"
                    )
                    raise _Rejected(
                        f"{who.format(call.name)}: {decision.reason or 'no reason given'}."
                    )

            async def attempt() -> Any:
                nonlocal attempts
                attempts += 1
                if attempts > 1:
                    self._started(call, attempts)
                context: ToolContext[Any] = ToolContext(
                    run_id=emitter.run_id,
                    step_id=self.step_id,
                    scope=self.scope,
                    call_id=call.id,
                    attempt=attempts,
                    deps=self.deps,
                )
                token = enter(context)
                try:
                    if self.before_call is not None:
                        await self.before_call()
                    tracer = self.tracer
                    if tracer is None:
                        return await self._invoke(tool, arguments, context)
                    with tracer.tool(call, attempt=attempts, origin=tool.origin) as span:
                        found = await self._invoke(tool, arguments, context)
                        if tracer.capture_content:
                            span.result(serialize_result(call.name, found))
                        return found
                finally:
                    leave(token)

            result = await self._policy.run(attempt, before_sleep=self._announce(call))
            content = serialize_result(call.name, result)
        except (ApprovalRequiredError, MissingDepsError) as exc:
            self._refused(call, exc, attempts, started_ns)
            raise  # not the model's to handle: the run cannot ask anybody / has no deps
        except _Rejected as exc:
            self._refused(call, exc, attempts, started_ns)
            # People see the rejection as it was made; only the model is told what to do.
            error = str(exc)
            content = f"{error} {REJECTED_NOTE}"
        except ToolError as exc:
            self._refused(call, exc, attempts, started_ns)
            error = content = str(exc)
        except Exception as exc:
            self._refused(call, exc, attempts, started_ns)
            tries = f" after {attempts} attempts" if attempts > 1 else ""
            error = content = f"Tool {call.name!r} failed{tries}: {type(exc).__name__}: {exc}"
            result = None
        duration = time.perf_counter() - started
        response = ToolCallResponse(
            call_id=call.id,
            name=call.name,
            result=result if error is None else None,
            error=error,
            content=content,
            attempts=max(attempts, 1),
            duration=duration,
        )
        if emitter.active and error is None:
            from minions.events import ToolCallCompleted  # events load on first use

            emitter.emit(
                ToolCallCompleted(
                    step_id=self.step_id,
                    call_id=call.id,
                    name=call.name,
                    content=content,
                    attempt=response.attempts,
                    duration=duration,
                )
            )
        elif emitter.active and error is not None:
            from minions.events import ToolCallFailed

            emitter.emit(
                ToolCallFailed(
                    step_id=self.step_id,
                    call_id=call.id,
                    name=call.name,
                    error=error,
                    attempt=response.attempts,
                    duration=duration,
                )
            )
        # Not `dataclasses.replace`, which looks the fields up on every call (a test checks
        # that a call keeps every field).
        return ToolCall(id=call.id, name=call.name, arguments=call.arguments, response=response)
