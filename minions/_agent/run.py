"""One run's machinery: the tasks of its running steps around a `StepManager`, fail-fast,
sync steps, fire-and-forget grace, and the run's end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from minions._agent.checkpoints import StepCheckpoints
from minions._agent.graph import StepGraph
from minions._agent.manager import StepManager
from minions._fold import step_failure
from minions._routing.selection import StepSelectionChain
from minions._step.context import AgentContext
from minions._step.execution import StepExecution, StepStatus
from minions._step.executor import StepExecutor
from minions._step.model_call import usage_record
from minions._step.result import AgentResult
from minions._step.step import Step
from minions.errors import MCPServerError, MinionsError
from minions.events import RunCompleted, RunFailed, RunStarted
from minions.tools import ToolRegistry
from minions.tools._internal import MCPConnections

__all__ = []


class Run:
    """One run: the tasks of its running steps, around a `StepManager`."""

    def __init__(
        self,
        graph: StepGraph,
        context: AgentContext,
        selection: StepSelectionChain | None,
        checkpoints: StepCheckpoints | None = None,
    ) -> None:
        self.graph = graph
        self.context = context
        self.checkpoints = checkpoints
        self.manager = StepManager(graph, context, selection_chain=selection)
        config = context.config
        sequential = graph.recipe.execution_mode == "sequential"
        self.limit = 1 if sequential else config.max_parallel_steps
        self.fail_fast = config.fail_fast
        self.grace = config.fire_and_forget_grace
        self.running: dict[str, tuple[asyncio.Task[tuple[StepExecution, Any]], StepExecutor]] = {}
        self.busy = 0
        """Running steps that are not fire-and-forget."""
        self.sync_running = False
        self.error: str | None = None
        """Why the run stopped early (set once, by `_stop`); ``None`` while it goes on."""
        self.done: asyncio.Future[None] | None = None
        self.grace_timer: asyncio.TimerHandle | None = None
        self.grace_expired = False

    async def execute(self) -> AgentResult:
        metrics = self.context.settings.metrics
        if metrics is None:
            return await self._traced()
        recipe_id = self.graph.recipe.id
        with metrics.run(recipe_id) as own:
            result = await self._traced()
        if own:
            status = "completed" if result.ok else "failed"
            metrics.run_ended(recipe_id, status, duration=result.duration, waited=result.waited)
        return result

    async def _traced(self) -> AgentResult:
        tracer = self.context.settings.tracer
        if tracer is None:
            return await self._execute()
        # The run's span is current while steps are started: their tasks (and the done
        # callbacks that start the next ones) inherit it, so steps are its children.
        checkpoints = self.checkpoints
        with tracer.run(
            self.graph.recipe.id,
            self.context.run_id,
            events=self.context.events,
            attempt=None if checkpoints is None else checkpoints.attempt,
            resumed=checkpoints is not None and checkpoints.resumed,
        ) as span:
            result = await self._execute()
            tracer.run_finished(span, error=result.error, usage=result.usage)
            return result

    async def _execute(self) -> AgentResult:
        context = self.context
        started_at = time.time()
        started = time.perf_counter()
        checkpoints = self.checkpoints
        context.checkpoints = checkpoints
        if checkpoints is None or not checkpoints.resumed:
            context.events.emit(
                RunStarted(recipe_id=self.graph.recipe.id, inputs=dict(context.inputs))
            )
        self.done = asyncio.get_running_loop().create_future()
        # The run's MCP servers are connected to and closed from this task (see _mcp).
        tools = context.tools
        connections = self._mcp_connections() if context.settings.mcp_servers else None
        try:
            if connections is not None:
                try:
                    context.tools = await connections.open()
                except MCPServerError as exc:
                    self._stop(str(exc))
            if self.error is None:
                self._pump()
                await self.done
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            self._stop(
                "the run was cancelled"
                if cancelled
                else f"the run failed: {type(exc).__name__}: {exc}"
            )
            # Wait for the cancelled steps: each task's done callback records its end.
            await asyncio.gather(
                *(task for task, _ in self.running.values()), return_exceptions=True
            )
            await self._disconnect(connections, tools)
            self._end(started_at, started)
            raise
        await self._disconnect(connections, tools)
        return self._end(started_at, started)

    def _mcp_connections(self) -> MCPConnections:
        context = self.context

        def changed(registry: ToolRegistry) -> None:
            context.tools = registry  # steps that start from now on see the new tools

        return MCPConnections(
            context.settings.mcp_servers,
            base=context.tools,
            references={s: step.tool_names() for s, step in self.graph.steps.items()},
            on_change=changed,
        )

    async def _disconnect(self, connections: MCPConnections | None, tools: ToolRegistry) -> None:
        if connections is not None:
            await connections.close()
            self.context.tools = tools

    # -- scheduling ----------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start ready steps while there is room; finish the run when nothing is left."""
        manager = self.manager
        stopping = self.error is not None
        if not stopping:
            while not self.sync_running and len(self.running) < self.limit:
                step = manager.peek()
                if step is None:
                    break
                if step.mode == "sync":
                    if self.busy:
                        break  # It runs alone: wait for the running steps to finish.
                    self.sync_running = True
                self._launch(step.id)
            if manager.error is not None:
                self._stop(manager.error)
        stopping = self.error is not None
        if self.busy or (manager.peek() is not None and not stopping):
            return
        if self.running and not stopping:
            # Only fire-and-forget steps are left: wait for them, within the grace period.
            if self.grace_timer is None:
                loop = asyncio.get_running_loop()
                self.grace_timer = loop.call_later(self.grace, self._end_grace)
            return
        if not self.running and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _launch(self, step_id: str) -> None:
        executor = self.manager.start(step_id)
        task = asyncio.create_task(self._run_step(executor))
        # The callback, not the coroutine, reports the end: a task cancelled before its first
        # step never runs its coroutine at all.
        task.add_done_callback(lambda done: self._task_done(step_id, executor, done))
        self.running[step_id] = (task, executor)
        if executor.step.mode != "fire_and_forget":
            self.busy += 1
            if self.grace_timer is not None:
                self.grace_timer.cancel()
                self.grace_timer = None

    async def _run_step(self, executor: StepExecutor) -> tuple[StepExecution, Any]:
        checkpoints = self.checkpoints
        if checkpoints is None:
            execution = await executor.execute()
            return execution, await self.manager.route(execution)
        step_id, visit = executor.step.id, executor.execution.visit
        restored = await checkpoints.restore(step_id, visit)
        if restored is not None:
            # Done before a crash or a resume: its result as it was, nothing run or said again.
            execution, routing = restored
            _retyped(execution, executor.step)
            self.context.record_usage(execution.usage)
            return execution, (routing, True)
        executor.deferred = True  # said with its checkpoint, once its routing is chosen
        execution = await executor.execute()
        try:
            routing = await self.manager.route(execution)
        except BaseException:
            executor.announce()
            raise
        if execution.status is StepStatus.COMPLETED:
            await checkpoints.save(execution, routing, executor.announce)
        return execution, routing

    def _task_done(
        self, step_id: str, executor: StepExecutor, task: asyncio.Task[tuple[StepExecution, Any]]
    ) -> None:
        if task.cancelled():
            execution = executor.execution
            if not execution.status.terminal:
                execution.status = StepStatus.FAILED
                execution.error = f"step {step_id!r} was cancelled before it started"
            self._finished(step_id, execution)
            return
        exc = task.exception()
        if exc is not None:
            # A selection link or a condition raised: the run cannot know where to go.
            self._stop(f"choosing the step after {step_id!r} failed: {type(exc).__name__}: {exc}")
            self._finished(step_id, executor.execution)
            return
        execution, routing = task.result()
        if isinstance(routing, tuple):  # restored from a checkpoint: its routing is not news
            self._finished(step_id, execution, routing[0], quiet=True)
        else:
            self._finished(step_id, execution, routing)

    def _finished(
        self, step_id: str, execution: StepExecution, routing: Any = None, *, quiet: bool = False
    ) -> None:
        """A step's task ended: hand its execution to the manager, then schedule."""
        try:
            _, executor = self.running.pop(step_id)
            mode = executor.step.mode
            if mode != "fire_and_forget":
                self.busy -= 1
            if mode == "sync":
                self.sync_running = False
            if self.grace_expired and mode == "fire_and_forget":
                execution.error = (
                    f"step {step_id!r} was cancelled: still running {self.grace}s after the "
                    "rest of the run ended (fire_and_forget_grace)"
                )
            failures = self.manager.failures
            self.manager.advance(execution, routing, quiet=quiet)
            if self.fail_fast and failures and failures[-1] is execution:
                self._stop(f"step {step_id!r} failed and fail_fast is set: {execution.error}")
            self._pump()
        except Exception as exc:  # A bug must end the run, not leave it waiting forever.
            if self.done is not None and not self.done.done():
                self.done.set_exception(exc)

    def _stop(self, reason: str) -> None:
        """The run cannot go on: cancel what runs, start nothing new."""
        if self.error is not None:
            return
        self.error = reason
        current = asyncio.current_task()
        for task, _ in self.running.values():
            if task is not current:
                task.cancel()

    def _end_grace(self) -> None:
        self.grace_expired = True
        for task, _ in self.running.values():
            task.cancel()

    # -- the result ----------------------------------------------------------------------------

    def _end(self, started_at: float, started: float) -> AgentResult:
        if self.grace_timer is not None:
            self.grace_timer.cancel()
        manager = self.manager
        reason = None if self.error is None else f"not run: {self.error}"
        manager.close(reason)
        context = self.context
        error = self.error
        if error is None and manager.failures:
            error = "; ".join(step_failure(e.step_id, e.error or "") for e in manager.failures)
        status = StepStatus.FAILED if error is not None else StepStatus.COMPLETED
        duration = time.perf_counter() - started
        waited = min(context.waits.seconds, duration)
        result = AgentResult(
            run_id=context.run_id,
            recipe_id=self.graph.recipe.id,
            status=status,
            executions=tuple(manager.executions),
            # A failed run has no output: what its steps produced stays on their executions.
            output=self._output() if status is StepStatus.COMPLETED else None,
            error=error,
            usage=context.usage,
            inputs=context.inputs,
            state=dict(manager.state),
            started_at=started_at,
            finished_at=started_at + duration,
            waited=waited,
        )
        if status is StepStatus.COMPLETED:
            context.events.emit(
                RunCompleted(
                    output=result.output,
                    usage=usage_record(result.usage),
                    duration=duration,
                    waited=waited,
                )
            )
        else:
            context.events.emit(
                RunFailed(
                    error=error or "",
                    usage=usage_record(result.usage),
                    duration=duration,
                    waited=waited,
                )
            )
        return result

    def _output(self) -> Any:
        graph, executions = self.graph, self.manager.executions
        wanted = graph.recipe.output_step
        fallback = None
        for execution in reversed(executions):
            if execution.status is not StepStatus.COMPLETED:
                continue
            step_id = execution.step_id
            if wanted is not None:
                if step_id == wanted:
                    return execution.output
                continue
            if graph.steps[step_id].mode == "fire_and_forget":
                continue
            if step_id in graph.sinks:
                return execution.output
            if fallback is None:
                fallback = execution
        return fallback.output if fallback is not None else None


def _retyped(execution: StepExecution[Any], step: Step[Any]) -> None:
    """A restored execution's output as its step types it (a stored output is JSON data): a
    `DefaultStep[Expense]`'s is an ``Expense`` again."""
    execution.step = step
    output = step.output
    if output is None or execution.status is not StepStatus.COMPLETED:
        return
    try:
        execution.output = output.validate_python(execution.output)
    except MinionsError:
        pass  # stored by another version of the recipe: kept as it was stored
