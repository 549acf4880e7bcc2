"""AgentExecutor: runs a whole recipe, steps in parallel as soon as they are ready."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from minions.agent.graph import StepGraph
from minions.agent.manager import StepManager
from minions.agent.recipe import AgentRecipe
from minions.agent.result import AgentResult
from minions.agent.selection import StepSelectionChain
from minions.config import ExecutionConfig
from minions.context import AgentContext
from minions.errors import UnknownRecipeError
from minions.events import EventListener, RunCompleted, RunFailed, RunStarted
from minions.memory import ModelMemory
from minions.models.base import Model
from minions.step.completion import StepCompletionChain
from minions.step.execution import StepExecution, StepStatus
from minions.step.executor import StepExecutor
from minions.step.model_call import usage_record
from minions.tools import Tool, ToolRegistry

__all__ = ["AgentExecutor", "RunStream"]


_GRAPH_CACHE = 32
"""How many graphs of unregistered recipes an executor keeps."""


class AgentExecutor:
    """Runs recipes: validates each into a `StepGraph`, creates the run's `AgentContext`,
    starts every step as soon as its own dependencies are done (up to `max_parallel_steps`
    at once) and returns an `AgentResult`, or streams the run's events.

    Args:
        model: the default model (a `Model` or a model string); a recipe's or a step's own
            model wins. ``None``: the `MINIONS_MODEL` environment variable, on first use.
        tools: tools every recipe may use (plus each recipe's own).
        memory: where conversations live; a fresh in-process memory per run by default.
        config: execution settings; a recipe's `config` and each step's override them.
        listeners: callables receiving every event of every run.
        recipes: recipes to run by id.
        completion_chain: the completion chain of steps (unless a recipe or step has one).
        selection_chain: how next steps are chosen (unless a recipe has its own).
        model_resolver: turns each model a run names (the recipe's or a step's `Model` or
            model string, ``None`` when none is named) into the model to call; by default
            `infer_model`. ``lambda _spec: ReplayModel(...)`` replays every model, the ones
            recipes and steps name included.
        model_wrapper: applied once to every model a run uses, after `model_resolver`
            (recording...).
    """

    def __init__(
        self,
        *,
        model: Model | str | None = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        memory: ModelMemory | None = None,
        config: ExecutionConfig | None = None,
        listeners: Iterable[EventListener] = (),
        recipes: Iterable[AgentRecipe] = (),
        completion_chain: StepCompletionChain | None = None,
        selection_chain: StepSelectionChain | None = None,
        model_resolver: Callable[[Model | str | None], Model] | None = None,
        model_wrapper: Callable[[Model], Model] | None = None,
    ) -> None:
        self.model = model
        self.tools = ToolRegistry(tools)
        self.memory = memory
        self.config = config or ExecutionConfig()
        self.listeners: list[EventListener] = list(listeners)
        self.completion_chain = completion_chain
        self.selection_chain = selection_chain
        self.model_resolver = model_resolver
        self.model_wrapper = model_wrapper
        self.recipes: dict[str, AgentRecipe] = {}
        # The graphs of the recipes run lately, by recipe identity (a graph holds its recipe,
        # so an id cannot be reused while cached); bounded, so ad-hoc recipes do not pile up.
        self._graphs: OrderedDict[int, StepGraph] = OrderedDict()
        for recipe in recipes:
            self.register(recipe)

    # -- recipes -------------------------------------------------------------------------------

    def register(self, recipe: AgentRecipe) -> StepGraph:
        """Add a recipe to run by id; it is validated now.

        Raises:
            RecipeError: the recipe is invalid.
            ValueError: another recipe has the same id.
        """
        existing = self.recipes.get(recipe.id)
        if existing is not None and existing is not recipe:
            raise ValueError(f"two different recipes have the id {recipe.id!r}")
        graph = self.graph(recipe)
        self.recipes[recipe.id] = recipe
        return graph

    def recipe(self, recipe: AgentRecipe | str) -> AgentRecipe:
        """A recipe given as itself or by the id it was registered with.

        Raises:
            UnknownRecipeError: no registered recipe has this id.
        """
        if isinstance(recipe, AgentRecipe):
            return recipe
        found = self.recipes.get(recipe)
        if found is None:
            known = ", ".join(map(repr, sorted(self.recipes))) or "none are registered"
            raise UnknownRecipeError(f"unknown recipe {recipe!r} (known recipes: {known})")
        return found

    def graph(self, recipe: AgentRecipe | str) -> StepGraph:
        """The recipe's validated graph (checked once per recipe and executor).

        Raises:
            RecipeError: every problem of the recipe.
        """
        recipe = self.recipe(recipe)
        graph = self._graphs.get(id(recipe))
        if graph is not None:
            self._graphs.move_to_end(id(recipe))
            return graph
        graph = self._graphs[id(recipe)] = StepGraph(recipe, tools=self._registry(recipe))
        while len(self._graphs) > _GRAPH_CACHE + len(self.recipes):
            self._graphs.popitem(last=False)
        return graph

    def _registry(self, recipe: AgentRecipe) -> ToolRegistry:
        if not recipe.tools:
            return self.tools
        return ToolRegistry([*self.tools, *recipe.tools])

    # -- running -------------------------------------------------------------------------------

    def create_context(
        self,
        recipe: AgentRecipe,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> AgentContext:
        """The context of a new run of `recipe`: its model, tools, memory, config, inputs
        (`AgentRecipe.check_inputs`: the recipe's defaults under the given ones) and event
        listeners.

        Raises:
            RecipeError: the recipe is invalid.
            InputError: the inputs are not what the recipe declares.
        """
        graph = self.graph(recipe)
        return AgentContext(
            model=recipe.model if recipe.model is not None else self.model,
            tools=graph.tools if graph.tools is not None else self._registry(recipe),
            memory=self.memory,
            config=self.config.merged(recipe.config),
            inputs=recipe.check_inputs(inputs or {}),
            listeners=[*self.listeners, *listeners],
            completion_chain=recipe.completion_chain or self.completion_chain,
            run_id=run_id,
            model_resolver=self.model_resolver,
            model_wrapper=self.model_wrapper,
        )

    async def execute(
        self,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> AgentResult:
        """Run a recipe (or the registered recipe with this id) to the end.

        A failing step does not raise: the result is FAILED, with every step's execution.
        Cancelling the call cancels every running step, emits `RunFailed` and re-raises.

        Args:
            recipe: the recipe, or the id of a registered one.
            inputs: the run's inputs (templates read them as ``inputs``).
            run_id: the run's id; a new random one by default.
            listeners: callables receiving this run's events, in order.

        Raises:
            RecipeError: the recipe is invalid (nothing has run).
            UnknownRecipeError: no registered recipe has this id.
        """
        found = self.recipe(recipe)
        graph = self.graph(found)
        context = self.create_context(found, inputs, run_id=run_id, listeners=listeners)
        return await self.run(graph, context)

    def execute_sync(
        self,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> AgentResult:
        """`execute` for code that is not async."""
        return asyncio.run(self.execute(recipe, inputs, run_id=run_id, listeners=listeners))

    def stream(
        self,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
    ) -> RunStream:
        """Run a recipe and iterate its events as they happen, in sequence order, ending with
        `RunCompleted` or `RunFailed`::

            stream = executor.stream(recipe, inputs={"topic": "bees"})
            async for event in stream:
                print(event.kind, event.step_id)
            print(stream.result.output)

        To stop early, leave an ``async with`` block around the stream, or call
        ``await stream.aclose()``: either cancels a run still going (a bare ``break`` only
        stops reading; the run goes on until the stream is closed or garbage collected)::

            async with executor.stream(recipe) as stream:
                async for event in stream:
                    if event.kind == "step_failed":
                        break
        """
        return RunStream(self, recipe, inputs, run_id=run_id)

    async def run(self, graph: StepGraph, context: AgentContext) -> AgentResult:
        """Run a validated graph in a context you built (see `create_context`)."""
        selection = graph.recipe.selection_chain or self.selection_chain
        return await _Run(graph, context, selection).execute()


class RunStream:
    """The events of one run, as an async iterator; `result` is set once it has ended."""

    def __init__(
        self,
        executor: AgentExecutor,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None,
        *,
        run_id: str | None,
    ) -> None:
        self._executor = executor
        self._recipe = recipe
        self._inputs = inputs
        self._run_id = run_id
        self._events: AsyncGenerator[Any, None] | None = None
        self.result: AgentResult | None = None
        """The run's result, once the last event has been read."""

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._events is None:
            self._events = self._generate()
        return self._events

    async def aclose(self) -> None:
        """Stop reading; a run still going is cancelled."""
        if self._events is not None:
            await self._events.aclose()

    async def __aenter__(self) -> RunStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _generate(self) -> AsyncGenerator[Any, None]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.create_task(
            self._executor.execute(
                self._recipe, self._inputs, run_id=self._run_id, listeners=[queue.put_nowait]
            )
        )
        task.add_done_callback(lambda _: queue.put_nowait(_END))
        try:
            while True:
                event = await queue.get()
                if event is _END:
                    break
                yield event
            self.result = task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


_END = object()


class _Run:
    """One run: the tasks of its running steps, around a `StepManager`."""

    def __init__(
        self, graph: StepGraph, context: AgentContext, selection: StepSelectionChain | None
    ) -> None:
        self.graph = graph
        self.context = context
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
        context = self.context
        started_at = time.time()
        started = time.perf_counter()
        context.events.emit(RunStarted, recipe_id=self.graph.recipe.id, inputs=dict(context.inputs))
        self.done = asyncio.get_running_loop().create_future()
        try:
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
            self._end(started_at, started)
            raise
        return self._end(started_at, started)

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
        execution = await executor.execute()
        return execution, await self.manager.route(execution)

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
        self._finished(step_id, *task.result())

    def _finished(self, step_id: str, execution: StepExecution, routing: Any = None) -> None:
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
            self.manager.advance(execution, routing)
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
            error = "; ".join(f"step {e.step_id!r} failed: {e.error}" for e in manager.failures)
        status = StepStatus.FAILED if error is not None else StepStatus.COMPLETED
        duration = time.perf_counter() - started
        result = AgentResult(
            run_id=context.run_id,
            recipe_id=self.graph.recipe.id,
            status=status,
            executions=tuple(manager.executions),
            output=self._output(),
            error=error,
            usage=context.usage,
            inputs=context.inputs,
            state=dict(manager.state),
            started_at=started_at,
            finished_at=started_at + duration,
        )
        if status is StepStatus.COMPLETED:
            context.events.emit(
                RunCompleted,
                output=result.output,
                usage=usage_record(result.usage),
                duration=duration,
            )
        else:
            context.events.emit(
                RunFailed, error=error or "", usage=usage_record(result.usage), duration=duration
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
