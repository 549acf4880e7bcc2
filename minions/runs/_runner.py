"""What a worker does with one delivery of a run: claim it under a new epoch, rebuild its recipe
from the snapshot, run it with the store as its step (and loop item) checkpoints, write its
events under the lease (one commit per finished step, and a short interval's worth of events at
a time while a step runs), and end it. A holder that finds its lease gone (declared dead, the
run cancelled from outside, a second worker with its id) stands down without writing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import structlog

from minions._agent.executor import AgentExecutor
from minions._fold import TERMINAL_KINDS
from minions._item import ItemId
from minions._routing.selection import Routing
from minions._step.cache import Refreshing
from minions._step.execution import StepExecution, StepStatus
from minions._step.resume import WAITING, StepState
from minions._step.settings import RunSettings
from minions._text import jsonable
from minions.errors import MinionsError, RecipeError, UnknownRunError
from minions.events import (
    Event,
    EventEmitter,
    RerunPlanned,
    RunCompleted,
    RunDraining,
    RunFailed,
    RunHandedBack,
    RunResumed,
    RunStarted,
    StepReused,
    TokenDelta,
    UsageRecord,
)
from minions.models import MODEL_ENV, CapabilityMemory, Model, Recording, ReplayModel
from minions.recipes import AgentRecipe
from minions.recipes._internal import INLINE_SUFFIX, RecipeFolder, recording_beside
from minions.runs import _approvals as approvals
from minions.runs import _checkpoints as checkpoints
from minions.runs import _events as events
from minions.runs import _leases as leases
from minions.runs import _project_limits as project_limits
from minions.runs import _runs as runs
from minions.runs import _workers as workers
from minions.runs._approvals import ApprovalRecord, Deadlines, Resume
from minions.runs._async import AsyncDatabase
from minions.runs._cache import StoreStepCache
from minions.runs._checkpoints import Checkpoint
from minions.runs._decisions import TIMEOUT_ACTOR
from minions.runs._leases import Lease, LeaseLost, Refusal, Start
from minions.runs._limiter import StoreCapabilities, share_capabilities
from minions.runs._log import LiveHub
from minions.runs._project_limits import Parked
from minions.runs._queue import workflow_id
from minions.runs._runs import RerunPlan
from minions.runs._snapshot import recipe_of
from minions.runs._streams import DeltaPublisher
from minions.runs._tables import HELD, TERMINAL
from minions.tools import ApprovalDecision, ApprovalRequest

if TYPE_CHECKING:
    from minions.models import ProjectLimit
    from minions.runs._queue import Queue  # imports DBOS: only a worker's process needs it

__all__: list[str] = []

log = structlog.get_logger(__name__)

STATE_LIMIT = 1 << 20
"""Bytes (of its JSON) of the state a step that waits at a call keeps when its run parks, at
most: beyond it the state is not kept, and the step starts again from its start when the run
goes on (its `step_started` event says why)."""

MARGIN = 2.0
"""Seconds before a lease's end at which its holder no longer counts on it (clocks of other
hosts, the time a tool call takes to start); a quarter of the lease when that is shorter."""


class RunRecorder:
    """A run's event listener and checkpoints, written under its holder's lease. Its run
    parks while a call waits for a decision (`parks`), and its steps that waited at a call
    then go on there (`resume_at`).

    Events come numbered by the run's `EventEmitter` (which goes on after the stored ones);
    they stay pending until a commit stores them, so a failed commit (a database restarting, a
    full disk) is tried again with the same numbers: the log never has a gap. Token deltas go
    to the live hub and to the followers of other processes (`deltas`) only.
    """

    parks = True

    def __init__(
        self,
        database: AsyncDatabase,
        lease: Lease,
        *,
        last: int,
        hub: LiveHub | None = None,
        deltas: DeltaPublisher | None = None,
        interval: float = 0.05,
        on_lost: Callable[[], None] = lambda: None,
        term: float = 10.0,
        valid_until: float = 0.0,
    ) -> None:
        self.database = database
        self.lease = lease
        self.term = term
        """Seconds a lease lasts when renewed."""
        self.valid_until = valid_until
        """Until when (`time.monotonic`) the lease surely holds: a renewal it knows of (the
        claim, the worker's heartbeat) plus its term, less a margin. Past it, the holder asks
        the store before a tool call starts."""
        self.hub = hub
        self.deltas = deltas
        self.interval = interval
        self.on_lost = on_lost
        self.stored = last
        """The number of the last event stored."""
        self.resumed = last > 0
        """The run goes on from stored work (it started before this delivery)."""
        self.attempt: int | None = lease.attempt
        """The run's attempt this execution is."""
        self.lost = False
        """The lease is gone: nothing more is written."""
        self.pending: list[Event] = []
        self.saved: dict[tuple[str, int], Checkpoint] | None = None if self.resumed else {}
        """The run's finished steps and items, read once when it goes on from stored work."""
        self.rerun: RerunPlan | None = None
        """A rerun's plan: the steps it reuses of its parent."""
        self.announced: set[tuple[str, int]] | None = None
        """The reused steps (and items) whose `StepReused` was said (a rerun's only)."""
        self.emitter: EventEmitter | None = None
        """The run's events (a rerun's recorder says its plan and reused steps)."""
        self.actor: str | None = None
        """Who queued this attempt: its `RunStarted` event says so."""
        self.working: dict[tuple[str, int], None] = {}
        """The steps and loop items (and visits) that run now: started, not yet ended."""
        self.loops: set[tuple[str, int]] = set()
        """The loop steps (and visits) whose items started."""
        self.idle = asyncio.Event()
        """Set while no step or loop item runs (a loop step only waits for its items)."""
        self.idle.set()
        self.holding = False
        """The worker drains: no step that has not started starts (it waits at `restore`
        until the run is handed back)."""
        self.sealed = False
        """The run is being handed back: nothing more is said or checkpointed."""
        self._hold = asyncio.Event()
        """Never set: what a step that may not start waits on (its task is cancelled)."""
        self.deadlines: Deadlines | None = None
        """How long its calls wait for a decision (its recipe's ``approval:``)."""
        self.parked = False
        """The run was given back to the store while a call waits for a decision."""
        self.resumes: dict[str, Mapping[str, Any] | str] = {}
        """What the steps that waited at a call when the run parked kept, by step execution
        (`resume_at`): the data of their state, or why they start again."""
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if self.lost or self.sealed:
            return
        if event.kind in ("step_completed", "step_failed") and self.working:
            # A step that completed is checkpointed with this event, in the commit that
            # stores it (one a drain waits for before it hands the run back).
            self._ended(event.step_id or "", getattr(event, "visit", 1))
        if isinstance(event, RunStarted) and self.actor is not None:
            event = dataclasses.replace(event, actor=self.actor)
        if self.hub is not None:
            self.hub.publish(event)
        if isinstance(event, TokenDelta):
            if self.deltas is not None:
                self.deltas.publish(event)
            return
        self.pending.append(event)
        if event.kind in TERMINAL_KINDS:
            return  # stored only with the run's end (`close`), in one commit
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._flush_soon)

    def _flush_soon(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self._flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self) -> None:
        try:
            await self._write()
        except LeaseLost:
            pass  # said by _write: the run's task is being cancelled

    async def _write(
        self,
        *,
        checkpoint: Checkpoint | None = None,
        run: dict[str, Any] | None = None,
        announce: Callable[[], None] | None = None,
    ) -> None:
        """Store what is pending (and a finished step's checkpoint, and the run's values) in
        one commit.
        `announce` emits the finished step's `StepCompleted` first, so that the event is
        stored with its checkpoint.

        Raises:
            LeaseLost: the run is no longer this holder's (it stands down).
        """
        async with self._lock:
            if self.lost:
                raise LeaseLost(self.lease.run_id)
            if announce is not None:
                announce()
            written = list(self.pending)
            if run is None:
                # A terminal event is written only together with the run's end: a holder that
                # dies between the two would leave a log that ends while the run goes on.
                ends = [i for i, e in enumerate(written) if e.kind in TERMINAL_KINDS]
                written = written[: ends[0]] if ends else written
            if not written and checkpoint is None and run is None:
                return
            notes: list[str] = []
            if self.deltas is not None and written:
                # The run's deltas before these events go first (on Postgres, notified in
                # this commit): a follower of any process reads them in their place.
                notes = await self.deltas.before_commit(self.lease.run_id)
            append = asyncio.ensure_future(
                self.database.apply(
                    leases.append,
                    self.lease,
                    after=self.stored,
                    events=[events.row_of(e) for e in written],
                    checkpoint=checkpoint,
                    run=run,
                    deltas=notes,
                )
            )
            try:
                # A cancel (of the run) does not cut the commit short: it goes on in its
                # thread, and what is pending and the log's head must say whether it went
                # through before the next write (the run's close) is made.
                await asyncio.shield(append)
            except asyncio.CancelledError:
                await asyncio.wait({append})
                failed = None if append.cancelled() else append.exception()
                if failed is None and not append.cancelled():
                    self._stored(written)
                elif isinstance(failed, LeaseLost):
                    self._lose()
                raise
            except LeaseLost:
                self._lose()
                raise
            self._stored(written)

    def _stored(self, written: list[Event]) -> None:
        del self.pending[: len(written)]
        if written:
            self.stored = written[-1].seq

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            self.pending.clear()
            log.warning("run taken over elsewhere; standing down", run_id=self.lease.run_id)
            self.on_lost()

    async def park(
        self, call_id: str, state: StepState | str | None = None
    ) -> ApprovalRecord | None:
        """Store what is pending, then give the run back to the store while call `call_id`
        waits for a decision (`leases.park`), with what its step keeps to go on at the call
        (`state`; a reason why it cannot instead; None: nothing to keep): nothing more is
        written under this lease, and the run's task is cancelled (work in flight beside
        the call, in another branch, runs again from its step's start when the run goes
        on). The decision instead, when one came first.

        Raises:
            LeaseLost: the run is no longer this holder's.
        """
        await self._write()
        async with self._lock:
            if self.lost:
                raise LeaseLost(self.lease.run_id)
            resume = None if state is None else self._kept(call_id, state)
            decided = await self.database.apply(
                leases.park, self.lease, call_id=call_id, resume=resume
            )
            if decided is not None:
                return decided
            self.parked = self.lost = True
            self.pending.clear()
            if self.emitter is not None:
                # Its steps are cut short to give the place back: they did not fail, and
                # the run's log says nothing of them; neither does the worker's.
                self.emitter.silence("parked")
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self.on_lost()
        return None

    def _kept(self, call_id: str, state: StepState | str) -> str:
        """What the run keeps at call `call_id` as it parks (`Resume.text`): the step's
        `state` as data, or why it starts again (`state` is a reason, or is over
        `STATE_LIMIT`)."""
        run_id = self.lease.run_id
        if isinstance(state, str):
            scope = call_id.rpartition("/")[0]
            log.info("a parked run's step starts again", run_id=run_id, call_id=call_id, why=state)
            return Resume(scope=scope, seq=self.stored, restarted=state).text()
        text = Resume(scope=state.scope, seq=self.stored, state=state.to_data()).text()
        size = len(text.encode())
        if size <= STATE_LIMIT:
            return text
        why = (
            f"its state at call {call_id!r} is {size:,} bytes, over the {STATE_LIMIT:,} a "
            "parked run keeps"
        )
        log.warning(
            "a parked run's step will start again: its state is too big to keep",
            run_id=run_id,
            call_id=call_id,
            bytes=size,
            limit=STATE_LIMIT,
        )
        return Resume(scope=state.scope, seq=self.stored, restarted=why).text()

    def resume_at(self, scope: str) -> Mapping[str, Any] | str | None:
        return self.resumes.pop(scope, None) if self.resumes else None

    async def close(self, *, actor: str | None = None, **run: Any) -> bool:
        """Store what is pending with the run's final values, and the run's terminal event
        when it ends and none was said (so every ended run's log ends with one; `actor`: who
        ended it, a person who cancelled it). False when the lease was lost (nothing was
        written)."""
        status = run.get("status")
        if actor is not None:  # the run's own terminal event says who ended it
            self.pending = [
                dataclasses.replace(e, actor=actor) if isinstance(e, RunFailed) else e
                for e in self.pending
            ]
        if status in TERMINAL and not any(e.kind in TERMINAL_KINDS for e in self.pending):
            run_id, seq = self.lease.run_id, self.stored + len(self.pending) + 1
            now = time.time()
            self.pending.append(
                RunCompleted(run_id=run_id, seq=seq, timestamp=now, output=run.get("output"))
                if status == "completed"
                else RunFailed(
                    run_id=run_id,
                    seq=seq,
                    timestamp=now,
                    error=run.get("error") or str(status),
                    actor=actor,
                )
            )
        return await self.flush(run=run)

    # -- draining ----------------------------------------------------------------------------

    def _started(self, key: tuple[str, int]) -> None:
        self.working[key] = None
        self.idle.clear()

    def _ended(self, step_id: str, visit: int) -> None:
        self.working.pop((step_id, visit), None)
        if all(key in self.loops for key in self.working):
            self.idle.set()  # nothing runs but loop steps waiting for items that may not start

    def hold(self, *, executor_id: str, grace: float) -> None:
        """The worker drains: no step starts from now on; say so in the run's log."""
        if self.holding:
            return
        self.holding = True
        if self.emitter is not None and not (self.lost or self.sealed):
            self.emitter.emit(
                RunDraining(executor_id=executor_id, grace=grace, in_flight=self._names())
            )

    def seal(self) -> tuple[str, ...]:
        """Say and checkpoint nothing more (the run is handed back); the steps cut short."""
        self.sealed = True
        if self.emitter is not None:
            self.emitter.silence("handed_back")
        return self._names()

    def _names(self) -> tuple[str, ...]:
        """The steps and loop items in flight (not the loop steps waiting for items)."""
        return tuple(
            step if visit == 1 else f"{step}#{visit}"
            for step, visit in self.working
            if (step, visit) not in self.loops
        )

    async def flush(self, *, run: dict[str, Any] | None = None) -> bool:
        """Store what is pending (and the run's final values, `run`; without them, its
        last events before it is handed back). False when the lease was lost (nothing was
        written)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._flushes):
            await asyncio.gather(task, return_exceptions=True)
        try:
            await self._write(run=run)
        except LeaseLost:
            return False
        return True

    # -- checkpoints -------------------------------------------------------------------------

    async def before_call(self) -> None:
        if self.lost or self.sealed:
            raise asyncio.CancelledError()
        if time.monotonic() < self.valid_until:
            return  # renewed lately: no look at the store
        # No renewal known for a lease's term (the process was frozen, or its store away):
        # another worker may have taken the run over, so the call starts only once the lease
        # is renewed under this holder's epoch.
        started = time.monotonic()
        try:
            await self.database.apply(leases.renew, self.lease, lease_until=time.time() + self.term)
        except LeaseLost:
            self._lose()
            raise asyncio.CancelledError() from None
        self.renewed(started + self.term)

    def renewed(self, until: float) -> None:
        """The lease was renewed (its term counted from `until` less the term): it surely
        holds until a margin before `until`."""
        self.valid_until = max(self.valid_until, until - min(MARGIN, self.term / 4))

    async def _saved(self, name: str, visit: int) -> Checkpoint | None:
        if self.saved is None:
            self.saved = await self.database.apply(checkpoints.saved, self.lease.run_id)
        checkpoint = self.saved.get((name, visit))
        if checkpoint is not None:
            self._announce(checkpoint)
        return checkpoint

    async def restore(
        self, step_id: str, visit: int
    ) -> tuple[StepExecution, Routing | None] | None:
        checkpoint = await self._saved(step_id, visit)
        if checkpoint is not None:
            return checkpoint.execution, checkpoint.routing
        if self.holding or self.sealed:
            # The worker drains: the step starts in the worker the run is handed to.
            await self._hold.wait()
        self._started((step_id, visit))
        return None

    async def restore_item(self, name: str, visit: int) -> StepExecution | None:
        checkpoint = await self._saved(name, visit)
        if checkpoint is not None:
            return checkpoint.execution
        if self.holding or self.sealed:
            await self._hold.wait()  # the worker drains: the item starts elsewhere
        # Its loop step waits for its items: it is not work in flight of its own.
        self.loops.add((ItemId.parse(name).step, visit))
        self._started((name, visit))
        return None

    # -- a rerun's reused steps --------------------------------------------------------------

    def on_start(self, event: Event) -> None:
        """After `RunStarted` of a rerun: say its plan (numbered right after it)."""
        plan = self.rerun
        if plan is None or self.emitter is None or event.kind != "run_started":
            return
        self.emitter.emit(
            RerunPlanned(
                parent_run_id=plan.parent_run_id,
                from_step=plan.from_step,
                reused=plan.reused,
                rerun=plan.rerun,
                changed=dict(plan.changed),
                outputs_set=tuple(plan.outputs),
            )
        )

    def _announce(self, checkpoint: Checkpoint) -> None:
        """Say `StepReused` for a step (or loop item) the rerun took from its parent (its
        checkpoint was copied when the rerun was queued), once: a rerun that goes on after a
        crash knows the ones it said from its stored events."""
        reuse = checkpoint.reuse
        if reuse is None or self.emitter is None or self.announced is None:
            return
        key = (checkpoint.name, checkpoint.visit)
        if key in self.announced:
            return
        self.announced.add(key)
        self.emitter.emit(
            StepReused(
                step_id=checkpoint.name,
                visit=checkpoint.visit,
                source_run_id=reuse.run_id,
                output=checkpoint.output,
                edited=reuse.edited,
                usage=UsageRecord(**reuse.usage),
            )
        )

    async def save(
        self, execution: StepExecution, routing: Routing | None, announce: Callable[[], None]
    ) -> None:
        await self._checkpoint(
            Checkpoint.of(execution, routing=routing, saved_at=time.time()), announce
        )

    async def save_item(
        self, execution: StepExecution, item: int, announce: Callable[[], None]
    ) -> None:
        await self._checkpoint(Checkpoint.of(execution, item=item, saved_at=time.time()), announce)

    async def _checkpoint(self, checkpoint: Checkpoint, announce: Callable[[], None]) -> None:
        if self.sealed:
            raise asyncio.CancelledError()  # cut short: it runs again where the run goes on
        try:
            await self._write(checkpoint=checkpoint, announce=announce)
        except LeaseLost:
            # The run's task is being cancelled (see _lose): this step goes no further.
            raise asyncio.CancelledError() from None


async def _cancelled() -> NoReturn:
    """Wait until the task is cancelled (nothing else ends it)."""
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable: nothing sets the future")


def replay_beside(
    recipe: AgentRecipe, recipe_path: str | None, settings: RunSettings
) -> ReplayModel | None:
    """The model answering a run from the recording beside its recipe file, when nothing
    configures a model (neither the worker's settings, nor `MINIONS_MODEL`, nor the recipe)
    and there is one: what `minions run` does, so a quickstart works offline in a worker too.
    A fresh model per run (a replay counts the calls of each step).

    Raises:
        RecordingError: the recording beside the recipe cannot be read.
    """
    if settings.model is not None or recipe.model is not None or recipe_path is None:
        return None
    if os.environ.get(MODEL_ENV):
        return None
    beside = recording_beside(recipe_path)
    if not beside.is_file():
        return None
    return ReplayModel(Recording.load(beside), name="replay")


class SharedModels:
    """A model resolver whose models serve every run of a worker: one model per model string
    (and one for the default, ``None``), so what a model learned about its endpoint (the
    structured-output ladder's `CapabilityMemory`: a server that ignores tools, refuses
    ``json_schema``...) and its HTTP connections serve every later run, instead of each run
    paying the discovery again with real model calls. A `Model` object is used as it is.

    Args:
        resolver: what makes a model of a string the first time (``None``: `infer_model`).
        capabilities: the memory the models it makes learn into (the store's, shared by
            every worker: `StoreCapabilities`); ``None``: each model its own.
    """

    def __init__(
        self,
        resolver: Callable[[Model | str | None], Model] | None = None,
        *,
        capabilities: CapabilityMemory | None = None,
    ) -> None:
        self.resolver = resolver
        self.capabilities = capabilities
        self._models: dict[str | None, Model] = {}

    def __call__(self, spec: Model | str | None) -> Model:
        if isinstance(spec, Model):
            return spec
        found = self._models.get(spec)
        if found is None:
            if self.resolver is not None:
                found = self.resolver(spec)
            else:
                from minions._step.context import resolve_model

                found = resolve_model(spec)
            if self.capabilities is not None:
                share_capabilities(found, self.capabilities)
            found = self._models.setdefault(spec, found)
        return found


def deadlines_of(recipe: AgentRecipe) -> Deadlines | None:
    """How long the calls of a run of `recipe` wait for a decision: its ``approval:`` (a
    recipe loaded from YAML; None: as long as it takes)."""
    from minions._duration import duration_seconds

    source = getattr(recipe, "source", None)
    spec = None if source is None else source.spec.approval
    if spec is None:
        return None
    return Deadlines(
        timeout=None if spec.timeout is None else duration_seconds(spec.timeout),
        on_timeout=spec.on_timeout or "reject",
        escalate_after=(
            None if spec.escalate_after is None else duration_seconds(spec.escalate_after)
        ),
    )


class RunEndedError(MinionsError):
    """A delivery of a run that ended (DBOS records the workflow as failed, with why)."""


class RecipeNotFoundError(MinionsError):
    """The worker's recipes root has no recipe with a run's id."""


class RunFailedError(MinionsError):
    """The run failed (DBOS records the workflow as failed); the message names the run and
    the cause."""

    def __init__(self, run_id: str, cause: str) -> None:
        super().__init__(f"run {run_id} failed: {cause}")


class RunExecutor:
    """A worker's executor of runs: each delivery its queue hands it (one attempt of a run,
    a DBOS workflow, `execute`) claimed, its recipe run under the lease, ended or handed
    back.

    Args:
        database: the worker's (patient) store's database.
        executor_id: the worker's id.
        incarnation: this process's incarnation of the worker: the holder of its runs.
        settings: what its runs share (model, resolver, wrapper, tracer, MCP servers...); the
            runner approves their calls itself, durably, and its runs share their models
            (`SharedModels`).
        hub: where the events of its runs go live (token deltas included).
        deltas: where their token deltas go for the followers of other processes.
        cancel_poll: seconds between looks at a running run's row (a cancel, a lost lease).
        lease: seconds a lease lasts without a heartbeat (the worker renews it).
        heartbeat: seconds between the worker's heartbeats.
        capabilities: what endpoints taught the structured-output ladder, kept in the store
            (loaded again as each run starts).
        concurrency: runs at a time, at most, whatever the queue hands over (DBOS hands each
            worker of a store as many as the last worker started asked for); the others
            wait, unclaimed. None: no limit of the runner's own.
        queue: the worker's queue: with it, a run handed over while no place is free is
            handed back (queued as its next attempt) as soon as another live worker has a
            place, and its delivery only keeps its place in DBOS's count until a place frees
            here (or the queue would hand it to this worker again).
        hand_back_after: seconds between a waiting run's looks for a place elsewhere.
        deps: makes the deps of each run it starts or resumes (never stored).
        recipes: the recipes root: a run's recipe file is the one with its recipe's id
            there (its snapshot is what runs; the file's folder is where its tools modules,
            included recipes and recording are found). None: where it was submitted from.
        project_recipes: the recipes roots of projects that have their own (a run of one
            of them is found there, not under `recipes`).
        project_limits: the limits per project its runs are held to, with the other
            workers' (a run of a project at its limits is parked, holding no place).
    """

    def __init__(
        self,
        database: AsyncDatabase,
        *,
        executor_id: str,
        incarnation: str,
        settings: RunSettings | None = None,
        hub: LiveHub | None = None,
        deltas: DeltaPublisher | None = None,
        cancel_poll: float = 0.2,
        lease: float = 10.0,
        heartbeat: float = 2.0,
        capabilities: StoreCapabilities | None = None,
        concurrency: int | None = None,
        queue: Queue | None = None,
        hand_back_after: float = 1.0,
        deps: Callable[[], object] | None = None,
        recipes: RecipeFolder | None = None,
        project_recipes: Mapping[str, RecipeFolder] | None = None,
        project_limits: Sequence[ProjectLimit] = (),
    ) -> None:
        self.database = database
        self.project_recipes = dict(project_recipes or {})
        self.project_limits = {limit.name: limit for limit in project_limits}
        self.deps = deps
        self.recipes = recipes
        self.on_place_free: Callable[[str, int], None] = lambda run_id, attempt: None
        """Told when a run ends and its place is free (the worker looks at its queue)."""
        self.capabilities = capabilities
        self._places = concurrency
        self._slots = None if concurrency is None else asyncio.Semaphore(concurrency)
        self.queue = queue
        self.hand_back_after = hand_back_after
        self.executor_id = executor_id
        self.incarnation = incarnation
        self.hub = hub
        self.deltas = deltas
        self.cancel_poll = cancel_poll
        self.lease = lease
        self.heartbeat = heartbeat
        self.running: dict[str, asyncio.Task[Any]] = {}
        self.held: dict[str, int] = {}
        """The runs this runner claims or runs, with the attempt of each: the worker renews
        their leases."""
        self._recorders: dict[str, RunRecorder] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop its runs run on (DBOS's), once one was delivered."""
        self.draining = False
        """The worker stops: nothing more is claimed; what is held is handed back."""
        self._drained = asyncio.Event()
        """Set when the drain begins (what waits for a place hands its run back)."""
        self._hurried = asyncio.Event()
        """Set when the worker was asked to stop at once (the grace is cut short)."""
        self._deliveries = 0
        """Deliveries being run, waiting for a place, or handed back."""
        self._no_deliveries = asyncio.Event()
        self._no_deliveries.set()
        self.on_parked: Callable[[], None] = lambda: None
        """Told when a run was parked (the worker looks at the approvals' deadlines)."""
        settings = settings or RunSettings()
        self.executor = AgentExecutor(
            settings=dataclasses.replace(
                settings,
                approver=self.approve,
                model_resolver=SharedModels(
                    settings.model_resolver,
                    capabilities=None if capabilities is None else capabilities.memory,
                ),
                # Steps that say `cache` share their outputs with every worker of the store.
                step_cache=(
                    settings.step_cache
                    if settings.step_cache is not None
                    else StoreStepCache(database)
                ),
            )
        )
        """One for every run: it validates each recipe snapshot once."""

    async def execute(self, run_id: str, attempt: int) -> None:
        """Run the run's attempt if it is still its current one and nobody else holds it
        (once a place is free here, or handed back: see `queue`)."""
        self.loop = asyncio.get_running_loop()
        self._deliveries += 1
        self._no_deliveries.clear()
        try:
            await self._in_place(run_id, attempt)
        finally:
            self._deliveries -= 1
            if not self._deliveries:
                self._no_deliveries.set()
            self.on_place_free(run_id, attempt)

    async def _in_place(self, run_id: str, attempt: int) -> None:
        if self._slots is None:
            await self._execute(run_id, attempt)
            return
        slots = self._slots
        if not slots.locked() or self.queue is None:
            async with slots:  # a place free: taken at once, without a task
                await self._execute(run_id, attempt)
            return
        # The request for a place stays in line while the run is handed back: no race with
        # a place freed meanwhile, and the delivery keeps its turn.
        place = asyncio.ensure_future(slots.acquire())
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            outcome = "stay"
            while outcome == "stay" and not drained.done():
                done, _ = await asyncio.wait(
                    {place, drained},
                    timeout=self.hand_back_after,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if place in done:
                    break
                outcome = await self._hand_back(run_id, attempt, drain=drained.done())
            if drained.done() and not place.done():
                # The worker stops: nothing waits for a place (handed back, or left to the
                # takeover of a worker gone when the store failed).
                place.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await place
                if not place.cancelled():
                    slots.release()  # the place came as it was handed back
                return
            # Handed back to another worker: the delivery keeps its place in DBOS's count
            # until a place frees here (or the queue would hand it to this worker again).
            await place
        except BaseException:
            if not place.cancel() and not place.cancelled() and place.exception() is None:
                slots.release()  # the place came as this delivery was cancelled
            raise
        finally:
            drained.cancel()
        try:
            if outcome != "handed back":  # a stale delivery finds nothing to run
                await self._execute(run_id, attempt)
        finally:
            slots.release()

    async def _hand_back(
        self, run_id: str, attempt: int, *, drain: bool = False
    ) -> Literal["handed back", "stay", "stale"]:
        """Queue the run's next attempt if another worker has a place free (or this worker
        drains), and this attempt is still the run's current one and it is queued
        (compare-and-set: a cancel, or a takeover of this worker, wins). `stay`: no place
        elsewhere (or the store failed), look again later; `stale`: the run moved on, the
        delivery does nothing."""
        assert self.queue is not None
        executor_id = self.executor_id
        try:
            if not drain:
                assert self._places is not None
                room = await self.database.apply(
                    workers.room_elsewhere,
                    executor_id,
                    queue=self.queue.name,
                    places=self._places,
                    now=time.time(),
                )
                if not room:
                    return "stay"
            requeued = await self.database.apply(
                runs.requeue,
                run_id,
                statuses=("queued",),
                epoch=None,
                attempt=attempt,
                recovery=False,
                enqueue=self.queue.enqueue,
                event=lambda queued: RunHandedBack(
                    executor_id=executor_id, reason="drain" if drain else "busy", attempt=queued
                ),
            )
        except Exception as exc:  # not handed back: it runs here when a place frees
            log.warning("could not hand a waiting run back", run_id=run_id, error=str(exc))
            return "stay"
        if requeued is None:
            return "stale"
        log.info(
            "run handed back to the queue: the worker drains"
            if drain
            else "run handed back to the queue: no place here, one elsewhere",
            run_id=run_id,
            attempt=requeued.attempt,
            executor_id=self.executor_id,
        )
        return "handed back"

    async def _execute(self, run_id: str, attempt: int) -> None:
        while run_id in self.held:
            if self.held[run_id] >= attempt:
                return  # delivered again while this runner runs it (DBOS's recovery at a start)
            # An earlier attempt of it still runs here, fenced out by the takeover that queued
            # this one (its holder was cut off from the store past its lease): it stands down
            # at its next look at the store, and this attempt goes on from its checkpoints.
            await asyncio.sleep(self.cancel_poll)
        # Held from before the claim: the worker's heartbeat renews the lease from the moment
        # the claim commits, however long this event loop takes to come back to the run.
        self.held[run_id] = attempt
        try:
            await self._claimed(run_id, attempt)
        finally:
            if self.held.get(run_id) == attempt:
                del self.held[run_id]

    async def _claimed(self, run_id: str, attempt: int) -> None:
        if self.draining and self.queue is not None:
            await self._hand_back(run_id, attempt, drain=True)  # delivered as it stops
            return
        asked = time.monotonic()  # the lease runs at least from here
        start = await self._claim(run_id, attempt)
        if start == "ended":
            status = (await self.database.apply(runs.get, run_id, details=False)).status
            if status != "completed":
                # Its attempt delivered again after the run ended: an operator's `dbos workflow
                # resume` (or a worker that died after ending the run). Refused, saying how.
                raise RunEndedError(
                    f"run {run_id} is {status}: minions runs it again only when asked with "
                    f"`minions runs resume {run_id}` (DBOS's resume does not)"
                )
        if isinstance(start, Start):
            await self._run(start, claimed=asked)

    async def _run(self, start: Start, *, claimed: float) -> None:
        lease = start.lease
        run_id = lease.run_id
        task: asyncio.Task[Any] | None = None

        def lost() -> None:
            if task is not None:
                task.cancel()

        recorder = RunRecorder(
            self.database,
            lease,
            last=start.last_seq,
            hub=self.hub,
            deltas=self.deltas,
            on_lost=lost,
            term=self.lease,
        )
        recorder.renewed(claimed + self.lease)
        recorder.actor = start.record.queued_by
        if recorder.resumed and not await self.database.apply(events.started, run_id):
            # Its log holds only why it was queued again (handed back before it started):
            # it starts now, and says so.
            recorder.resumed, recorder.saved = False, {}
        if recorder.resumed:
            # A step that waited at a call when the run parked goes on there.
            for kept in await self.database.apply(approvals.kept, run_id):
                recorder.resumes[kept.scope] = (
                    kept.state if kept.state is not None else kept.restarted or ""
                )
        if start.rerun is not None:
            # Its reused steps' checkpoints were copied into it when it was queued.
            recorder.rerun, recorder.saved = start.rerun, None
            recorder.announced = (
                await self.database.apply(events.reuses_said, run_id) if recorder.resumed else set()
            )
        try:
            path = await self.database.call(self.recipe_file, start)
            # Built off the event loop (a tools module is imported): its other runs go on.
            recipe = await self.database.call(recipe_of, start.snapshot.yaml, path)
        except RecipeNotFoundError as exc:
            await self._fail(recorder, str(exc))
            raise RunFailedError(run_id, str(exc)) from None
        except RecipeError as exc:
            await self._fail(recorder, f"the recipe no longer loads: {exc}")
            raise RunFailedError(run_id, str(exc)) from None
        recorder.deadlines = deadlines_of(recipe)
        if self.capabilities is not None:
            # What every worker learned so far: the run starts at the modes that worked.
            await self.capabilities.refresh()
        executor = self.executor
        try:
            replay = replay_beside(recipe, path, executor.settings)
        except MinionsError as exc:
            await self._fail(recorder, str(exc))
            raise RunFailedError(run_id, str(exc)) from None
        if replay is not None:
            # Every model of the run answers from the recording, as in `minions run`.
            executor = AgentExecutor(
                settings=dataclasses.replace(
                    executor.settings, model=replay, model_resolver=lambda _spec: replay
                )
            )
        given = executor.settings.step_cache
        if start.rerun is not None and not start.rerun.cache and given is not None:
            # A rerun's steps run again: none answers from the step cache (each refreshes it).
            executor = AgentExecutor(
                settings=dataclasses.replace(executor.settings, step_cache=Refreshing(given))
            )
        graph = executor.graph(recipe)
        try:
            deps = None if self.deps is None else self.deps()
        except Exception as exc:
            cause = f"the worker's deps factory failed: {type(exc).__name__}: {exc}"
            await self._fail(recorder, cause)
            raise RunFailedError(run_id, cause) from None
        context = executor.create_context(
            recipe,
            start.snapshot.inputs,
            run_id=run_id,
            listeners=[recorder.on_event, recorder.on_start],
            deps=deps,
        )
        context.events.continue_after(start.last_seq)
        # Someone may be watching, from any process: every model that can stream does (the
        # answer recorded is the same; a model that cannot stream gives its answer as one
        # delta).
        context.streaming = True
        recorder.emitter = context.events
        if recorder.resumed and lease.attempt > 1 and start.record.queued_by is not None:
            # A person resumed it (a worker's takeover has no actor and says nothing; a
            # redelivery of this very attempt says it again).
            context.events.emit(RunResumed(attempt=lease.attempt, actor=start.record.queued_by))
        began = time.monotonic()
        if self.draining:  # claimed as the worker began to stop: it starts elsewhere
            await self._give_back(recorder)
            return
        task = asyncio.create_task(
            executor.run(graph, context, checkpoints=recorder),
            # Its recipe steps' inner runs fall silent with it (a park, a hand-back).
            context=context.events.context_for_inner_runs(),
        )
        self.running[run_id] = task
        self._recorders[run_id] = recorder
        cancelled: list[bool] = []
        watcher = asyncio.create_task(self._watch(lease, task, recorder, cancelled))
        try:
            result = await task
        except asyncio.CancelledError:
            if recorder.lost:
                return  # stood down: the run is someone else's now
            if recorder.sealed:
                # The worker drains: the run goes on in another worker from its checkpoints.
                await self._give_back(recorder)
                return
            if not cancelled:
                raise  # the worker is stopping: the run is taken over from its checkpoint
            asked = await self.database.apply(runs.get, run_id, details=False)
            metrics = executor.settings.metrics
            if metrics is not None:
                metrics.run_ended(
                    recipe.id,
                    "cancelled",
                    duration=time.monotonic() - began,
                    waited=context.waits.seconds,
                )
            await recorder.close(
                actor=asked.cancelled_by,
                status="cancelled",
                finished_at=time.time(),
                error="cancelled on request",
                usage=dataclasses.asdict(context.usage),
            )
            return
        except Exception as exc:  # a bug must end the run, not leave it running
            log.exception("run crashed", run_id=run_id)
            await self._fail(recorder, f"the run crashed: {type(exc).__name__}: {exc}")
            raise RunFailedError(run_id, str(exc)) from None
        finally:
            watcher.cancel()
            self.running.pop(run_id, None)
            self._recorders.pop(run_id, None)
        ok = result.status is StepStatus.COMPLETED
        closed = await recorder.close(
            status="completed" if ok else "failed",
            finished_at=time.time(),
            output=jsonable(result.output),
            error=result.error,
            usage=dataclasses.asdict(result.usage),
        )
        if closed and not ok:
            raise RunFailedError(run_id, result.error or "the run failed")

    # -- draining ----------------------------------------------------------------------------

    async def drain(self, grace: float) -> None:
        """Stop (the worker does): claim nothing more, hand back at once the runs that wait
        for a place, let the steps in flight finish within `grace` seconds (no new step
        starts), then hand back every run that has not ended, durably: each is queued again
        in its place, and goes on in another worker from its checkpoints."""
        self.draining = True
        self._drained.set()
        for recorder in list(self._recorders.values()):
            recorder.hold(executor_id=self.executor_id, grace=grace)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            while not hurried.done() and loop.time() < deadline:
                # A run waiting for a person is parked (given back), not work in flight.
                busy = [
                    r
                    for run_id, r in self._recorders.items()
                    if run_id in self.running and not r.idle.is_set()
                ]
                if not busy:
                    break
                waits = {asyncio.ensure_future(r.idle.wait()) for r in busy}
                try:
                    await asyncio.wait(
                        {*waits, hurried},
                        # Looked at again now and then: a run may begin to wait meanwhile.
                        timeout=min(deadline - loop.time(), 0.5),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    for wait in waits:
                        wait.cancel()
            for run_id, recorder in list(self._recorders.items()):
                task = self.running.get(run_id)
                if task is not None and not task.done() and not recorder.lost:
                    recorder.seal()
                    task.cancel()
            await self._no_deliveries.wait()  # each run handed back (or ended meanwhile)
        finally:
            hurried.cancel()

    def hurry(self) -> None:
        """Cut the drain's grace short (a second SIGTERM or Ctrl-C); thread-safe."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._hurried.set)

    async def _give_back(self, recorder: RunRecorder) -> None:
        """Hand a run this worker holds back to the queue (the worker drains): its pending
        events stored, then its next attempt queued in its place with `RunHandedBack`
        (compare-and-set on its epoch). Without a queue, its lease is let go (a live worker
        takes it over). A lease lost meanwhile: the run is someone else's already."""
        cut = recorder.seal()
        lease = recorder.lease
        if not await recorder.flush():
            return
        if self.queue is None:
            await self.database.apply(leases.release, self.incarnation, [lease.run_id])
            return
        executor_id = self.executor_id
        requeued = await self.database.apply(
            runs.requeue,
            lease.run_id,
            statuses=HELD,
            epoch=lease.epoch,
            recovery=False,
            enqueue=self.queue.enqueue,
            event=lambda queued: RunHandedBack(
                executor_id=executor_id, reason="drain", attempt=queued, cut_short=cut
            ),
        )
        if requeued is not None:
            log.info(
                "run handed back to the queue: the worker drains",
                run_id=lease.run_id,
                attempt=requeued.attempt,
                cut_short=list(cut),
                executor_id=executor_id,
            )

    def recipe_file(self, start: Start) -> str | None:
        """Where the run's recipe file is taken to be (its tools modules, included recipes and
        recording are found beside it): under the recipes root, the file with the recipe's id
        (an inline recipe: ``<root>/<id>.inline.yaml``); without a root, where it was when it
        was submitted.

        Raises:
            RecipeNotFoundError: no recipe of the root has the run's id.
        """
        folder = self.project_recipes.get(start.record.project, self.recipes)
        if folder is None:
            return start.snapshot.path
        recipe_id = start.snapshot.recipe_id
        inline = f"{recipe_id}{INLINE_SUFFIX}"
        if start.snapshot.path is not None and Path(start.snapshot.path).name == inline:
            return str(folder.folder / inline)
        found = folder.find(recipe_id)
        if found is None:
            raise RecipeNotFoundError(
                f"no recipe with id {recipe_id!r} under the worker's recipes root "
                f"{str(folder.folder)!r} (--recipes / MINIONS_RECIPES): put the recipe's "
                "folder there, or point the worker at the folder that has it"
            )
        return str(found)

    def renewed(self, runs: set[str], until: float) -> None:
        """The worker's heartbeat renewed the leases of `runs` (their term counted from
        `until` less the term, `time.monotonic`)."""
        for run_id in runs:
            recorder = self._recorders.get(run_id)
            if recorder is not None:
                recorder.renewed(until)

    async def _claim(self, run_id: str, attempt: int) -> Start | Refusal | Parked:
        """Take the run, waiting while another holder's lease is alive (the incarnation of
        this worker that crashed, whose lease has not run out yet). A refusal when there is
        nothing to run: the attempt is stale, the run ended, or its holder lives on; or
        ``parked``: its project is at its limits."""
        deadline = time.monotonic() + self.lease + 2 * self.heartbeat
        limit = None
        if self.project_limits:
            try:
                project = await self.database.apply(runs.project_of, run_id)
            except UnknownRunError:  # pruned since it was queued: the claim refuses it
                project = ""
            limit = self.project_limits.get(project)
        while True:
            now = time.time()
            claiming: dict[str, Any] = {
                "attempt": attempt,
                "holder": self.incarnation,
                "executor_id": self.executor_id,
                "lease_until": now + self.lease,
                "now": now,
            }
            outcome: Start | Refusal | Parked
            if limit is not None:
                outcome = await self.database.apply(project_limits.claim, run_id, limit, **claiming)
            else:
                outcome = await self.database.apply(leases.claim, run_id, **claiming)
            if isinstance(outcome, Start) or outcome != "held" or time.monotonic() > deadline:
                return outcome
            await asyncio.sleep(self.heartbeat)

    async def _watch(
        self, lease: Lease, task: asyncio.Task[Any], recorder: RunRecorder, cancelled: list[bool]
    ) -> None:
        """Cancel the run's task when a cancel is asked (here, or by an operator through
        DBOS), or when the lease is gone."""
        workflow = workflow_id(lease.run_id, lease.attempt)
        while not task.done():
            await asyncio.sleep(self.cancel_poll)
            watched = await self.database.apply(leases.watch, lease.run_id, workflow)
            if watched.epoch != lease.epoch:
                recorder._lose()
                return
            if watched.cancel_requested or watched.workflow_status == "CANCELLED":
                cancelled.append(True)
                task.cancel()
                return

    async def _fail(self, recorder: RunRecorder, error: str) -> None:
        """End the run as failed with `error`, before or after its steps."""
        await recorder.close(status="failed", finished_at=time.time(), error=error)

    async def approve(self, request: ApprovalRequest) -> ApprovalDecision:
        """Ask durably for a person's decision: the request is stored (once: a step run
        again finds the same request, or its decision) and, undecided, the run is parked:
        it stays `waiting` in the store, held by nobody, and its execution ends here,
        giving its worker place back. The decision (or the recipe's approval timeout)
        queues it again; it goes on from its checkpoints, and this call finds its decision."""
        # A recipe step's inner run is named after its run ("RUN.step"): its calls wait in
        # the run that holds it.
        recorder = self._recorders[request.run_id.partition(".")[0]]
        try:
            return await self._decision(request, recorder)
        except LeaseLost:
            recorder._lose()  # the run's task is being cancelled: this call goes no further
            raise asyncio.CancelledError() from None

    async def _decision(self, request: ApprovalRequest, recorder: RunRecorder) -> ApprovalDecision:
        lease, database = recorder.lease, self.database
        record = await database.apply(
            leases.request_approval,
            lease,
            call_id=request.call_id,
            step_id=request.step_id,
            tool=request.tool,
            arguments=request.arguments,
            deadlines=recorder.deadlines,
        )
        if record.decided_at is None:
            # What its step keeps to go on at the call, once the other calls of its turn
            # that run are done (a step of its own that may wait set it: `ParkingToolCalls`).
            capture = WAITING.get()
            state = None if capture is None else await capture()
            decided = await recorder.park(request.call_id, state)
            if decided is None:
                log.info(
                    "run parked: it waits for a decision without a worker",
                    run_id=lease.run_id,
                    step_id=request.step_id,
                    tool=request.tool,
                    call_id=request.call_id,
                )
                self.on_parked()
                # The run's task is being cancelled (see `park`): this call waits for that,
                # so that nothing starts in its place meanwhile (a loop's next item would,
                # and ask its model for nothing).
                await _cancelled()
            record = decided
        return ApprovalDecision(
            approved=bool(record.approved),
            reason=record.reason,
            decided_by=record.decided_by,
            timed_out=record.decided_by == TIMEOUT_ACTOR,
        )
