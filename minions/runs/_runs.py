"""`RunStore`: the runs of one database, as async operations. The CLI and the REST service use
it and nothing else of `minions.runs`' machinery: every state change a client makes goes
through here, each a compare-and-set on the run (one of concurrent callers wins; the others
get `RunStateError` with the state they found)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import structlog

from minions._text import jsonable
from minions.errors import RunStateError, StoreError
from minions.events import Event
from minions.runs._async import AsyncStore
from minions.runs._keys import KeyRecord
from minions.runs._log import EventLog, LiveHub, run_failed_row
from minions.runs._store import DEFAULT_URL, Store
from minions.runs._tables import (
    STATUSES,
    TERMINAL,
    CatchUp,
    EndpointRecord,
    History,
    PruneResult,
    RunFilter,
    RunRecord,
    ScheduleRecord,
    WorkerRecord,
)

if TYPE_CHECKING:
    from minions._step.cache import StepCache
    from minions.recipes._recipe import AgentRecipe
    from minions.recipes._schema import RecipeSpec
    from minions.recipes._source import Located
    from minions.runs._diff import RunDiff
    from minions.runs._queue import Queue
    from minions.runs._rerun import RerunPlan

__all__ = ["RunFilters", "RunStore", "database_url"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class _Snapshot:
    """A recipe and its inputs, checked, as a run (or a schedule) stores them."""

    recipe_id: str
    recipe_hash: str
    inputs: dict[str, Any]
    request_hash: str


def _snapshot_of(text: str, built: AgentRecipe, checked: Mapping[str, Any]) -> _Snapshot:
    """What a run (or a schedule) stores of recipe snapshot `text` and its checked inputs."""
    recipe_hash = hashlib.sha256(text.encode()).hexdigest()
    request = json.dumps(
        {"recipe": built.id, "recipe_hash": recipe_hash, "inputs": jsonable(checked)},
        sort_keys=True,
        ensure_ascii=False,
    )
    return _Snapshot(
        recipe_id=built.id,
        recipe_hash=recipe_hash,
        inputs=dict(checked),
        request_hash=hashlib.sha256(request.encode()).hexdigest(),
    )


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


def _filter(which: RunFilters) -> RunFilter:
    status = which.get("status")
    if status is not None and status not in STATUSES:
        raise ValueError(f"unknown status {status!r}; one of: {', '.join(STATUSES)}")
    return RunFilter(**which)


class RunStore:
    """The runs of one database, as async operations.

    Args:
        url: the database (see `database_url`).
        create: make the database when it does not exist (submitting does; reading an
            unknown store is an error instead, and writes nothing).
        hub: the live events of a worker in this process: followers get its runs' token
            deltas too.
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
        self._store = AsyncStore(Store(self.url, create=create))
        self.log = EventLog(self._store, hub=hub, poll=poll)
        """The event log: `follow` reads it."""
        self._queue: Queue | None = None

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()
        self._store.close()

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
            from minions.runs._queue import Queue

            self._queue = Queue(self.url)
        await self._store.call(self._queue.client)
        return self._queue

    # -- submitting ----------------------------------------------------------------------------

    async def submit(
        self,
        recipe: str | Path,
        inputs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        actor: str | None = None,
    ) -> tuple[str, bool]:
        """Queue a run of the recipe file; its YAML is snapshotted into the run. Returns the
        run id and whether it is new (False: `idempotency_key` named the same request before;
        its run is returned). `actor`: who submits it (its `RunStarted` event says so): a
        key's name, ``token``, ``cli:USER``.

        The run is stored and queued in one transaction: both, or neither.

        Raises:
            RecipeError: the recipe or the inputs are invalid (nothing is queued).
            IdempotencyConflictError: `idempotency_key` named another request (another
                recipe, recipe version or inputs).
        """
        from minions.recipes._loader import read_recipe_text

        path = await self._store.call(Path(recipe).resolve)
        text = await self._store.call(read_recipe_text, path)
        return await self._queue_run(text, path, inputs, idempotency_key, actor=actor)

    async def submit_yaml(
        self,
        text: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        base: str | Path,
        idempotency_key: str | None = None,
        check: Callable[[RecipeSpec], object] | None = None,
        actor: str | None = None,
    ) -> tuple[str, bool]:
        """Queue a run of recipe YAML given as text (the REST service's inline recipes): its
        tools modules and sub-recipes are found in folder `base`. Returns what `submit` does.
        The text is parsed once; `check` sees the parsed recipe before anything is built or
        stored (the service's rules for inline recipes), and refuses it by raising.

        Raises:
            RecipeError: the recipe or the inputs are invalid, or `check` refused them
                (nothing is queued).
            IdempotencyConflictError: as for `submit`.
        """
        from minions.recipes._loader import parse_spec

        folder = await self._store.call(Path(base).resolve)
        spec, located = await self._store.call(parse_spec, text)
        if check is not None:
            check(spec)
        return await self._queue_run(
            text,
            folder / f"{spec.id}.inline.yaml",
            inputs,
            idempotency_key,
            (spec, located),
            actor=actor,
        )

    async def _queue_run(
        self,
        text: str,
        path: Path,
        inputs: Mapping[str, Any] | None,
        idempotency_key: str | None,
        parsed: tuple[RecipeSpec, Located] | None = None,
        *,
        actor: str | None = None,
    ) -> tuple[str, bool]:
        """Check the recipe snapshot `text` (as the file `path`; `parsed` already) and the
        inputs, store the run and queue it."""
        built = await self._build(text, path, parsed)
        checked = built.check_inputs(dict(inputs or {}))
        return await self._insert(
            text, path, built, checked, idempotency_key=idempotency_key, actor=actor
        )

    async def _snapshot(self, text: str, path: Path, inputs: Mapping[str, Any] | None) -> _Snapshot:
        """The recipe `text` (as the file `path`) and the inputs, checked."""
        built = await self._build(text, path)
        return _snapshot_of(text, built, built.check_inputs(dict(inputs or {})))

    async def _build(
        self, text: str, path: Path | str, parsed: tuple[RecipeSpec, Located] | None = None
    ) -> AgentRecipe:
        """The recipe of snapshot `text` (as the file `path`; `parsed` already), checked."""
        from minions.recipes._build import load_recipe_file
        from minions.runs._runner import recipe_of

        if self._import_tools:
            return await self._store.call(recipe_of, text, str(path))
        loaded = await self._store.call(
            load_recipe_file, Path(path), text=text, import_tools=False, parsed=parsed
        )
        return loaded.recipe

    async def _insert(
        self,
        text: str,
        path: Path | str,
        built: AgentRecipe,
        checked: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        rerun: Mapping[str, Any] | None = None,
        steps: Sequence[Mapping[str, Any]] = (),
        actor: str | None = None,
    ) -> tuple[str, bool]:
        snapshot = _snapshot_of(text, built, checked)
        queue = await self._dbos()
        return await self._store.call(
            self._store.store.insert_run,
            run_id=uuid.uuid4().hex,
            recipe_id=snapshot.recipe_id,
            recipe_yaml=text,
            recipe_path=str(path),
            recipe_hash=snapshot.recipe_hash,
            inputs=snapshot.inputs,
            idempotency_key=idempotency_key,
            request_hash=snapshot.request_hash,
            enqueue=queue.enqueue,
            rerun=rerun,
            steps=steps,
            actor=actor,
        )

    async def rerun(
        self,
        run_id: str,
        *,
        from_step: str,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        recipe: str | Path | None = None,
        actor: str | None = None,
    ) -> RerunPlan:
        """Queue a rerun of an ended run from step `from_step`: a new run that reuses the
        recorded result of every step not downstream of `from_step` (no model or tool call;
        status ``reused``) and executes `from_step` and everything after it. `inputs` change
        some of the run's inputs (steps whose rendered templates change with them run again
        too); `outputs` replace the recorded outputs of reused steps (checked against their
        output schemas; what follows them runs again). `recipe`: a new version of the recipe
        (a file), instead of the run's snapshot; steps whose definition changed run again.
        `actor`: who reruns it. Returns the plan, with the new run's id.

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run has not ended.
            RerunError: an unknown step, or an output that cannot be set.
            RecipeError: the recipe or the inputs are invalid (nothing is queued).
        """
        from minions._agent.graph import StepGraph
        from minions.recipes._loader import read_recipe_text
        from minions.runs._rerun import plan_rerun, seed_rows, step_definitions

        parent = await self._store.get_run(run_id)
        if not parent.terminal:
            raise RunStateError(
                f"run {run_id} is {parent.status}: only an ended run is rerun", status=parent.status
            )
        text, path, _ = await self._store.run_source(run_id)
        definitions = None
        if recipe is not None:
            new_path = await self._store.call(Path(recipe).resolve)
            new_text = await self._store.call(read_recipe_text, new_path)
            if new_text != text:
                definitions = (step_definitions(text), step_definitions(new_text))
            text, path = new_text, str(new_path)
        built = await self._build(text, path or "recipe.yaml")
        checked = built.check_inputs({**parent.inputs, **dict(inputs or {})})
        plan = plan_rerun(
            parent,
            StepGraph(built),
            from_step=from_step,
            inputs=checked,
            outputs=dict(outputs or {}),
            definitions=definitions,
        )
        seeds = seed_rows(plan, await self._store.saved_steps(run_id))
        new_id, _ = await self._insert(
            text,
            path or "recipe.yaml",
            built,
            checked,
            rerun=plan.to_data(),
            steps=seeds,
            actor=actor,
        )
        return dataclasses.replace(plan, run_id=new_id)

    # -- reading -------------------------------------------------------------------------------

    async def recipe_yaml(self, run_id: str) -> str:
        """The recipe YAML snapshotted into the run at submission.

        Raises:
            UnknownRunError: no run has this id.
        """
        text, _path, _inputs = await self._store.run_source(run_id)
        return text

    async def get(self, run_id: str) -> RunRecord:
        """The run with its finished steps and approvals.

        Raises:
            UnknownRunError: no run has this id.
        """
        return await self._store.get_run(run_id)

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
                `schedule` (fired by this schedule).
        """
        return await self._store.list_runs(_filter(which), limit=limit, before=before)

    async def count_runs(self, **which: Unpack[RunFilters]) -> int:
        """How many runs `list_runs` with the same filters gives, every page together."""
        return await self._store.count_runs(_filter(which))

    async def step_events(self, run_id: str, step_id: str) -> list[Event]:
        """The stored events of one step of the run, every visit, and of its loop items
        (whose step ids are ``step[0]``, ``step[1]``...), in order.

        Raises:
            UnknownRunError: no run has this id.
        """
        await self._store.head(run_id)
        return await self._store.step_events(run_id, step_id)

    async def history(self) -> History:
        """How far the stored runs go back, and how far pruning went."""
        from minions.runs._prune import history

        return await self._store.call(history, self._store.store)

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        """Stored events of the run after sequence number `after`, in order.

        Raises:
            UnknownRunError: no run has this id.
        """
        await self._store.head(run_id)
        return await self._store.events(run_id, after=after, limit=limit)

    def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The stored events after `after`, then new ones as they are stored, until the run
        has ended (a resumed run is followed to its new end).

        Raises:
            UnknownRunError: no run has this id.
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

        runs = await self._store.get_run(run_a), await self._store.get_run(run_b)
        return await diff_off_loop(*runs, max_values)

    def step_cache(self, *, clock: Callable[[], float] = time.time) -> StepCache:
        """The store's step cache (what durable runs use), for foreground runs to share it:
        ``AgentExecutor(settings=RunSettings(step_cache=store.step_cache()))``. `clock`: the
        time entries are made and expire by."""
        from minions.runs._cache import StoreStepCache

        return StoreStepCache(self._store, clock=clock)

    async def workers(self) -> list[WorkerRecord]:
        return await self._store.workers()

    async def endpoints(self, *, expiry: float | None = None) -> list[EndpointRecord]:
        """What model endpoints taught the structured-output ladder of the store's workers,
        learned within `expiry` seconds (the default of `Limits.capability_expiry`)."""
        from minions.models._limits import DEFAULT_CAPABILITY_EXPIRY
        from minions.runs._endpoints import capabilities

        kept = DEFAULT_CAPABILITY_EXPIRY if expiry is None else expiry
        found = await self._store.call(capabilities, self._store.store, since=time.time() - kept)
        return [
            EndpointRecord(
                base_url=c.base_url,
                model=c.model,
                rejected=tuple(sorted(c.rejected)),
                output_mode=c.worked,
                learned_at=c.learned_at,
                expires_at=c.learned_at + kept,
            )
            for c in found
        ]

    async def forget_endpoint(self, base_url: str, model: str | None = None) -> int:
        """Forget what an endpoint taught (every model it serves when `model` is ``None``):
        the next run through it discovers its structured-output mode again. How many
        endpoints were forgotten."""
        from minions.models._limits import base_url as normalized
        from minions.runs._endpoints import forget_capabilities

        return await self._store.call(
            forget_capabilities, self._store.store, normalized(base_url), model
        )

    # -- state changes -------------------------------------------------------------------------

    async def cancel(
        self, run_id: str, *, wait: float = 10.0, actor: str | None = None
    ) -> RunRecord:
        """Cancel the run: a queued one (or one whose worker died) at once; a running one at
        its next step boundary, its model calls cancelled. A worker that does not answer within
        `wait` seconds is fenced out and the run is ended here. Returns the run as it is then.
        `actor`: who cancels it (its terminal `RunFailed` event says so).

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run has ended already.
        """
        store = self._store.store
        record = await self._store.call(store.request_cancel, run_id, actor=actor)
        if await self._end_cancelled(run_id, "unheld", actor):
            await self._forget(run_id, record.attempt)
            return await self.get(run_id)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            found = await self._store.get_run(run_id, details=False)
            if found.terminal:
                return await self.get(run_id)
            await asyncio.sleep(0.1)
        await self._end_cancelled(run_id, "any", actor)
        return await self.get(run_id)

    async def _end_cancelled(self, run_id: str, when: Any, actor: str | None) -> bool:
        return await self._store.call(
            self._store.store.end_unheld,
            run_id,
            status="cancelled",
            error="cancelled",
            event=run_failed_row(run_id, "cancelled", actor),
            when=when,
            now=time.time(),
        )

    async def _forget(self, run_id: str, attempt: int) -> None:
        """Take the run's attempt out of DBOS's queue (best effort: a delivery of it finds the
        run ended and does nothing)."""
        from minions.runs._store import workflow_id

        try:
            queue = await self._dbos()
        except StoreError:
            return
        await self._store.call(queue.cancel, workflow_id(run_id, attempt))

    async def resume(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        """Queue a failed or cancelled run again: it goes on from its last completed step
        (and loop item). `actor`: who resumes it (its next `RunStarted` event says so).

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run did not fail and was not cancelled (or another caller
                resumed it first).
        """
        queue = await self._dbos()
        resumed = await self._store.call(
            self._store.store.requeue,
            run_id,
            statuses=("failed", "cancelled"),
            epoch=None,
            recovery=False,
            enqueue=queue.enqueue,
            actor=actor,
        )
        if resumed is None:
            status = (await self._store.get_run(run_id, details=False)).status
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
        actor: str | None = None,
    ) -> RunRecord:
        """Decide a call the run waits for (the only one when `call_id` is not given), as
        `actor` (the approval's `decided_by`, and its `ApprovalResolved` event's `actor`). A
        call is decided once: of concurrent decisions, one wins.

        Raises:
            UnknownRunError: no run has this id.
            RunStateError: the run waits for no approval, or for several and none was named,
                or the call was decided already.
        """
        record = await self.get(run_id)
        waiting = [a for a in record.approvals if a.decided_at is None]
        if call_id is None:
            if not waiting:
                past = [a for a in record.approvals if a.decided_at is not None]
                last = max(past, key=lambda a: a.decided_at or 0.0) if past else None
                told = (
                    ""
                    if last is None
                    else f" (call {last.call_id!r} was "
                    f"{'approved' if last.approved else 'rejected'} already)"
                )
                raise RunStateError(
                    f"run {run_id} is {record.status} and waits for no approval{told}",
                    status=record.status,
                )
            if len(waiting) > 1:
                calls = ", ".join(a.call_id for a in waiting)
                raise RunStateError(
                    f"run {run_id} waits for several calls; name one: {calls}",
                    status=record.status,
                )
            call_id = waiting[0].call_id
        decided = await self._store.call(
            self._store.store.decide,
            run_id,
            call_id,
            approved=approved,
            reason=reason,
            actor=actor,
        )
        if decided is not None:
            return await self.get(run_id)
        record = await self.get(run_id)
        known = {a.call_id: a for a in record.approvals}
        found = known.get(call_id)
        if found is not None and found.decided_at is not None:
            verdict = "approved" if found.approved else "rejected"
            raise RunStateError(
                f"call {call_id!r} of run {run_id} was {verdict} already", status=record.status
            )
        if record.terminal:
            raise RunStateError(
                f"run {run_id} is {record.status}: its calls wait no more", status=record.status
            )
        calls = ", ".join(a.call_id for a in record.approvals if a.decided_at is None)
        raise RunStateError(
            f"run {run_id} does not wait for call {call_id!r}; "
            + (f"it waits for {calls}" if calls else "it waits for no approval"),
            status=record.status,
        )

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
        replace: bool = False,
        actor: str | None = None,
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
            replace: a schedule of that name gets this recipe and timing (its slots go on
                from now); otherwise it is an error.
            actor: who adds it (its `changed_by`).

        Raises:
            RecipeError: the recipe, its ``schedule:``, the timing or the inputs are invalid.
            ScheduleExistsError: the name is taken and `replace` is False.
        """
        from pydantic import ValidationError

        from minions.recipes._loader import parse_spec, read_recipe_text
        from minions.recipes._schema import ScheduleSpec
        from minions.runs import _schedules

        path = await self._store.call(Path(recipe).resolve)
        text = await self._store.call(read_recipe_text, path)
        spec, _ = await self._store.call(parse_spec, text, file=str(path))
        given = {
            k: v
            for k, v in {
                "cron": cron,
                "every": None if every is None else _every_text(every),
                "name": name,
                "timezone": timezone,
                "catch_up": catch_up,
            }.items()
            if v is not None
        }
        base = spec.schedule.model_dump(exclude_unset=True) if spec.schedule else {}
        if "cron" in given or "every" in given:
            base.pop("cron", None)
            base.pop("every", None)
        elif spec.schedule is None:
            raise _schedule_problem(
                "the recipe has no `schedule:`: give a cron expression or an interval", path
            )
        merged = {**base, **given, "inputs": {**base.get("inputs", {}), **(inputs or {})}}
        try:
            schedule = ScheduleSpec.model_validate(merged)
        except ValidationError as exc:
            raise _schedule_problem(
                "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()), path
            ) from None
        snapshot = await self._snapshot(text, path, schedule.inputs)
        timing = _schedules.Timing(
            cron=schedule.cron,
            every=None if schedule.every is None else int(_seconds(schedule.every)),
            timezone=schedule.timezone,
        )
        row = _schedules.new_row(
            name=schedule.name or snapshot.recipe_id,
            recipe_id=snapshot.recipe_id,
            recipe_yaml=text,
            recipe_path=str(path),
            recipe_hash=snapshot.recipe_hash,
            request_hash=snapshot.request_hash,
            inputs=snapshot.inputs,
            timing=timing,
            catch_up=schedule.catch_up,
            now=time.time(),
            actor=actor,
        )
        await self._dbos()  # DBOS's tables exist before a worker's tick fires into them
        return await self._store.call(_schedules.save, self._store.store, row, replace=replace)

    async def schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""
        from minions.runs import _schedules

        return await self._store.call(_schedules.listed, self._store.store)

    async def schedule(self, name: str) -> ScheduleRecord:
        """The schedule (`list_runs(schedule=name)` lists its runs).

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        from minions.runs import _schedules

        return await self._store.call(_schedules.get, self._store.store, name)

    async def pause_schedule(self, name: str, *, actor: str | None = None) -> ScheduleRecord:
        """Stop firing the schedule until it is resumed (`actor`: who pauses it, its
        `changed_by`).

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        return await self._set_paused(name, paused=True, actor=actor)

    async def resume_schedule(self, name: str, *, actor: str | None = None) -> ScheduleRecord:
        """Fire the schedule again from its next slot (the slots of the pause do not fire);
        `actor`: who resumes it.

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        return await self._set_paused(name, paused=False, actor=actor)

    async def _set_paused(self, name: str, *, paused: bool, actor: str | None) -> ScheduleRecord:
        from minions.runs import _schedules

        return await self._store.call(
            _schedules.set_paused,
            self._store.store,
            name,
            paused=paused,
            now=time.time(),
            actor=actor,
        )

    async def remove_schedule(self, name: str, *, actor: str | None = None) -> None:
        """Remove the schedule; the runs it fired stay. `actor`: who removes it (said in the
        log: the row is gone).

        Raises:
            UnknownScheduleError: no schedule has this name.
        """
        from minions.runs import _schedules

        await self._store.call(_schedules.delete, self._store.store, name)
        log.info("schedule removed", schedule=name, actor=actor)

    # -- keys ----------------------------------------------------------------------------------

    async def add_key(
        self,
        name: str,
        *,
        role: str,
        projects: Sequence[str] = (),
        actor: str | None = None,
    ) -> tuple[KeyRecord, str]:
        """Add an API key named `name` with `role` (and `projects`): returns its record and
        the key itself, which is never stored (only its SHA-256 is) and cannot be shown again.
        `actor`: who adds it (recorded).

        Raises:
            ValueError: the name, role or a project is not valid.
            KeyExistsError: a key that is not revoked has this name.
        """
        from minions.runs import _keys

        made = await self._store.call(
            _keys.add, self._store.store, name, role=role, projects=projects, actor=actor
        )
        return made.record, made.key

    async def keys(self, *, revoked: bool = False) -> list[KeyRecord]:
        """The API keys that work (the revoked ones too, when `revoked`), by name."""
        from minions.runs import _keys

        return await self._store.call(_keys.listed, self._store.store, revoked=revoked)

    async def revoke_key(self, name: str, *, actor: str | None = None) -> KeyRecord:
        """Revoke the key of that name: its next request fails, and so do the event streams
        it opened.

        Raises:
            UnknownKeyError: no key that works has this name.
        """
        from minions.runs import _keys

        return await self._store.call(_keys.revoke, self._store.store, name, actor=actor)

    async def key_of(self, key: str) -> KeyRecord | None:
        """The key that works and is `key` (found by its hash), or None."""
        from minions.runs import _keys

        return await self._store.call(_keys.by_key, self._store.store, key)

    async def key_named(self, name: str) -> KeyRecord | None:
        """The key that works with this name, or None (a trusted proxy's user is the key of
        that name)."""
        from minions.runs import _keys

        return await self._store.call(_keys.by_name, self._store.store, name)

    async def key_by_id(self, key_id: str) -> KeyRecord | None:
        """The key that works with this id (`KeyRecord.id`), or None."""
        from minions.runs import _keys

        return await self._store.call(_keys.by_id, self._store.store, key_id)

    # -- retention -----------------------------------------------------------------------------

    async def prune(
        self,
        older_than: str | float,
        *,
        statuses: Sequence[str] = (),
        keep: int | None = None,
        dry_run: bool = False,
        actor: str | None = None,
    ) -> PruneResult:
        """Delete the finished runs (in one of `statuses`: default, every finished one) that
        finished over `older_than` ago (``30d``, or seconds), but the newest `keep`, with
        their steps, events, approvals and DBOS workflows; in batches, so workers go on
        meanwhile. An SQLite file then gives the freed space back. `actor`: who prunes
        (`history().pruned_by`).

        Raises:
            ValueError: `older_than` is not a duration, or a status is not a finished one.
        """
        from minions.runs._prune import prune

        seconds = _seconds(older_than) if isinstance(older_than, str) else float(older_than)
        return await self._store.call(
            prune,
            self._store.store,
            before=time.time() - seconds,
            statuses=tuple(statuses) or tuple(sorted(TERMINAL)),
            keep=keep,
            dry_run=dry_run,
            actor=actor,
        )


def _every_text(every: str | int) -> str:
    return f"{every}s" if isinstance(every, int) else every


def _seconds(text: str) -> float:
    from minions._text import duration_seconds

    return duration_seconds(text)


def _schedule_problem(message: str, path: Path) -> Exception:
    from minions.errors import Problem, RecipeError

    return RecipeError([Problem(message=message, file=str(path), field="schedule")])
