"""What a worker does with one run: rebuild its recipe from the snapshot, run it with the store
as its step checkpoints, and write its events to the log (one commit per finished step, and
a short interval's worth of events at a time while a step runs)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions._agent.executor import AgentExecutor
from minions._routing.selection import Routing
from minions._step.execution import StepExecution, StepStatus
from minions._text import jsonable
from minions._values import Usage
from minions.errors import MinionsError, RecipeError
from minions.events import Event, event_to_json
from minions.models._base import Model
from minions.recipes._build import load_recipe_file
from minions.recipes._recipe import AgentRecipe
from minions.runs._store import Store, dumps
from minions.tools._approval import ApprovalDecision, ApprovalRequest

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__: list[str] = []

TERMINAL_KINDS = frozenset({"run_completed", "run_failed"})


def execution_data(execution: StepExecution) -> dict[str, Any]:
    """A finished execution as JSON: enough to restore it in place of running the step."""
    return {
        "step_id": execution.step_id,
        "status": execution.status.value,
        "output": jsonable(execution.output),
        "error": execution.error,
        "next_step": execution.next_step,
        "visit": execution.visit,
        "usage": dataclasses.asdict(execution.usage),
        "turns": execution.turns,
        "attempts": max(1, sum(1 for call in execution.model_calls if call.attempt == 1))
        if execution.model_calls
        else 1,
        "model_calls": len(execution.model_calls),
        "tool_calls": len(execution.tool_calls),
        "items": [execution_data(item) for item in execution.items],
        "started_at": execution.started_at,
        "finished_at": execution.finished_at,
    }


def execution_from(data: dict[str, Any]) -> StepExecution:
    return StepExecution(
        step_id=data["step_id"],
        status=StepStatus(data["status"]),
        output=data.get("output"),
        error=data.get("error"),
        next_step=data.get("next_step"),
        visit=data.get("visit", 1),
        usage=Usage(**data.get("usage", {})),
        turns=data.get("turns", 0),
        items=[execution_from(item) for item in data.get("items", [])],
        started_at=data.get("started_at"),
        finished_at=data.get("finished_at"),
    )


def routing_data(routing: Routing | None) -> str | None:
    return None if routing is None else dumps(dataclasses.asdict(routing))


def routing_from(text: str | None) -> Routing | None:
    if text is None:
        return None
    data = json.loads(text)
    return Routing(
        chosen=tuple(data["chosen"]),
        unchosen=tuple(data["unchosen"]),
        selector=data["selector"],
        reason=data["reason"],
    )


class LiveHub:
    """In-process subscribers of runs' events, token deltas included (which are never
    stored): a service with a worker in its own process streams them live."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Callable[[dict[str, Any]], None]]] = {}

    def subscribe(
        self, run_id: str, callback: Callable[[dict[str, Any]], None]
    ) -> Callable[[], None]:
        self._subscribers.setdefault(run_id, []).append(callback)

        def unsubscribe() -> None:
            callbacks = self._subscribers.get(run_id, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._subscribers.pop(run_id, None)

        return unsubscribe

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        for callback in list(self._subscribers.get(run_id, ())):
            callback(event)


class RunRecorder:
    """A run's event listener and step checkpoints, over the store.

    Stored events are numbered by the recorder, contiguously after the last one stored (a run
    resumed or recovered continues its numbering); a token delta is not stored and carries the
    number of the last stored event. A restored step writes nothing."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        hub: LiveHub | None = None,
        interval: float = 0.05,
        last: int | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.hub = hub
        self.interval = interval
        self.last = store.last_seq(run_id) if last is None else last
        """The number of the last event stored (read from the store unless given)."""
        self.resumed = self.last > 0
        self.pending: list[dict[str, Any]] = []
        self.saved: dict[tuple[str, int], tuple[str, str | None]] | None = (
            None if self.resumed else {}
        )
        """The run's finished steps, read once when it resumes (a new run has none)."""
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        data = json.loads(event_to_json(event))
        kind = data["kind"]
        if kind == "token_delta":
            data["seq"] = self.last
        elif kind == "run_started" and self.resumed:
            return  # said when the run first started; a resumed run goes on from there
        else:
            self.last += 1
            data["seq"] = self.last
            self.pending.append(data)
            if self._timer is None:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(self.interval, self._flush_soon)
        if self.hub is not None:
            self.hub.publish(self.run_id, data)

    def _flush_soon(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def flush(self, **run: Any) -> None:
        """Write what is pending (and `run` values for the run's row) in one commit."""
        async with self._lock:
            events, self.pending = self.pending, []
            await asyncio.to_thread(self.store.write, self.run_id, events, run=run or None)

    async def close(self, **run: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._flushes):
            await asyncio.gather(task, return_exceptions=True)
        await self.flush(**run)

    # -- checkpoints -------------------------------------------------------------------------

    async def restore(
        self, step_id: str, visit: int
    ) -> tuple[StepExecution, Routing | None] | None:
        if self.saved is None:
            self.saved = await asyncio.to_thread(self.store.saved_steps, self.run_id)
        saved = self.saved.get((step_id, visit))
        if saved is None:
            return None
        execution, routing = saved
        return execution_from(json.loads(execution)), routing_from(routing)

    async def save(self, execution: StepExecution, routing: Routing | None) -> None:
        step = {
            "step_id": execution.step_id,
            "visit": execution.visit,
            "status": execution.status.value,
            "execution": dumps(execution_data(execution)),
            "routing": routing_data(routing),
            "saved_at": time.time(),
        }
        async with self._lock:
            events, self.pending = self.pending, []
            await asyncio.to_thread(self.store.write, self.run_id, events, step=step)


@functools.lru_cache(maxsize=32)
def recipe_of(yaml_text: str, path: str | None) -> AgentRecipe:
    """The run's recipe from its snapshot, built as `minions run` would build the file it came
    from (tools and included recipes found beside it, its files protected from the file
    tools). Built once per snapshot and process: a recipe is immutable, and a tools module is
    imported once per process anyway.

    Raises:
        RecipeError: the snapshot does not build (a tools module beside it changed...).
    """
    file = Path(path) if path else Path.cwd() / "recipe.yaml"
    return load_recipe_file(file, text=yaml_text).recipe


class RunCancelled(Exception):
    """The run was cancelled on request."""


class RunFailedError(MinionsError):
    """The run failed (DBOS records the workflow as failed, so it can be resumed)."""


class DurableRunner:
    """Runs the runs a worker's queue hands it."""

    def __init__(
        self,
        store: Store,
        *,
        executor_id: str,
        model: str | None = None,
        resolver: Callable[[Model | str | None], Model] | None = None,
        hub: LiveHub | None = None,
        cancel_poll: float = 0.2,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.store = store
        self.executor_id = executor_id
        self.model = model
        self.resolver = resolver
        self.hub = hub
        self.cancel_poll = cancel_poll
        self.running: dict[str, asyncio.Task[Any]] = {}
        self._waiting: dict[str, int] = {}
        """Calls each run waits on (the run is `waiting` while there is one)."""
        self.executor = AgentExecutor(
            model=model,
            model_resolver=resolver,
            approver=self.approve,
            tracer_provider=tracer_provider,
        )
        """One for every run: it validates each recipe snapshot once."""

    async def execute(self, run_id: str) -> None:
        store = self.store
        record, yaml_text, path, inputs, last = await asyncio.to_thread(store.run_to_start, run_id)
        if record.terminal:
            return  # finished (or cancelled) already: a duplicate delivery
        recorder = RunRecorder(store, run_id, hub=self.hub, last=last)
        try:
            recipe = recipe_of(yaml_text, path)
        except RecipeError as exc:
            await self._fail_before_start(recorder, f"the recipe no longer loads: {exc}")
            raise RunFailedError(str(exc)) from None
        await asyncio.to_thread(
            store.update_run,
            run_id,
            status="running",
            started_at=record.started_at or time.time(),
            executor_id=self.executor_id,
            finished_at=None,
            error=None,
        )
        executor = self.executor
        graph = executor.graph(recipe)
        context = executor.create_context(
            recipe, inputs, run_id=run_id, listeners=[recorder.on_event]
        )
        task = asyncio.create_task(executor.run(graph, context, checkpoints=recorder))
        self.running[run_id] = task
        watcher = asyncio.create_task(self._watch(run_id, task))
        try:
            result = await task
        except asyncio.CancelledError:
            if not watcher.done() or watcher.cancelled() or not watcher.result():
                raise  # the worker is stopping: the run stays pending and is recovered
            await recorder.close(
                status="cancelled",
                finished_at=time.time(),
                error="cancelled on request",
                usage=dataclasses.asdict(context.usage),
            )
            return
        finally:
            watcher.cancel()
            self.running.pop(run_id, None)
        status = "completed" if result.ok else "failed"
        await recorder.close(
            status=status,
            finished_at=time.time(),
            output=jsonable(result.output),
            error=result.error,
            usage=dataclasses.asdict(result.usage),
        )
        if not result.ok:
            raise RunFailedError(result.error or "the run failed")

    async def approve(self, request: ApprovalRequest) -> ApprovalDecision:
        """Wait durably for a person's decision: the request is stored, the run is `waiting`
        until `minions runs approve` decides it (a step run again after a restart finds the
        same request, or its decision)."""
        store, run_id = self.store, request.run_id
        record = await asyncio.to_thread(
            store.request_approval,
            run_id,
            call_id=request.call_id,
            step_id=request.step_id,
            tool=request.tool,
            arguments=request.arguments,
        )
        self._waiting[run_id] = self._waiting.get(run_id, 0) + 1
        try:
            if record.decided_at is None:
                await asyncio.to_thread(store.update_run, run_id, status="waiting")
            while record.decided_at is None:
                await asyncio.sleep(self.cancel_poll)
                found = await asyncio.to_thread(store.approval, run_id, request.call_id)
                assert found is not None
                record = found
        finally:
            self._waiting[run_id] -= 1
            if not self._waiting[run_id]:
                del self._waiting[run_id]
                await asyncio.to_thread(store.update_run, run_id, status="running")
        return ApprovalDecision(approved=bool(record.approved), reason=record.reason)

    async def _watch(self, run_id: str, task: asyncio.Task[Any]) -> bool:
        """Cancel the run's task when a cancel is requested; True when it did."""
        while not task.done():
            await asyncio.sleep(self.cancel_poll)
            record = await asyncio.to_thread(self.store.get_run, run_id, details=False)
            if record.cancel_requested:
                task.cancel()
                return True
        return False

    async def _fail_before_start(self, recorder: RunRecorder, error: str) -> None:
        from minions.events import RunFailed

        recorder.last += 1
        event = json.loads(event_to_json(RunFailed(run_id=recorder.run_id, error=error)))
        event["seq"] = recorder.last
        event["timestamp"] = time.time()
        recorder.pending.append(event)
        await recorder.close(status="failed", finished_at=time.time(), error=error)
