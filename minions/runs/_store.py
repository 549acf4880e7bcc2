"""`RunStore`: the runs of one database, as async operations. Every state change a client
makes goes through here (the CLI's, evals', and the REST service's as a caller's projects see
the store, `minions.runs._projects.ScopedRuns`), each a compare-and-set on the run (one of
concurrent callers wins; the others get `RunStateError` with the state they found).

`RunStore` is a face, and says what went wrong in the caller's terms. What it reaches, and
how (``apply`` and ``call`` go to a thread of its database adapter, `minions.runs._async`):

- the tables one way: the rooms that own them, and the reads over them (`_fleet`, `_usage`,
  `_steps`), ``await self._database.apply(room.function, ...)``;
- DBOS's queue (`minions.runs._queue.Queue`) through two methods, each
  ``await self._database.call(...)``: `_dbos` makes its client before a transaction that
  enqueues (a room's function is given `Queue.enqueue` and calls it in that transaction),
  `_forget` takes a cancelled run's attempt out of it;
- recipe files (resolving, reading, parsing, building): ``await self._database.call(fn,
  ...)``;
- a run's events as they come: `follow` reads `self.log` (`minions.runs._log.EventLog`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import structlog

from minions._fold import RunStates
from minions._text import jsonable
from minions.errors import RunStateError, StoreError
from minions.events import Event
from minions.runs import _approvals as approvals
from minions.runs import _audit, _evals
from minions.runs import _decisions as decisions
from minions.runs import _events as events
from minions.runs import _runs as runs
from minions.runs._async import AsyncDatabase
from minions.runs._audit import Actor, AuditEntry
from minions.runs._db import DEFAULT_URL, Database
from minions.runs._log import EventLog, LiveHub
from minions.runs._projects import Scope, ScopedRuns, check_project
from minions.runs._queue import Queue, workflow_id
from minions.runs._runs import RunFilter, RunRecord
from minions.runs._snapshot import RecipeNode, RecipeSnapshot
from minions.runs._steps import StepDetail, step_detail
from minions.runs._tables import STATUSES, TERMINAL
from minions.runs._wake import wake

if TYPE_CHECKING:
    from minions._step.cache import StepCache
    from minions.recipes import AgentRecipe, Located, RecipeSpec
    from minions.recipes._internal import CatchUp, Overlap
    from minions.runs._cache import CacheEntry
    from minions.runs._checkpoints import Checkpoint
    from minions.runs._diff import RunDiff
    from minions.runs._endpoints import EndpointPause, EndpointRecord
    from minions.runs._evals import EvalRecord, OpenedEval
    from minions.runs._fleet import EndpointStatus, FleetState, QueueState
    from minions.runs._keys import KeyRecord, NewKey
    from minions.runs._notify import Delivery
    from minions.runs._prune import History, PruneResult
    from minions.runs._runs import RerunPlan, Submitted
    from minions.runs._schedules import ScheduleRecord
    from minions.runs._usage import UsageReport
    from minions.runs._workers import WorkerRecord

__all__ = ["RunFilters", "RunStore", "database_url"]

log = structlog.get_logger(__name__)

Who = str | Actor | None
"""Who makes a change: a name (`Actor.name`), or an `Actor` saying from where too."""


def _endpoint(base_url: str, model: str | None) -> str:
    """An endpoint as the audit log names it: its base URL, ``#MODEL`` for one model."""
    return base_url if model is None else f"{base_url}#{model}"


def database_url(given: str | None = None) -> str:
    """`given`, else ``MINIONS_DATABASE_URL``, else ``sqlite:///./.minions/minions.db``."""
    return given or os.environ.get("MINIONS_DATABASE_URL") or DEFAULT_URL


class RunFilters(TypedDict, total=False):
    """The filters of `RunStore.list_runs` and `RunStore.count_runs`."""

    status: str | None
    recipe: str | None
    created_after: float | None
    created_before: float | None
    id_prefix: str | None
    schedule: str | None
    project: str | None
    projects: Sequence[str] | None


def _filter(which: RunFilters) -> RunFilter:
    status = which.get("status")
    if status is not None and status not in STATUSES:
        raise ValueError(f"unknown status {status!r}; one of: {', '.join(STATUSES)}")
    given: dict[str, Any] = dict(which)
    project, projects = given.pop("project", None), given.pop("projects", None)
    if projects is not None:
        projects = tuple(projects)
        if project is not None:
            projects = tuple(p for p in projects if p == project)
    elif project is not None:
        projects = (project,)
    return RunFilter(**given, projects=projects)


