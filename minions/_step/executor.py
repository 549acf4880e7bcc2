"""StepExecutor: the model ⇄ tool loop of one step."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NoReturn

from minions._generic import OutputT
from minions._item import ItemId
from minions._memory import MemorySnapshot
from minions._messages import Message, Prompt, ToolCall, ToolCallResponse, ToolSpec
from minions._step.cache import CachedStep, StepCache, cache_age, cache_key, cache_world
from minions._step.completion import (
    COMPLETION_TOOL,
    CallLimitLink,
    CompletionDecision,
    StepCompletionChain,
)
from minions._step.context import AgentContext
from minions._step.execution import DecisionRecord, StepExecution, StepStatus
from minions._step.model_call import ModelCallExecutor, usage_record
from minions._step.resume import (
    ParkingToolCalls,
    ResumedCalls,
    StepState,
    waiting_calls,
)
from minions._step.step import Step, StepInput
from minions._step.tool_call import ToolCallExecutor
from minions._step.waits import Waits
from minions._sync import run_sync
from minions._text import as_text, jsonable
from minions._tracing.tracer import error_type
from minions.errors import MinionsError, ModelOutputError, Reask, StepDefinitionError
from minions.models import Model
from minions.tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from minions._step.checkpoints import ItemCheckpoints
    from minions._step.stream import StepStream
    from minions.events import Event, StepCompleted

__all__ = ["StepExecutor"]


_CALL_LIMIT = CallLimitLink()


class _StepEnded(Exception):
    """Internal: the loop has reached a terminal decision."""


class StepExecutor(Generic[OutputT]):
    """Runs one step: builds its prompt, calls the model, runs the tools it asks for, and asks
    the completion chain after every answer, until the step completes or fails. Generic in
    the step's output: a ``StepExecutor(step, context)`` of a ``DefaultStep[Expense]``
    returns a ``StepExecution[Expense]``.

    Definition problems (unknown tool, empty goal, invalid output schema) raise
    `StepDefinitionError` here, before any model call. After that, `execute()` never raises
    for a failure of the step: the returned `StepExecution` is FAILED with a reason. Only
    cancellation from outside propagates (after the execution is recorded as FAILED).

    Args:
        step: the step to run.
        context: the run's context (model, tools, memory, config, events).
        state: run state for templates; defaults to ``{"inputs": context.inputs}``.
        dependencies: outputs of the step's direct dependencies, by step id.
        visit: which visit of this step this is (loops bring steps back).
        conversation_id: the conversation to use; a fresh one per step and visit by default.
        scope: a stable name for this execution within a run (``step#visit`` by default; loop
            items add ``[index]``), carried by its prompts so recordings replay by it.
        item: for one item of a loop step: its index. The execution and its events are then
            named ``step[index]``.
        checked: the step's definition was already checked against these tools (a
            `StepGraph` checks every step before a run); otherwise it is checked here.
    """

    _resumed: StepState | None = None
    """What it kept when its run parked at a call (a durable run), to go on there."""
    _started_as: tuple[str | None, str | None] | None = None
    """What its `StepStarted` says beside its name (`resumed_at`, `restarted`): where it
    goes on, or why it starts again."""

    streaming = False
    """The caller streams this step (`stream()`, or its run's): its model calls ask the model
    to stream, whatever the model's own default."""

    def __init__(
        self,
        step: Step[OutputT],
        context: AgentContext,
        *,
        state: Mapping[str, Any] | None = None,
        dependencies: Mapping[str, Any] | None = None,
        visit: int = 1,
        conversation_id: str | None = None,
        scope: str | None = None,
        item: int | None = None,
        checked: bool = False,
    ) -> None:
        if not checked:
            problems = step.problems(context.tools)
            if problems:
                raise StepDefinitionError(problems)
        self.step: Step[OutputT] = step
        self.context = context
        self.config = context.config.merged(step.config)
        self.state: Mapping[str, Any] = state if state is not None else {"inputs": context.inputs}
        self.dependencies: Mapping[str, Any] = dependencies or {}
        self.item = item
        self._top = scope is None and item is None
        """A step of the run itself (not a loop item or a step inside another step)."""
        name = ItemId(step.id, item)
        self.name = str(name)
        self.scope = scope or name.scope(visit)
        self.conversation_id = conversation_id or f"{context.run_id}/{self.scope}"
        self.execution: StepExecution[OutputT] = StepExecution(
            step_id=self.name,
            visit=visit,
            conversation_id=self.conversation_id,
            step=step,
            config=self.config,
        )
        self.waits = Waits(context.waits if self._top else None)
        """Its waits (an inner execution's are told to the one that runs it, by `run_step`)."""
        # The model may call only the step's tools, whatever else the run registered.
        own = step.own_tools
        if own:
            # The tools given to the step itself, beside the run's tools it names.
            names = {tool.name for tool in own}
            both: list[Tool] = [*context.tools.subset(step.tool_names() - names), *own]
            both.sort(key=lambda tool: tool.name)
            registry = ToolRegistry(both)
        else:
            registry = context.tools.subset(step.tool_names())
        checkpoints = context.checkpoints
        every_call = bool(getattr(step, "requires_approval", False))
        # A durable run parks while a call waits for a decision: a step that may wait keeps
        # its state at the call (`ParkingToolCalls`); every other step has nothing more.
        parking = (
            checkpoints is not None
            and checkpoints.parks
            and (every_call or any(tool.requires_approval for tool in registry))
        )
        self.tools = (ParkingToolCalls if parking else ToolCallExecutor)(
            registry,
            config=self.config,
            emitter=context.events,
            step_id=self.name,
            scope=self.scope,
            approver=context.settings.approver,
            visit=visit,
            item=item,
            approve_every_call=every_call,
            tracer=context.settings.tracer,
            before_call=None if checkpoints is None else checkpoints.before_call,
            waits=self.waits,
        )
        if parking:
            assert checkpoints is not None
            self._may_park(checkpoints)
        if context.deps is not None:
            self.tools.deps = context.deps
        if context.streaming:
            self.streaming = True
        self._error_kind: str | None = None
        """What ended the step as failed, for tracing (``error.type``)."""
        self.deferred = False
        """Its `StepCompleted` is said by `announce`, not when it ends: a durable run says it in
        the commit that stores the step's checkpoint, so a log never tells of a completion
        whose result was lost (the step would run again and complete twice)."""
        self._completion: StepCompleted | None = None

    def _may_park(self, checkpoints: ItemCheckpoints) -> None:
        """A step of a run that parks while a call waits for a decision: its state at such a
        call can be kept (`_state_at`), and it goes on from the state kept for it, if any."""
        tools = self.tools
        assert isinstance(tools, ParkingToolCalls)
        tools.capture = self._state_at
        kept = checkpoints.resume_at(self.scope)
        if kept is None:
            return
        if isinstance(kept, str):
            self._started_as = (None, kept)
            return
        try:
            state = StepState.from_data(kept, step_id=self.name, output=self.step.output)
        except Exception as exc:  # a damaged state: the step starts again, as before
            cause = f"what it kept at its call cannot be read ({type(exc).__name__}: {exc})"
            self._started_as = (None, cause)
            return
        self._resumed = state
        self._started_as = (state.call_id, None)
        tools.kept = {
            id(call): (call, done)
            for call, done in zip(state.answer.tool_calls, state.done, strict=True)
            if done is not None
        }

    def _state_at(
        self, call: ToolCall, made: Mapping[int, tuple[ToolCall, ToolCall]]
    ) -> StepState | str | None:
        """The step's state at `call`, which waits for a decision (`made`: the calls made,
        by the id of the call asked): None when `call` is not one of the answer its model
        loop is at (a call of the step's own: the step runs again and finds its decision);
        why it cannot go on there when it cannot."""
        messages = self.context.memory.messages(self.conversation_id)
        calls = waiting_calls(messages)
        if not any(asked is call for asked in calls):
            return None
        if self.step.memory == "agent":
            return "it works on the run's shared conversation (memory: agent)"
        execution = self.execution
        turn = execution.turns
        reasks = sum(1 for d in execution.decisions if d.kind == "reask" and d.turn == turn)
        before = messages[:-1]
        return StepState(
            scope=self.scope,
            call_id=f"{self.scope}/{call.id}",
            messages=before,
            base=len(before) - (1 if reasks else 0),
            turn=turn,
            reasks=reasks,
            done=tuple(made[id(c)][1] if id(c) in made else None for c in calls),
            model_calls=tuple(execution.model_calls),
            tool_calls=tuple(execution.tool_calls),
            decisions=tuple(execution.decisions),
            usage=execution.usage,
        )

    def _go_on(self, state: StepState) -> tuple[int, str | None]:
        """Put the step back where it waited (its execution so far, its conversation at the
        start of the turn); the turn's re-asks and re-ask note."""
        execution = self.execution
        execution.turns = state.turn - 1
        execution.model_calls = list(state.model_calls)
        execution.tool_calls = list(state.tool_calls)
        execution.decisions = list(state.decisions)
        execution.usage = state.usage
        self.context.record_usage(state.usage)
        self.context.memory.restore(
            MemorySnapshot(self.conversation_id, list(state.messages), state.base)
        )
        return state.reasks, state.messages[state.base].content if state.reasks else None

    @property
    def model(self) -> Model:
        """The model the step calls: its own, else the run's (resolved and wrapped by the run)."""
        return self.context.resolve_model(self.step.model)

    # -- lifecycle -----------------------------------------------------------------------------

    def execute_sync(self) -> StepExecution[OutputT]:
        """`execute` for code that is not async. Inside a running event loop (a notebook, an
        async function) the step runs in a thread of its own while the loop waits: ``await
        execute()`` there keeps the loop free."""
        return run_sync(self.execute, name="step_executor.execute()")

    def stream(self) -> StepStream[OutputT]:
        """Run the step and stream it: its events as they happen, or only the text the model
        writes (`StepStream.text`); the model streams because you do, whatever its own
        default. Use it as an async context manager::

            async with StepExecutor(step, context).stream() as stream:
                async for text in stream.text():
                    print(text, end="")
            execution = stream.execution

        Leaving the block (or breaking out of the loop) before the end cancels the step.
        """
        from minions._step.stream import StepStream

        self.streaming = True
        return StepStream(self.name, self.execute, lambda: self.execution, self.context.events)

    async def execute(self) -> StepExecution[OutputT]:
        """Run the step to a terminal status and return its execution."""
        tracer = self.context.settings.tracer
        if tracer is None:
            return await self._execute()
        execution = self.execution
        resumed_at, restarted = self._started_as or (None, None)
        with tracer.step(
            self.step.id,
            kind=self.step.kind,
            visit=execution.visit,
            item=self.item,
            resumed_at=resumed_at,
            restarted=restarted,
        ) as span:
            try:
                return await self._execute()
            finally:
                span.finished(
                    failed=execution.status is not StepStatus.COMPLETED,
                    error=execution.error,
                    error_kind=self._error_kind,
                )

    async def _execute(self) -> StepExecution[OutputT]:
        execution = self.execution
        execution.status = StepStatus.IN_PROGRESS
        execution.started_at = time.time()
        if self._top:
            self.context.waits.started()
        if self.context.events.active:
            from minions.events import StepStarted  # events load on first use

            told = self._started_as
            self.context.events.emit(
                StepStarted(step_id=self.name, visit=execution.visit)
                if told is None
                else StepStarted(
                    step_id=self.name, visit=execution.visit, resumed_at=told[0], restarted=told[1]
                )
            )
        timeout = self.step.timeout
        try:
            if timeout is None:
                await self.step.run(self)
            else:
                async with asyncio.timeout(timeout):
                    await self.step.run(self)
        except _StepEnded:
            pass
        except TimeoutError as exc:
            self._error_kind = "timeout"
            if timeout is not None and not str(exc):
                self._fail(f"step {self.name!r} timed out after {timeout}s")
            else:
                self._fail(_reason(exc))
        except asyncio.CancelledError:
            self._error_kind = "cancelled"
            self._fail(f"step {self.name!r} was cancelled")
            self._finish()
            raise
        except Exception as exc:
            self._error_kind = error_type(exc)
            self._fail(_reason(exc))
        else:
            if not execution.status.terminal:
                self._fail(f"step {self.name!r} ended without a decision")
        self._finish()
        return execution

    # -- the StepRun protocol (what `Step.run` works with) -----------------------------------

    @property
    def visit(self) -> int:
        """Which visit of the step this is (loops bring steps back)."""
        return self.execution.visit

    def complete(self, output: Any, *, next_step: str | None = None) -> None:
        """End the step as COMPLETED with `output` (for `Step.run` overrides)."""
        self.execution.output = output
        self.execution.next_step = next_step
        self.execution.status = StepStatus.COMPLETED

    def fail(self, reason: str, *, output: Any = None) -> NoReturn:
        """End the step as FAILED with `reason`, keeping a partial `output`."""
        self.execution.output = output
        self._fail(reason)
        raise _StepEnded

    def emit(self, event: Event) -> None:
        """Emit one of the run's events, stamped with the run id and its number."""
        self.context.events.emit(event)

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolCallResponse:
        """Call one of the step's tools (with the run's tool retries) and record the call;
        never raises for the tool's failure (see `StepRun.call_tool`)."""
        count = len(self.execution.tool_calls)
        call_id = f"{self.name}-call" + (f"-{count + 1}" if count else "")
        done = await self.tools.execute(ToolCall(id=call_id, name=name, arguments=dict(arguments)))
        self.execution.tool_calls.append(done)
        assert done.response is not None  # `ToolCallExecutor.execute` always sets it
        return done.response

    async def run_step(
        self,
        step: Step,
        *,
        state: Mapping[str, Any] | None = None,
        dependencies: Mapping[str, Any] | None = None,
        item: int | None = None,
        scope: str | None = None,
        checked: bool = False,
    ) -> StepExecution[Any]:
        """Run another step inside this one and return its execution (see `StepRun.run_step`)."""
        inner: StepExecutor[Any] = StepExecutor(
            step,
            self.context,
            state=self.state if state is None else state,
            dependencies=self.dependencies if dependencies is None else dependencies,
            visit=self.execution.visit,
            scope=scope if scope is not None or item is not None else f"{self.scope}/{step.id}",
            item=item,
            checked=checked,
        )
        inner.waits.parent = self.waits  # its waits are this step's too
        inner.streaming = self.streaming
        checkpoints = self.context.checkpoints
        if checkpoints is None or item is None or not self._top:
            return await inner.execute()
        # An item of one of the run's own loop steps: a checkpoint of its own.
        restored = await checkpoints.restore_item(inner.name, self.execution.visit)
        if restored is not None:
            self.context.record_usage(restored.usage)
            return restored
        inner.deferred = True
        execution = await inner.execute()
        if execution.status is StepStatus.COMPLETED:
            await checkpoints.save_item(execution, item, inner.announce)
        return execution

    def absorb(self, executions: Sequence[StepExecution[Any]], *, items: bool = False) -> None:
        """Count inner executions in this one; with `items`, keep them as its items."""
        self.execution.absorb(executions)
        if items:
            self.execution.items = list(executions)

    def _fail(self, reason: str) -> None:
        self.execution.status = StepStatus.FAILED
        self.execution.error = reason

    def _finish(self) -> None:
        execution = self.execution
        self._close_pending_tool_calls()
        execution.finished_at = time.time()
        execution.waited = self.waits.seconds
        if self._top:
            self.context.waits.ended()
            metrics = self.context.settings.metrics
            if metrics is not None:
                metrics.step_ended(
                    self.step.id, duration=execution.duration or 0.0, waited=execution.waited
                )
        execution.messages = self.context.memory.messages(self.conversation_id)
        duration = execution.duration or 0.0
        events = self.context.events
        if not events.active:
            return
        from minions.events import StepCompleted, StepFailed

        if execution.status is StepStatus.COMPLETED:
            completion = StepCompleted(
                step_id=self.name,
                visit=execution.visit,
                output=execution.output,
                usage=usage_record(execution.usage),
                duration=duration,
                waited=execution.waited,
            )
            if self.deferred:
                self._completion = completion
            else:
                events.emit(completion)
        else:
            events.emit(
                StepFailed(
                    step_id=self.name,
                    visit=execution.visit,
                    error=execution.error or "",
                    usage=usage_record(execution.usage),
                    duration=duration,
                    waited=execution.waited,
                )
            )

    def announce(self) -> None:
        """Say the step's deferred `StepCompleted` (once; nothing when there is none)."""
        completion, self._completion = self._completion, None
        if completion is not None:
            self.context.events.emit(completion)

    def _close_pending_tool_calls(self) -> None:
        """Keep the memory invariant on every path: an assistant message asking for tools is
        followed by one result per call id, even when the step ended before they ran."""
        memory = self.context.memory
        messages = memory.messages(self.conversation_id)
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.role == "assistant":
                answered = {m.tool_call_id for m in messages[index + 1 :] if m.role == "tool"}
                missing = [c for c in message.tool_calls if c.id not in answered]
                reason = self.execution.error or "the step ended"
                memory.append(
                    self.conversation_id,
                    *(Message.tool(c.id, f"Not executed: {reason}.", name=c.name) for c in missing),
                )
                return
            if message.role != "tool":
                return

    # -- the loop ------------------------------------------------------------------------------

    def _tool_specs(self) -> tuple[ToolSpec, ...]:
        specs = [tool.spec for tool in self.tools.registry]  # the step's own tools, sorted
        if self.step.completion_tool:
            specs.append(_completion_tool_spec(self.step))
        return tuple(specs)

    def _start_conversation(self) -> None:
        messages = self.step.build_messages(
            StepInput(context=self.context, state=self.state, dependencies=self.dependencies)
        )
        memory = self.context.memory
        if memory.messages(self.conversation_id):
            # A shared conversation already has its system prompt.
            messages = [m for m in messages if m.role != "system"]
        memory.append(self.conversation_id, *messages)

    async def run_model_loop(self) -> None:
        """The model ⇄ tool loop, until the completion chain decides or the call limit; for
        a step that says ``cache``, the output of an earlier execution with the same rendered
        prompt, model, tools and output schema, in the same world (its recipe, where its
        tools come from and what they reach), when the step cache has one."""
        resumed = self._resumed
        if resumed is not None:
            # It goes on at the call it waited at, in the conversation it kept (the step
            # cache is neither asked nor filled).
            self._resumed = None
            await self._model_loop(resumed)
            return
        self._start_conversation()
        policy, cache = self.step.cache, self.context.step_cache
        key = None
        if policy is not None and cache is not None and self._cacheable(policy.side_effects):
            key = cache_key(
                messages=self.context.memory.messages(self.conversation_id),
                model=self.model,
                tools=self._tool_specs(),
                output=self.step.output,
                world=cache_world(
                    self.context.recipe_scope,
                    self.tools.registry,
                    self.context.settings.mcp_servers,
                ),
            )
            if await self._cached(cache, key, policy.ttl):
                return
        await self._model_loop()
        execution = self.execution
        if key is not None and cache is not None and execution.status is StepStatus.COMPLETED:
            await cache.put(
                key,
                CachedStep(
                    output=jsonable(execution.output),
                    next_step=execution.next_step,
                    usage=dataclasses.asdict(execution.usage),
                    step_id=self.name,
                    run_id=self.context.run_id,
                    recipe_id=str(self.context.recipe_scope.get("id", "")),
                ),
            )

    def _cacheable(self, side_effects: bool) -> bool:
        """Whether the step may be served from the cache: its tools have no side effects and
        need no approval, or its policy accepts skipping them."""
        if side_effects:
            return True
        if getattr(self.step, "requires_approval", False):
            return False
        return not any(t.side_effects or t.requires_approval for t in self.tools.registry)

    async def _cached(self, cache: StepCache, key: str, ttl: float | None) -> bool:
        """Complete the step with the cache's entry of `key`, if it has one (an output that
        no longer matches the step's schema is a miss)."""
        entry = await cache.get(key, ttl=ttl)
        if entry is None:
            return False
        from minions.events import StepCached, UsageRecord  # events load on first use

        output = entry.output
        if self.step.output is not None:
            try:
                output = self.step.output.validate_python(output)
            except MinionsError:
                return False
        self.context.memory.append(self.conversation_id, Message.assistant(as_text(output)))
        if self.context.events.active:
            self.context.events.emit(
                StepCached(
                    step_id=self.name,
                    visit=self.execution.visit,
                    key=key,
                    age=max(0.0, cache_age(cache, entry)),
                    source_step=entry.step_id,
                    saved=UsageRecord(**entry.usage),
                )
            )
        self.complete(output, next_step=entry.next_step)
        return True

    async def _model_loop(self, resumed: StepState | None = None) -> None:
        step, config, execution = self.step, self.config, self.execution
        memory = self.context.memory
        conversation = self.conversation_id
        chain = step.completion_chain(
            self.context.completion_chain or StepCompletionChain.default()
        )
        calls: ModelCallExecutor | ResumedCalls
        calls = model_calls = ModelCallExecutor(
            self.model, context=self.context, execution=execution, config=config, waits=self.waits
        )
        tools = self._tool_specs()
        reasks = 0
        note: str | None = None
        if resumed is not None:
            # Back in the turn it waited in: answered by the answer kept.
            calls = ResumedCalls(model_calls, resumed)
            reasks, note = self._go_on(resumed)
        while True:
            # The chain's `CallLimitLink` decides at the limit; a chain without it (or whose
            # links only said "go on") is stopped by the same link here.
            limited = _CALL_LIMIT.check(execution, self.context)
            if limited is not None:
                self._record_decision(_CALL_LIMIT.name, limited, execution.turns)
                self._fail(limited.reason)
                return
            turn = execution.turns + 1
            base = memory.snapshot(conversation)
            while True:
                if note is not None:
                    # Transactional re-ask: back to before the failed answer, plus one note.
                    memory.restore(base)
                    memory.append(conversation, Message.user(note))
                prompt = Prompt(
                    messages=memory.messages(conversation),
                    tools=tools,
                    output=step.output,
                    step_id=step.id,
                    scope=self.scope,
                    stream=self.streaming,
                )
                try:
                    response = await calls.call(prompt, turn=turn)
                except ModelOutputError as exc:
                    calls.reasked()
                    # A re-ask is a decision like a link's: recorded and said, with its reason.
                    self._record_decision(
                        "structured_output" if exc.mode is not None else "model_output",
                        CompletionDecision.reask(exc.note, reason=exc.reason),
                        turn,
                    )
                    reasks = self._count_reask(reasks, exc.reason, base)
                    note = exc.note  # the model is told; people are told the reason
                    continue
                execution.turns = turn
                memory.append(conversation, response.message)
                if response.tool_calls:
                    await self._run_tool_calls(response.tool_calls)
                found = await chain.check(execution, self.context)
                if found is None:
                    break
                link, decision = found
                if step.validators and decision.kind == "complete":
                    name, decision = await self._validate(link.name, decision, turn)
                    self._record_decision(name, decision, turn)
                else:
                    self._record_decision(link.name, decision, turn)
                if decision.kind == "reask":
                    calls.reasked()
                    self._mark_rejected(decision.reason or decision.note or "")
                    reasks = self._count_reask(reasks, decision.reason or decision.note or "", base)
                    note = decision.note or decision.reason
                    continue
                if decision.kind == "complete":
                    self.complete(decision.output, next_step=decision.next_step)
                    return
                if decision.kind == "fail":
                    self._fail(decision.reason)
                    return
                memory.append(conversation, Message.user(decision.note or decision.reason))
                break
            reasks, note = 0, None

    async def _validate(
        self, link: str, decision: CompletionDecision[Any], turn: int
    ) -> tuple[str, CompletionDecision[Any]]:
        """The step's validators on a complete decision's output, in order: the decision with
        the output they returned, or a validator's re-ask (it raised `ValueError`/`Reask`).
        A validator raising anything else fails the step."""
        output = decision.output
        for validator in self.step.validators:
            name = f"validator:{getattr(validator, '__name__', type(validator).__name__)}"
            try:
                checked = validator(output)
                if inspect.isawaitable(checked):
                    checked = await checked
            except Reask as exc:
                return name, CompletionDecision.reask(
                    f"Your answer was rejected: {exc.message}", reason=exc.reason
                )
            except ValueError as exc:
                message = str(exc) or type(exc).__name__
                return name, CompletionDecision.reask(
                    f"Your answer was rejected: {message}", reason=message
                )
            except Exception as exc:
                reason = (
                    f"validator {name.partition(':')[2]!r} of step {self.name!r} raised "
                    f"{type(exc).__name__}: {exc} (raise ValueError or minions.Reask to re-ask "
                    "the model)"
                )
                self._record_decision(name, CompletionDecision.fail(reason), turn)
                self._error_kind = error_type(exc)
                self._fail(reason)
                raise _StepEnded from exc
            output = checked
        return link, dataclasses.replace(decision, output=output)

    def _count_reask(self, reasks: int, reason: str, base: MemorySnapshot) -> int:
        reasks += 1
        if reasks > self.config.max_output_retries:
            # Giving up: the conversation keeps no trace of the rejected answers either.
            self.context.memory.restore(base)
            self._fail(
                f"invalid output after {reasks} attempts "
                f"(max_output_retries={self.config.max_output_retries}): {reason}"
            )
            raise _StepEnded
        from minions.events import RetryScheduled

        self.context.events.emit(
            RetryScheduled(step_id=self.name, target="output", attempt=reasks, reason=reason)
        )
        return reasks

    def _mark_rejected(self, note: str) -> None:
        calls = self.execution.model_calls
        if calls and calls[-1].error is None:
            calls[-1] = dataclasses.replace(calls[-1], error=f"rejected: {note}")

    def _record_decision(self, link: str, decision: CompletionDecision[Any], turn: int) -> None:
        reason = decision.reason or decision.kind
        self.execution.decisions.append(
            DecisionRecord(link=link, kind=decision.kind, reason=reason, turn=turn)
        )
        if self.context.events.active:
            from minions.events import CompletionDecided

            self.context.events.emit(
                CompletionDecided(
                    step_id=self.name, link=link, decision=decision.kind, reason=reason
                )
            )

    async def _run_tool_calls(self, calls: Sequence[ToolCall]) -> None:
        """Run the calls of one answer, each into its own slot, and append one result per call
        id in the model's order, whatever happens (including cancellation)."""
        slots: list[ToolCall | None] = [None] * len(calls)
        control = self._control_tools()
        ending = next((c.name for c in calls if c.name in control), None)

        async def run(index: int, call: ToolCall) -> None:
            slots[index] = await self.tools.execute(call)

        try:
            if ending is not None:
                # The answer ends the step: acknowledge it and run nothing else.
                for index, call in enumerate(calls):
                    text = (
                        "Received."
                        if call.name in control
                        else (f"Not executed: {ending} ended the step.")
                    )
                    slots[index] = _answered(call, text)
            elif self.config.sequential_tool_calls or len(calls) == 1:
                for index, call in enumerate(calls):
                    await run(index, call)
            else:
                async with asyncio.TaskGroup() as group:
                    for index, call in enumerate(calls):
                        group.create_task(run(index, call))
        finally:
            results = []
            for call, done in zip(calls, slots, strict=True):
                if done is not None and done.response is not None:
                    if ending is None:
                        self.execution.tool_calls.append(done)
                    results.append(Message.tool(call.id, done.response.content, name=call.name))
                else:
                    results.append(
                        Message.tool(call.id, "Not executed: cancelled.", name=call.name)
                    )
            self.context.memory.append(self.conversation_id, *results)

    def _control_tools(self) -> frozenset[str]:
        names = set()
        if self.step.output is not None:
            names.add(self.step.output.tool_name)
        if self.step.completion_tool:
            names.add(COMPLETION_TOOL)
        return frozenset(names)


def _answered(call: ToolCall, text: str) -> ToolCall:
    return dataclasses.replace(
        call, response=ToolCallResponse(call_id=call.id, name=call.name, content=text)
    )


def _completion_tool_spec(step: Step) -> ToolSpec:
    result: Mapping[str, Any]
    if step.output is not None:
        result = dict(step.output.json_schema())
    else:
        result = {"type": "string", "description": "The step's final result."}
    return ToolSpec(
        name=COMPLETION_TOOL,
        description="Call this when the task is done, with its final result.",
        parameters={
            "type": "object",
            "properties": {
                "result": result,
                "next_step": {"type": "string", "description": "Optional: which step runs next."},
            },
            "required": ["result"],
        },
    )


def _reason(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return _reason(error.exceptions[0])  # one of parallel tool calls' (no deps, say)
    if isinstance(error, MinionsError):
        return str(error)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