class RunStore:
    """The runs of one database, as async operations.

    Args:
        url: the database (see `database_url`).
        create: make the database when it does not exist (submitting does; reading an
            unknown store is an error instead, and writes nothing).
        hub: the live events of a worker in this process: followers get its runs' token
            deltas from it (those of workers in other processes come from the store's
            channel: Postgres NOTIFY, or FIFOs beside an SQLite file).
        poll: seconds between reads of a followed run when nothing woke it (SQLite; Postgres
            wakes followers with LISTEN/NOTIFY).
        import_tools: check a submitted recipe with its tools modules imported (False, for a
            service: no request makes this process import code; each module is only found,
            and the worker checks the steps' tool names when it builds the recipe).

    Raises:
        StoreError: the database cannot be reached, is not a minions store, or is newer.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        create: bool = False,
        hub: LiveHub | None = None,
        poll: float = 0.1,
        import_tools: bool = True,
    ) -> None:
        self.url = database_url(url)
        self._import_tools = import_tools
        self._database = AsyncDatabase(Database(self.url, create=create))
        self.log = EventLog(self._database, hub=hub, poll=poll)
        """The event log: `follow` reads it."""
        self._queue: Queue | None = None

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()
        self._database.close()

    async def aclose(self) -> None:
        """Stop following runs, then close."""
        await self.log.stop()
        self.close()

    async def __aenter__(self) -> RunStore:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _dbos(self) -> Queue:
        """The DBOS queue, its client ready (made before a transaction that enqueues: making
        it may create DBOS's tables, which must not wait on that transaction)."""
        if self._queue is None:
            self._queue = Queue(self.url)
        await self._database.call(self._queue.client)
        return self._queue

    # -- submitting ----------------------------------------------------------------------------

    async def submit(
        self,
        recipe: str | Path,
        inputs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        actor: Who = None,
        project: str = "default",
    ) -> Submitted:
        """Queue a run of the recipe file; its YAML is snapshotted into the run. Returns the
        run's id and whether this submit queued it (`Submitted`, which unpacks as
        ``run_id, created``; not created: `idempotency_key` named the same request before,
        and its run is returned). `actor`: who submits it (its `RunStarted` event says so): a
        key's name, ``token``, ``cli:USER``. `project`: the run's project (keys of other
        projects never see it).

        The run is stored and queued in one transaction: both, or neither.

        Raises:
            RecipeError: the recipe or the inputs are invalid (nothing is queued).
            IdempotencyConflictError: `idempotency_key` named another request (another
                recipe, recipe version or inputs).
        """
        from minions.recipes._internal import read_recipe_text

        path = await self._database.call(Path(recipe).resolve)
        text = await self._database.call(read_recipe_text, path)
        return await self._queue_run(
            text, path, inputs, idempotency_key, actor=actor, project=check_project(project)
        )

    async def submit_yaml(
        self,
        text: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        base: str | Path,
        idempotency_key: str | None = None,
        check: Callable[[RecipeSpec], object] | None = None,
        actor: Who = None,
        project: str = "default",
    ) -> Submitted:
        """Queue a run of recipe YAML given as text (the REST service's inline recipes): its
        tools modules and sub-recipes are found in folder `base`. Returns what `submit` does.
        The text is parsed once; `check` sees the parsed recipe before anything is built or
        stored (the service's rules for inline recipes), and refuses it by raising.

        Raises:
            RecipeError: the recipe or the inputs are invalid, or `check` refused them
                (nothing is queued).
            IdempotencyConflictError: as for `submit`.
        """
        from minions.recipes import parse_spec

        folder = await self._database.call(Path(base).resolve)
        spec, located = await self._database.call(parse_spec, text)
        if check is not None:
            check(spec)
        return await self._queue_run(
            text,
            folder / f"{spec.id}.inline.yaml",
            inputs,
            idempotency_key,
            (spec, located),
            actor=actor,
            project=check_project(project),
        )

    async def _queue_run(
        self,
        text: str,
        path: Path,
        inputs: Mapping[str, Any] | None,
        idempotency_key: str | None,
        parsed: tuple[RecipeSpec, Located] | None = None,
        *,
        actor: Who = None,
        project: str = "default",
    ) -> Submitted:
        """Check the recipe snapshot `text` (as the file `path`; `parsed` already) and the
        inputs, store the run and queue it."""
        snapshot = await self._snapshot(text, path, inputs, parsed)
        return await self._insert(
            snapshot, idempotency_key=idempotency_key, actor=actor, project=project
        )

    async def _snapshot(
        self,
        text: str,
        path: Path | str,
        inputs: Mapping[str, Any] | None,
        parsed: tuple[RecipeSpec, Located] | None = None,
    ) -> RecipeSnapshot:
        """The recipe `text` (as the file `path`; `parsed` already) and the inputs, checked."""
        built = await self._build(text, path, parsed)
        return RecipeSnapshot.of(text, path, built, built.check_inputs(dict(inputs or {})))

    async def _build(
        self, text: str, path: Path | str, parsed: tuple[RecipeSpec, Located] | None = None
    ) -> AgentRecipe:
        """The recipe of snapshot `text` (as the file `path`; `parsed` already), checked."""
        from minions.runs._snapshot import build

        return await self._database.call(
            build, text, path, import_tools=self._import_tools, parsed=parsed
        )

    async def _insert(
        self,
        snapshot: RecipeSnapshot,
        *,
        idempotency_key: str | None = None,
        rerun: RerunPlan | None = None,
        seeds: Callable[[Any], Sequence[Checkpoint]] | None = None,
        actor: Who = None,
        project: str = "default",
    ) -> Submitted:
        queue = await self._dbos()
        who = dataclasses.replace(Actor.of(actor), project=project)
        row = runs.queued_row(
            snapshot,
            run_id=uuid.uuid4().hex,
            idempotency_key=idempotency_key,
            rerun=rerun,
            queued_by=who.name,
            project=project,
        )

        def audit(run_id: str) -> dict[str, Any]:
            if rerun is None:
                return _audit.entry("run.submit", run_id, who, recipe=snapshot.recipe_id)
            return _audit.entry(
                "run.rerun",
                run_id,
                who,
                recipe=snapshot.recipe_id,
                parent=rerun.parent_run_id,
                from_step=rerun.from_step,
            )

        return await self._database.apply(
            runs.insert, row, enqueue=queue.enqueue, seeds=seeds, audit=audit
        )

    async def rerun(
        self,
        run_id: str,
        *,
        from_step: str,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        recipe: str | Path | None = None,
        recipe_yaml: str | None = None,
        base: str | Path | None = None,
        check: Callable[[RecipeSpec], object] | None = None,
        idempotency_key: str | None = None,
        cache: bool = False,
        actor: Who = None,
        dry_run: bool = False,
    ) -> RerunPlan:
        """Queue a rerun of an ended run from step `from_step`: a new run that reuses the
        recorded result of every step not downstream of `from_step` (no model or tool call;
        status ``reused``) and executes `from_step` and everything after it. `inputs` change
        some of the run's inputs (steps whose rendered templates change with them run again
        too); `outputs` replace the recorded outputs of reused steps (checked against their
        output schemas; what follows them runs again). `recipe`: a new version of the recipe
        (a file), instead of the run's snapshot; or `recipe_yaml`, recipe YAML whose tools
        modules and sub-recipes are found in folder `base` (as `submit_yaml` takes it: parsed
        once, and `check` sees the parsed recipe first, and refuses it by raising); steps
        whose definition changed run again. The steps it runs again never answer from the
        step cache, unless `cache` (the plan says so). `idempotency_key`: as for `submit`
        (the same key and request give the same rerun: its plan, `created` False). `actor`:
        who reruns it. The rerun is of its parent's project. Returns the plan, with the new
        run's id. `dry_run`: plan it, and queue nothing: the plan (no `run_id`, `created`
        False) says what the rerun would reuse and execute again, checked as the rerun is.

        The parent is held while the rerun is stored, and its seeds (the checkpoints of
        the steps it reuses) are read in that transaction: a prune meanwhile either comes
        after (the rerun has its seeds) or refuses the rerun (`UnknownRunError`).

        Raises:
            UnknownRunError: no run has this id (or it was pruned while the rerun was made).
            RunStateError: the run has not ended (or was resumed while the rerun was made).
            RerunError: an unknown step, or an output that cannot be set.
            RecipeError: the recipe or the inputs are invalid, or `check` refused the recipe
                (nothing is queued).
            IdempotencyConflictError: `idempotency_key` named another request.
        """
        from minions.runs._rerun import request_hash, seeding

        parent, plan, snapshot = await self._plan_rerun(
            run_id,
            from_step=from_step,
            inputs=inputs,
            outputs=outputs,
            recipe=recipe,
            recipe_yaml=recipe_yaml,
            base=base,
            check=check,
        )
        plan = dataclasses.replace(plan, cache=cache)
        if dry_run:
            return dataclasses.replace(plan, created=False)
        snapshot = dataclasses.replace(
            snapshot, request_hash=request_hash(plan, snapshot.request_hash)
        )
        new_id, created = await self._insert(
            snapshot,
            idempotency_key=idempotency_key,
            rerun=plan,
            seeds=seeding(plan, attempt=parent.attempt),
            actor=actor,
            project=parent.project,
        )
        if not created:
            earlier = await self._database.apply(runs.rerun_plan, new_id)
            if earlier is not None:
                return dataclasses.replace(earlier, created=False)
        return dataclasses.replace(plan, run_id=new_id)

    async def _plan_rerun(
        self,
        run_id: str,
        *,
        from_step: str,
        inputs: Mapping[str, Any] | None,
        outputs: Mapping[str, Any] | None,
        recipe: str | Path | None,
        recipe_yaml: str | None,
        base: str | Path | None,
        check: Callable[[RecipeSpec], object] | None,
    ) -> tuple[RunRecord, RerunPlan, RecipeSnapshot]:
        """What `rerun` queues (and `rerun(dry_run=True)` answers): the parent, the plan and
        the new run's recipe snapshot, its recipe parsed once."""
        from minions._agent.graph import StepGraph
        from minions.recipes import parse_spec
        from minions.recipes._internal import read_recipe_text
        from minions.runs._rerun import plan_rerun, step_definitions

        parent = await self._database.apply(runs.get, run_id)
        if not parent.terminal:
            raise RunStateError(
                f"run {run_id} is {parent.status}: only an ended run is rerun", status=parent.status
            )
        source = await self._database.apply(runs.snapshot, run_id)
        text, path = source.yaml, source.path
        new: tuple[str, str] | None = None
        parsed: tuple[RecipeSpec, Located] | None = None
        if recipe is not None:
            new_path = await self._database.call(Path(recipe).resolve)
            new = (await self._database.call(read_recipe_text, new_path), str(new_path))
        elif recipe_yaml is not None:
            folder = await self._database.call(Path(base or ".").resolve)
            parsed = await self._database.call(parse_spec, recipe_yaml)
            if check is not None:
                check(parsed[0])
            new = (recipe_yaml, str(folder / f"{parsed[0].id}.inline.yaml"))
        definitions = None
        if new is not None:
            if new[0] != text:
                after: str | RecipeSpec = new[0] if parsed is None else parsed[0]
                definitions = (
                    await self._database.call(step_definitions, text),
                    await self._database.call(step_definitions, after),
                )
            text, path = new
        built = await self._build(text, path or "recipe.yaml", parsed)
        checked = built.check_inputs({**parent.inputs, **dict(inputs or {})})
        plan = plan_rerun(
            parent,
            StepGraph(built),
            from_step=from_step,
            inputs=checked,
            outputs=dict(outputs or {}),
            definitions=definitions,
        )
        return parent, plan, RecipeSnapshot.of(text, path or "recipe.yaml", built, checked)

    def scoped(self, scope: Scope) -> ScopedRuns:
        """This store as a caller of `scope` sees it: the runs, schedules and evals of its
        projects only (what the REST service's routes use)."""
        return ScopedRuns(self, scope)

    # -- reading -------------------------------------------------------------------------------

    async def projects(self) -> list[str]:
        """The projects the store knows, sorted: those of its runs, schedules and evals, and
        those its working keys name."""
        found = await self._database.apply(runs.projects)
        for key in await self.keys():
            found.update(key.projects)
        return sorted(found)

    async def recipe_yaml(self, run_id: str) -> str:
        """The recipe YAML snapshotted into the run at submission.

        Raises:
            UnknownRunError: no run has this id.
        """
        return (await self._database.apply(runs.snapshot, run_id)).yaml

    async def recipe_graph(self, run_id: str) -> tuple[RecipeNode, ...]:
        """The steps of the recipe snapshotted into the run, in order: what each is and where
        it goes (none when the snapshot no longer parses). Parsed once per recipe text in
        this process, in the store's threads.

        Raises:
            UnknownRunError: no run has this id.
        """
        return await self._database.apply(runs.graph, run_id)

    async def get(self, run_id: str) -> RunRecord:
        """The run with its finished steps and approvals.

        A run that has not ended has the usage of the model calls it made so far.

        Raises:
            UnknownRunError: no run has this id.
        """
        return (await self._so_far([await self._database.apply(runs.get, run_id)]))[0]

    async def _so_far(self, records: list[RunRecord]) -> list[RunRecord]:
        """The records, those of runs that have not ended with their usage so far (a run's
        usage is written when it ends)."""
        from minions.runs import _usage

        active = [r.run_id for r in records if r.status not in TERMINAL]
        if not active:
            return records
        found = await self._database.apply(_usage.so_far, active)
        return [
            dataclasses.replace(r, usage=found[r.run_id]) if r.run_id in found else r
            for r in records
        ]

    async def list_runs(
        self,
        *,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        **which: Unpack[RunFilters],
    ) -> list[RunRecord]:
        """Runs, newest first, a page at a time.

        Args:
            limit: at most this many.
            before: the created_at and run id of a page's last run: the page after it.
            **which: the filters, together: `status` (runs in this status), `recipe` (of
                this recipe id), `created_after` (created at or after, Unix seconds),
                `created_before` (created before), `id_prefix` (whose id starts with it),
                `schedule` (fired by this schedule), `project` (of this project),
                `projects` (of one of these projects).

        A run that has not ended has the usage of the model calls it made so far.
        """
        return await self._so_far(
            await self._database.apply(runs.listed, _filter(which), limit=limit, before=before)
        )

    async def count_runs(self, **which: Unpack[RunFilters]) -> int:
        """How many runs `list_runs` with the same filters gives, every page together."""
        return await self._database.apply(runs.count, _filter(which))

    async def step_events(self, run_id: str, step_id: str) -> list[Event]:
        """The stored events of one step of the run, every visit, and of its loop items
        (whose step ids are ``step[0]``, ``step[1]``...), in order.

        Raises:
            UnknownRunError: no run has this id.
        """
        await self._database.apply(runs.head, run_id)
        return await self._database.apply(events.of_step, run_id, step_id)

    async def step_detail(self, run_id: str, step_id: str) -> StepDetail:
        """One step of the run (``each``, or one loop item: ``each[2]``): its finished
        visits, and from its stored events every model call (each attempt), tool call,
        retry, completion decision and approval (what ``minions runs step`` prints).

        Raises:
            UnknownRunError: no run has this id.
            UnknownStepError: the run has no such step (or item).
        """
        record = await self.get(run_id)
        events = await self.step_events(run_id, step_id)
        return step_detail(record, step_id, events, await self.recipe_graph(run_id))

    async def step_states(self, run: str | RunRecord) -> RunStates:
        """The state of the run's steps (`run`: its id, or its record read already): its
        stored events folded by the one fold (`minions._fold`), what the store kept of each
        execution laid over them (what ``GET /runs/{id}/steps`` answers and ``minions runs
        show`` prints).

        Raises:
            UnknownRunError: no run has this id.
        """
        record = await self.get(run) if isinstance(run, str) else run
        return RunStates.of(await self.events(record.run_id), record.steps)

    async def history(self) -> History:
        """How far the stored runs go back, and how far pruning went."""
        from minions.runs import _prune

        return await self._database.apply(_prune.history)

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        """Stored events of the run after sequence number `after`, in order.

        Raises:
            UnknownRunError: no run has this id.
            StoreError: the store cannot be used now, or is damaged (a stored event that is
                no event this minions reads: the message names the run and its number).
        """
        await self._database.apply(runs.head, run_id)
        return await self._database.apply(events.after, run_id, after=after, limit=limit)

    def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The stored events after `after`, then new ones as they are stored, until the run
        has ended (a resumed run is followed to its new end); its token deltas live, from
        whichever worker runs it. A caller that reads slower than the run's events come (more
        than 10,000 behind) gets what it missed from the store: no event lost, none twice.
        The follow ends before the run's end only when the store closes, or with an error.
        The `seq` of the last event received, a token delta's too, is where to resume:
        `follow(run_id, after=last.seq)`.

        Raises:
            UnknownRunError: no run has this id.
            StoreError: the store cannot be used as the follow starts, or is damaged (a
                stored event that is no event, say), or the run's reader in this process
                failed (the message names the run).
        """
        return self.log.follow(run_id, after=after)

    async def diff(self, run_a: str, run_b: str, *, max_values: int | None = None) -> RunDiff:
        """Two runs compared step by step (status, output, tokens, calls, duration), with the
        first step where they diverge; computed in a thread, off the event loop.

        Raises:
            UnknownRunError: no run has one of these ids.
            DiffTooLargeError: their step outputs hold more than `max_values` JSON values
                (default 500,000).
        """
        from minions.runs._diff import diff_off_loop

        a = await self._database.apply(runs.get, run_a)
        b = await self._database.apply(runs.get, run_b)
        return await diff_off_loop(a, b, max_values)

    def step_cache(self, *, clock: Callable[[], float] = time.time) -> StepCache:
        """The store's step cache (what durable runs use), for foreground runs to share it:
        ``AgentExecutor(settings=RunSettings(step_cache=store.step_cache()))``. `clock`: the
        time entries are made and expire by."""
        from minions.runs._cache import StoreStepCache

        return StoreStepCache(self._database, clock=clock)

    async def cache_entries(
        self, *, recipe: str | None = None, limit: int = 100
    ) -> list[CacheEntry]:
        """The step cache's entries (made by runs of `recipe`), newest first, each with its
        key: the step, the run that made it (pruned with it), its recipe, when."""
        from minions.runs import _cache

        return await self._database.apply(_cache.listed, recipe=recipe, limit=limit)

    async def count_cache_entries(self, *, recipe: str | None = None) -> int:
        """How many entries `cache_entries` has, every page together."""
        from minions.runs import _cache

        return await self._database.apply(_cache.count, recipe=recipe)

    async def clear_cache(self, *, recipe: str | None = None, actor: Who = None) -> int:
        """Delete the step cache's entries (those made by runs of `recipe`); how many.
        `actor`: who clears it (the audit log's ``cache.clear``)."""
        from minions.runs import _cache

        return await self._database.apply(
            _cache.clear,
            recipe=recipe,
            audit=_audit.entry("cache.clear", "cache", actor, recipe=recipe),
        )

    async def workers(self) -> list[WorkerRecord]:
        """The store's workers, alive, stopped and dead, each with the runs it holds now (a
        run another worker took over is listed under that one); the records of workers
        stopped or dead for longer than ``MINIONS_WORKER_EXPIRY`` (a day) are gone."""
        from minions.runs._fleet import worker_records

        return await self._database.apply(worker_records, now=time.time())

    async def endpoint_status(self, *, expiry: float | None = None) -> list[EndpointStatus]:
        """Each limited endpoint's load now over every worker (calls in flight, workers
        waiting for a place, requests and tokens of the last minute, a 429's pause) beside
        what its models taught the structured-output ladder (learned within `expiry`
        seconds, the default of `Limits.capability_expiry`)."""
        from minions.models._internal import DEFAULT_CAPABILITY_EXPIRY
        from minions.runs._fleet import endpoint_status

        kept = DEFAULT_CAPABILITY_EXPIRY if expiry is None else expiry
        return await self._database.apply(endpoint_status, now=time.time(), expiry=kept)

    async def notifications(self) -> list[Delivery]:
        """How notifications fared, per target (``--notify``): delivered, pending, given up,
        the last error."""
        from minions.runs._notify import deliveries

        return await self._database.apply(deliveries)

    async def queue(
        self, *, limit: int = 20, projects: Collection[str] | None = None
    ) -> QueueState:
        """The backlog now: runs queued (per recipe, and the `limit` oldest), running and
        waiting for a person (of the runs of `projects`: None, every run)."""
        from minions.runs._fleet import queue_state

        return await self._database.apply(
            queue_state, now=time.time(), limit=limit, projects=projects
        )

    async def usage(
        self,
        *,
        since: float,
        until: float | None = None,
        group_by: Sequence[str] = ("day",),
        projects: Collection[str] | None = None,
    ) -> UsageReport:
        """Tokens and cost of the model calls that ended between `since` and `until`
        (Unix seconds; `until`: now), grouped by each of `group_by` (``day``, ``recipe``,
        ``schedule``, ``model``, ``project``), of the runs of `projects` (None: every run);
        runs still going count as far as they went.

        Raises:
            ValueError: a group that is not one of those, or one given twice.
        """
        from minions.runs import _usage

        unknown = [g for g in group_by if g not in _usage.GROUPS]
        if unknown or len(set(group_by)) != len(group_by):
            raise ValueError(
                f"group_by takes each of {', '.join(_usage.GROUPS)} at most once, not "
                f"{', '.join(group_by)!r}"
            )
        groups = [g for g in _usage.GROUPS if g in group_by]
        groups.sort(key=list(group_by).index)
        return await self._database.apply(
            _usage.report,
            since=since,
            until=time.time() if until is None else until,
            group_by=groups,
            projects=projects,
        )

    async def fleet(self) -> FleetState:
        """The queue, the workers alive and dead, the schedules' next slots and the load of
        limited endpoints, now: a few cheap reads (what ``GET /metrics`` reports).

        Raises:
            StoreError: the store cannot be used now.
        """
        from minions.runs._fleet import fleet_state

        return await self._database.apply(fleet_state, now=time.time())

    async def check(self) -> str | None:
        """Why the store cannot be used now, or ``None`` when it can: it answers, and its
        schema is the one this minions knows (one read).

        Raises:
            StoreError: the store cannot be reached now (the reason is the message).
        """
        from minions.runs._fleet import schema_problem

        return await self._database.apply(schema_problem)

    async def endpoints(self, *, expiry: float | None = None) -> list[EndpointRecord]:
        """What model endpoints taught the structured-output ladder of the store's workers,
        learned within `expiry` seconds (the default of `Limits.capability_expiry`)."""
        from minions.models._internal import DEFAULT_CAPABILITY_EXPIRY
        from minions.runs import _endpoints

        kept = DEFAULT_CAPABILITY_EXPIRY if expiry is None else expiry
        return await self._database.apply(_endpoints.learned, expiry=kept, now=time.time())

    async def pauses(self) -> list[EndpointPause]:
        """The limited endpoints paused now after a 429: until when, set by which run, and
        what the endpoint asked (`minions endpoints list`)."""
        from minions.runs import _endpoints

        return await self._database.apply(_endpoints.pauses, now=time.time())

    async def lift_pauses(
        self, base_url: str, model: str | None = None, *, actor: Who = None
    ) -> int:
        """Lift the pauses that hold calls to an endpoint (every model it serves when `model`
        is ``None``; for `model`, the base URL's own pause too): its calls go again at once.
        How many pauses were in force. `actor`: who lifts them (``endpoint.lift``)."""
        from minions.models._internal import base_url as normalized
        from minions.runs import _endpoints

        url = normalized(base_url)
        return await self._database.apply(
            _endpoints.lift_pauses,
            url,
            model,
            now=time.time(),
            audit=_audit.entry("endpoint.lift", _endpoint(url, model), actor),
        )

    async def forget_endpoint(
        self, base_url: str, model: str | None = None, *, actor: Who = None
    ) -> int:
        """Forget what an endpoint taught (every model it serves when `model` is ``None``):
        the next run through it discovers its structured-output mode again. How many
        endpoints were forgotten. `actor`: who makes it forget (``endpoint.forget``)."""
        from minions.models._internal import base_url as normalized
        from minions.runs import _endpoints

        url = normalized(base_url)
        return await self._database.apply(
            _endpoints.forget_capabilities,
            url,
            model,
            audit=_audit.entry("endpoint.forget", _endpoint(url, model), actor),
        )

    # -- state changes -------------------------------------------------------------------------

    async def cancel(self, run_id: str, *, wait: float = 10.0, actor: Who = None) -> RunRecord:
        """Cancel the run: a queued one (or one whose worker died) at once; a running one at
        its next step boundary, its model calls cancelled. A worker that does not answer within
        `wait` seconds is fenced out and the run is ended here. Returns the run as it is then.
        `actor`: who cancels it (its terminal `RunFailed` event says so).

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run has ended already.
        """
        who = Actor.of(actor)
        actor = who.name
        record = await self._database.apply(
            runs.request_cancel,
            run_id,
            actor=actor,
            audit=_audit.entry("run.cancel", run_id, who),
        )
        if await self._end_cancelled(run_id, "unheld", actor):
            await self._forget(run_id, record.attempt)
            return await self.get(run_id)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            found = await self._database.apply(runs.get, run_id, details=False)
            if found.terminal:
                return await self.get(run_id)
            await asyncio.sleep(0.1)
        await self._end_cancelled(run_id, "any", actor)
        return await self.get(run_id)

    async def _end_cancelled(self, run_id: str, when: Any, actor: str | None) -> bool:
        return await self._database.apply(
            runs.end_unheld,
            run_id,
            status="cancelled",
            error="cancelled",
            event=events.run_failed_row(run_id, "cancelled", actor),
            when=when,
            now=time.time(),
        )

    async def _forget(self, run_id: str, attempt: int) -> None:
        """Take the run's attempt out of DBOS's queue (best effort: a delivery of it finds the
        run ended and does nothing)."""
        try:
            queue = await self._dbos()
        except StoreError:
            return
        await self._database.call(queue.cancel, workflow_id(run_id, attempt))

    async def resume(self, run_id: str, *, actor: Who = None) -> RunRecord:
        """Queue a failed or cancelled run again: it goes on from its last completed step
        (and loop item). `actor`: who resumes it (its next `RunStarted` event says so).

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run did not fail and was not cancelled (or another caller
                resumed it first).
        """
        queue = await self._dbos()
        resumed = await self._database.apply(
            runs.requeue,
            run_id,
            statuses=("failed", "cancelled"),
            epoch=None,
            recovery=False,
            enqueue=queue.enqueue,
            actor=Actor.of(actor).name,
            audit=_audit.entry("run.resume", run_id, actor),
        )
        if resumed is None:
            status = (await self._database.apply(runs.get, run_id, details=False)).status
            raise RunStateError(
                f"run {run_id} is {status}; only a failed or cancelled run resumes",
                status=status,
            )
        return await self.get(run_id)

    async def approve(
        self,
        run_id: str,
        call_id: str | None = None,
        *,
        approved: bool = True,
        reason: str | None = None,
        actor: Who = None,
    ) -> RunRecord:
        """Decide a call the run waits for (the only one when `call_id` is not given), as
        `actor` (the approval's `decided_by`, and its `ApprovalResolved` event's `actor`). A
        call is decided once: of concurrent decisions (and its timeout), one wins. A run
        parked while it waits (held by no worker) is queued again by the decision, in the
        same transaction: it goes on at the waiting call.

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run waits for no approval, or for several and none was named,
                or the call was decided already.
        """
        record = await self.get(run_id)
        if call_id is None:
            call_id = approvals.the_waiting_call(run_id, record.status, record.approvals)
        asked = {a.call_id: a for a in record.approvals}.get(call_id)
        audit = _audit.entry(
            "approval.approve" if approved else "approval.reject",
            run_id,
            actor,
            call=call_id,
            tool=asked.tool if asked is not None else None,
            reason=reason,
        )
        queue = await self._dbos()
        decided = await self._database.apply(
            decisions.decide,
            run_id,
            call_id,
            approved=approved,
            reason=reason,
            actor=Actor.of(actor).name,
            enqueue=queue.enqueue,
            audit=audit,
        )
        record = await self.get(run_id)
        if decided is None:
            raise approvals.undecided(
                run_id, call_id, record.status, ended=record.terminal, asked=record.approvals
            )
        return record

    # -- schedules -----------------------------------------------------------------------------

    async def add_schedule(
        self,
        recipe: str | Path,
        *,
        cron: str | None = None,
        every: str | int | None = None,
        inputs: Mapping[str, Any] | None = None,
        name: str | None = None,
        timezone: str | None = None,
        catch_up: CatchUp | None = None,
        overlap: Overlap | None = None,
        replace: bool = False,
        actor: Who = None,
        project: str = "default",
    ) -> ScheduleRecord:
        """Run the recipe file at each slot of `cron` or `every` (its YAML is snapshotted
        now: to change it, add it again with `replace`). Without `cron` and `every`, the
        recipe's own ``schedule:`` says when; the arguments given override its fields
        (`inputs` are merged into its inputs).

        Args:
            recipe: the recipe file.
            cron: a cron expression (minute hour day-of-month month day-of-week).
            every: or an interval: ``30s``, ``5m``, ``1h``, ``1d`` or seconds.
            inputs: the runs' inputs.
            name: the schedule's name (default: the recipe's id).
            timezone: the cron expression's time zone (default UTC).
            catch_up: slots missed while no worker ran: ``none``, ``one`` (default), ``all``.
            overlap: a slot due while runs of it are active: ``skip`` (default: it is
                skipped), ``buffer_one`` (one may wait in the queue) or ``allow``.
            replace: a schedule of that name gets this recipe and timing (its slots go on
                from now); otherwise it is an error.
            actor: who adds it (its `changed_by`).
            project: its project, and its runs' (`replace` replaces a schedule of this
                project only).

        Raises:
            RecipeError: the recipe, its ``schedule:``, the timing or the inputs are invalid.
            ScheduleExistsError: the name is taken (by another project's schedule, or
                `replace` is False).
        """
        from minions.recipes._internal import read_recipe_text
        from minions.runs import _schedules

        path = await self._database.call(Path(recipe).resolve)
        text = await self._database.call(read_recipe_text, path)
        schedule = await self._database.call(
            _schedules.spec_of,
            text,
            path,
            inputs=inputs,
            cron=cron,
            every=every,
            name=name,
            timezone=timezone,
            catch_up=catch_up,
            overlap=overlap,
        )
        snapshot = await self._snapshot(text, path, schedule.inputs)
        row = _schedules.new_row(
            name=schedule.name or snapshot.recipe_id,
            snapshot=snapshot,
            timing=_schedules.Timing.of(schedule),
            catch_up=schedule.catch_up,
            overlap=schedule.overlap,
            now=time.time(),
            actor=Actor.of(actor).name,
            project=check_project(project),
        )

        def audit(how: str) -> dict[str, Any]:
            action: _audit.AuditAction = "schedule.replace" if how == "replace" else "schedule.add"
            return _audit.entry(
                action,
                row["name"],
                actor,
                recipe=snapshot.recipe_id,
                cron=row["cron"],
                every=row["every"],
            )

        await self._dbos()  # DBOS's tables exist before a worker's tick fires into them
        saved = await self._database.apply(_schedules.save, row, replace=replace, audit=audit)
        await self._database.apply(wake, "schedules")  # its first slot may be soon
        return saved

    async def schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""
        from minions.runs import _schedules

        return await self._database.apply(_schedules.listed)

    async def schedule(self, name: str) -> ScheduleRecord:
        """The schedule (`list_runs(schedule=name)` lists its runs).

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        from minions.runs import _schedules

        return await self._database.apply(_schedules.get, name)

    async def pause_schedule(self, name: str, *, actor: Who = None) -> ScheduleRecord:
        """Stop firing the schedule until it is resumed (`actor`: who pauses it, its
        `changed_by`).

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        return await self._set_paused(name, paused=True, actor=actor)

    async def resume_schedule(self, name: str, *, actor: Who = None) -> ScheduleRecord:
        """Fire the schedule again from its next slot (the slots of the pause do not fire);
        `actor`: who resumes it.

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        return await self._set_paused(name, paused=False, actor=actor)

    async def _set_paused(self, name: str, *, paused: bool, actor: Who) -> ScheduleRecord:
        from minions.runs import _schedules

        changed = await self._database.apply(
            _schedules.set_paused,
            name,
            paused=paused,
            now=time.time(),
            actor=Actor.of(actor).name,
            audit=_audit.entry("schedule.pause" if paused else "schedule.resume", name, actor),
        )
        if not paused:
            await self._database.apply(wake, "schedules")
        return changed

    async def remove_schedule(self, name: str, *, actor: Who = None) -> None:
        """Remove the schedule; the runs it fired stay. `actor`: who removes it (said in the
        log: the row is gone).

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        from minions.runs import _schedules

        await self._database.apply(
            _schedules.delete, name, audit=_audit.entry("schedule.remove", name, actor)
        )
        log.info("schedule removed", schedule=name, actor=Actor.of(actor).name)

    # -- keys ----------------------------------------------------------------------------------

    async def add_key(
        self,
        name: str,
        *,
        role: str,
        projects: Sequence[str] = (),
        actor: Who = None,
    ) -> NewKey:
        """Add an API key named `name` with `role` (and `projects`): returns its record and
        the key itself, which is never stored (only its SHA-256 is) and cannot be shown again.
        `actor`: who adds it (recorded).

        Raises:
            ValueError: the name, role or a project is not valid.
            KeyExistsError: a key that is not revoked has this name.
        """
        from minions.runs import _keys

        return await self._database.apply(
            _keys.add,
            name,
            role=role,
            projects=projects,
            actor=Actor.of(actor).name,
            audit=_audit.entry("key.add", name, actor, role=role, projects=list(projects) or None),
        )

    async def keys(self, *, revoked: bool = False) -> list[KeyRecord]:
        """The API keys that work (the revoked ones too, when `revoked`), by name."""
        from minions.runs import _keys

        return await self._database.apply(_keys.listed, revoked=revoked)

    async def revoke_key(self, name: str, *, actor: Who = None) -> KeyRecord:
        """Revoke the key of that name: its next request fails, and so do the event streams
        it opened.

        Raises:
            UnknownKeyError: no key that works has this name.
        """
        from minions.runs import _keys

        return await self._database.apply(
            _keys.revoke,
            name,
            actor=Actor.of(actor).name,
            audit=_audit.entry("key.revoke", name, actor),
        )

    async def key_of(self, key: str) -> KeyRecord | None:
        """The key that works and is `key` (found by its hash), or None."""
        from minions.runs import _keys

        return await self._database.apply(_keys.by_key, key)

    async def key_named(self, name: str) -> KeyRecord | None:
        """The key that works with this name, or None (a trusted proxy's user is the key of
        that name)."""
        from minions.runs import _keys

        return await self._database.apply(_keys.by_name, name)

    async def key_by_id(self, key_id: str) -> KeyRecord | None:
        """The key that works with this id (`KeyRecord.id`), or None."""
        from minions.runs import _keys

        return await self._database.apply(_keys.by_id, key_id)

    # -- the audit log -------------------------------------------------------------------------

    async def audit(
        self,
        *,
        since: float | None = None,
        actor: str | None = None,
        action: str | None = None,
        project: str | None = None,
        before: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The audit log's entries, newest first: those at or after `since` (Unix seconds),
        of `actor`, of `action` (``run.cancel``, or a family: ``run``), in `project`; `before`
        (an entry's id) continues after a page's last entry.

        Raises:
            ValueError: `action` is not an action or a family of them, or `limit` is not
                between 1 and 1000.
        """
        if action is not None:
            _audit.check_action(action)
        if not 1 <= limit <= 1000:
            raise ValueError(f"limit {limit}: give 1 to 1000")
        return await self._database.apply(
            _audit.listed,
            since=since,
            actor=actor,
            action=action,
            project=project,
            before=before,
            limit=limit,
        )

    async def prune_audit(self, older_than: str | float, *, actor: Who = None) -> int:
        """Delete the audit log's entries older than `older_than` (``365d``, or seconds);
        how many. `actor`: who prunes it (an ``audit.prune`` entry says so, when some
        went).

        Raises:
            ValueError: `older_than` is not a duration.
        """
        from minions._duration import duration_seconds

        before = time.time() - duration_seconds(older_than, zero=not isinstance(older_than, str))
        return await self._database.apply(
            _audit.prune,
            before=before,
            audit=_audit.entry("audit.prune", "audit", actor, older_than=older_than),
        )

    async def waiting_approvals(self, projects: Collection[str] | None = None) -> int:
        """How many calls wait for a person's decision (of runs that have not ended; of
        runs of `projects` when given)."""
        return await self._database.apply(approvals.waiting, projects)

    # -- evals ---------------------------------------------------------------------------------

    async def open_eval(
        self,
        fingerprint: str,
        *,
        dataset: str,
        target: str,
        total: int,
        project: str = "default",
        actor: Who = None,
    ) -> OpenedEval:
        """The eval run on this store's workers whose `fingerprint` (its dataset and recipes)
        this is: the unfinished one, resumed, else a new one (of `project`) (`OpenedEval`,
        which unpacks as ``record, resumed``). Its case runs are submitted under idempotency
        keys holding its id, so an eval resumed submits none twice. `actor`: who starts it
        (``eval.start``, for a new one)."""
        eval_id = uuid.uuid4().hex[:12]
        return await self._database.apply(
            _evals.open_eval,
            eval_id=eval_id,
            fingerprint=fingerprint,
            dataset=dataset,
            target=target,
            total=total,
            now=time.time(),
            project=check_project(project),
            audit=_audit.entry(
                "eval.start", eval_id, actor, dataset=dataset, target=target, total=total
            ),
        )

    async def keep_eval(
        self,
        record: EvalRecord,
        report: Mapping[str, Any],
        *,
        summary: Mapping[str, Any],
        actor: Who = None,
    ) -> None:
        """Keep the report of the eval (plain JSON data, up to 16 MiB) and a `summary` of it
        for listings: the eval is finished. Pruned with the runs. `actor`: who ran it
        (``eval.finish``, with the summary's pass rate and verdict).

        Raises:
            ValueError: the report is too large to keep.
        """
        told = {k: summary.get(k) for k in ("pass_rate", "runs", "ok")}
        await self._database.apply(
            _evals.finish_eval,
            record.eval_id,
            report=jsonable(dict(report)),
            summary=jsonable(dict(summary)),
            dataset=record.dataset,
            target=record.target,
            total=record.total,
            now=time.time(),
            project=record.project,
            audit=_audit.entry(
                "eval.finish", record.eval_id, actor, dataset=record.dataset, **told
            ),
        )

    async def evals(
        self,
        *,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        projects: Sequence[str] | None = None,
    ) -> list[EvalRecord]:
        """The evals run on this store's workers, newest first, a page at a time (`before`:
        the created_at and eval id of a page's last one), without their reports; `projects`:
        of these projects only."""
        return await self._database.apply(
            _evals.listed,
            limit=limit,
            before=before,
            projects=None if projects is None else tuple(projects),
        )

    async def eval(self, eval_id: str) -> EvalRecord | None:
        """The eval with its report (once it finished), or None when the store has none of
        this id."""
        return await self._database.apply(_evals.get, eval_id)

    # -- retention -----------------------------------------------------------------------------

    async def prune(
        self,
        older_than: str | float,
        *,
        statuses: Sequence[str] = (),
        keep: int | None = None,
        dry_run: bool = False,
        actor: Who = None,
    ) -> PruneResult:
        """Delete the finished runs (in one of `statuses`: default, every finished one) that
        finished over `older_than` ago (``30d``, or seconds: 0 for every one), but the newest
        `keep`, with their steps, events, approvals, step cache entries and DBOS workflows;
        in batches, so workers go on meanwhile. An SQLite file then gives the freed space
        back. With every status, the kept evals that finished (or were last started) as long
        ago go too, but the newest `keep`. `actor`: who prunes (`history().pruned_by`).

        Raises:
            ValueError: `older_than` is not a duration (or is longer than ten years), or a
                status is not a finished one.
        """
        from minions._duration import duration_seconds
        from minions.runs import _prune

        return await self._database.apply(
            _prune.prune,
            # Seconds may be none at all (every finished run); a duration written is not.
            before=time.time() - duration_seconds(older_than, zero=not isinstance(older_than, str)),
            statuses=tuple(statuses) or tuple(sorted(TERMINAL)),
            keep=keep,
            dry_run=dry_run,
            actor=Actor.of(actor).name,
            audit=_audit.entry(
                "history.prune",
                "runs",
                actor,
                older_than=older_than,
                statuses=list(statuses) or None,
                keep=keep,
            ),
        )
