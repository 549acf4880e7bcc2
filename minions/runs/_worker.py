"""A worker: DBOS's queue delivers runs to it, its heartbeat renews the leases of the runs it
holds, and it takes over the runs of workers that died (their leases ran out). It survives its
database: a restart, refused connections, a locked or full SQLite file pause it and its runs;
it goes on when the database is back."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import structlog
from dbos import DBOS

from minions import _logsetup
from minions._step.settings import RunSettings
from minions.errors import MinionsError, StoreError
from minions.events import RunRequeued, RunTakenOver
from minions.models import Limits
from minions.recipes._internal import RecipeFolder
from minions.runs import _decisions as decisions
from minions.runs import _leases as leases
from minions.runs import _runs as runs
from minions.runs import _workers as workers
from minions.runs._async import AsyncDatabase, transient
from minions.runs._audit import SYSTEM, Actor
from minions.runs._audit import entry as audit_entry
from minions.runs._audit import prune as prune_audit
from minions.runs._db import DEAD_AFTER, Database, describe, detail
from minions.runs._dispatch import DBOS_LOOPS, Dispatcher, installed
from minions.runs._events import run_failed_row
from minions.runs._limiter import StoreCapabilities, StoreLimiter
from minions.runs._log import LiveHub
from minions.runs._prune import Retention, audit_horizon, prune
from minions.runs._queue import (
    APP_VERSION,
    LEGACY_VERSION,
    QUEUE,
    WORKFLOW,
    Queue,
    attempt_of,
    client_url,
    workflow_id,
)
from minions.runs._runner import RunEndedError, RunExecutor, RunFailedError
from minions.runs._schedules import TICK as SCHEDULE_TICK
from minions.runs._schedules import Scheduler, next_due
from minions.runs._streams import DeltaPublisher
from minions.runs._tables import ACTIVE, HELD
from minions.runs._wake import Listener, Wake
from minions.runs._workers import HEARTBEAT

__all__ = ["Worker", "WorkerConflictError"]

log = structlog.get_logger(__name__)

POLLING = 0.05
"""The polling interval minions' queue is registered with, for DBOS processes that poll it
(workers of minions before their queue was dispatched on wakes); a worker now dequeues when
woken (`minions.runs._dispatch`)."""
IDLE_BEAT = max(HEARTBEAT, DEAD_AFTER / 3)
"""Seconds between the heartbeats of a worker that holds no run: it only says it lives (a
worker that holds runs beats every `HEARTBEAT`, renewing their leases)."""
IDLE_TAKEOVER = DEAD_AFTER
"""Seconds between an idle worker's looks for dead workers' runs (a busy worker looks at
every heartbeat)."""
SCHEDULES_LOOK = 30.0
"""Seconds between a worker's looks at its store's schedules when none is due and nothing
woke it."""
PREFETCH = 1
"""Runs DBOS hands a worker beyond its concurrency: the next one waits in it, unclaimed, and
starts the moment a place frees, not at the queue's next poll (short runs otherwise leave
places idle between polls). While it waits, it is handed back to the queue as soon as another
worker has a place free (looked at every `HAND_BACK_AFTER`)."""
HAND_BACK_AFTER = float(os.environ.get("MINIONS_HAND_BACK_AFTER", "1.0"))
"""Seconds between a waiting run's looks for a worker with a place free."""
SLOT_LEASE = max(DEAD_AFTER, 15.0)
"""Seconds a model call's place under the limits stays taken without a heartbeat: the places
of a worker that was killed are free after this. Longer than a run's lease: a worker slow to
beat (a loaded machine) must not lose places its calls still use, or the limits would be
exceeded; a run taken over from a dead worker may wait that long for them."""
MAX_RECOVERIES = 50
"""A run taken over from dead workers this often fails instead (it may be what kills them)."""

GRACE = 30.0
"""Seconds a stopping worker lets the steps in flight finish before it hands their runs
back (`Worker(grace=)`, ``minions worker --grace``, ``MINIONS_WORKER_GRACE``)."""
AFTER_GRACE = 10.0
"""Seconds a stopping worker gives itself past the grace to hand its runs back (its store
may be away); what is still held then is let go, and taken over by a live worker."""

AUDIT_RETENTION = "365d"
"""How long a worker keeps the audit log's entries by default."""
RETENTION_EVERY = float(os.environ.get("MINIONS_RETENTION_EVERY", "60"))
"""Seconds between two prunes of a worker with a retention."""

WorkerState = Literal["starting", "running", "degraded", "stopped", "failed"]

_RUNNER: RunExecutor | None = None


@DBOS.workflow(name=WORKFLOW)
async def minions_run(run_id: str, attempt: int = 1) -> None:
    """One attempt of a run, from its last completed step (nothing when the attempt is stale,
    the run ended, or another worker holds it)."""
    if _RUNNER is None:
        raise RuntimeError("no minions worker in this process")
    if DBOS.workflow_id != workflow_id(run_id, attempt):
        # `dbos workflow fork` (a new workflow with the run's input): minions' runs are
        # steered by minions' commands; a fork would run the run a second time.
        raise ForkRefusedError(
            f"workflow {DBOS.workflow_id} is a fork of run {run_id}: minions does not run forks "
            f"(use `minions runs resume {run_id}`)"
        )
    await _RUNNER.execute(run_id, attempt)


def _taken_over(holder: str, by: str) -> Callable[[int], RunTakenOver]:
    """The event of a takeover (its attempt is known once it is queued)."""
    return lambda attempt: RunTakenOver(executor_id=holder, by=by, attempt=attempt)


def _adopted(version: str, by: str) -> Callable[[int], RunRequeued]:
    """The event of a run of an older durable format queued again under this one."""
    reason = f"queued by {version}, an older minions: this one runs it on"
    return lambda attempt: RunRequeued(attempt=attempt, reason=reason, by=by)


class ForkRefusedError(MinionsError):
    """A DBOS fork of a run's workflow: refused (DBOS records why)."""


class _RunEndsInOneLine(logging.Filter):
    """DBOS logs a traceback for each workflow that raises. A run that failed normally
    raises (so DBOS records its workflow as failed, with why), and that is no bug of
    anyone's: one line, the run's id and the cause. A crash of minions itself is logged with
    its traceback where it happens (the runner's "run crashed")."""

    def filter(self, record: logging.LogRecord) -> bool:
        # (A server process's log, `minions._logsetup`, keeps the exception as `exc_value`,
        # its traceback as text.)
        exc = record.exc_info[1] if record.exc_info else getattr(record, "exc_value", None)
        if isinstance(exc, RunFailedError | RunEndedError | ForkRefusedError):
            record.msg, record.args = str(exc), None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class WorkerConflictError(MinionsError):
    """Another live worker has this executor id."""


def _warm_up() -> None:
    with contextlib.suppress(Exception):
        from minions.models import OpenAIChatModel  # noqa: F401


def default_executor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Worker:
    """Runs queued runs until stopped (SIGINT or SIGTERM, or `stop()`).

    Args:
        url: the run store.
        concurrency: runs at a time in this worker.
        executor_id: its id (default: host, process and a random suffix). A worker started
            again with its id after a crash takes its runs back at once; while a worker with
            the id lives, another is refused (`WorkerConflictError`).
        settings: what its runs share (model, resolver, wrapper, tracer, MCP servers...).
        hub: where its runs' events go live (a service in the same process streams them).
        on_ready: called once the worker takes runs.
        retention: prune finished runs periodically, keeping those younger than a duration
            (``30d``) or the newest number of them (``1000 runs``); None keeps them all.
        audit_retention: prune the audit log's entries older than this duration
            periodically (default `AUDIT_RETENTION`, a year); None keeps them all.
        clock: the time now, for the schedules it fires (tests give their own).
        limits: limits per model endpoint and per project (`minions.models.Limits`), held
            over every worker of the store that is given them; its `capability_expiry` says
            how long what an endpoint taught the structured-output ladder is kept in the
            store.
        deps: makes the deps of a run (what its tools taking a `ToolContext` read as
            ``ctx.deps``): called each time a run starts or resumes in this worker. Deps are
            never stored with a run: each worker makes its own.
        recipes: the recipes root: each run's recipe file is found here by the recipe's id
            (its snapshot is what runs; the file's folder holds its tools modules, included
            recipes and recording), so hosts need not keep recipes at the same absolute path.
            None: at the path it was submitted from.
        project_recipes: the recipes roots of projects that have their own (their runs'
            recipe files are found there instead).
        grace: seconds a stopping worker (SIGTERM, Ctrl-C, `stop()`) lets the steps in
            flight finish: it claims nothing more at once, starts no new step, and hands
            each unfinished run back to the queue (in its place, to go on elsewhere from its
            checkpoints) once its steps in flight ended or the grace ran out. A second
            signal (or `stop(now=True)`) cuts the grace short.

    Raises:
        ValueError: `retention` is neither a duration nor a number of runs, `recipes` is
            not a folder, or `grace` is negative.
    """

    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 4,
        executor_id: str | None = None,
        settings: RunSettings | None = None,
        hub: LiveHub | None = None,
        on_ready: Callable[[Worker], None] | None = None,
        retention: str | None = None,
        audit_retention: str | None = AUDIT_RETENTION,
        clock: Callable[[], float] = time.time,
        limits: Limits | None = None,
        deps: Callable[[], object] | None = None,
        recipes: str | Path | None = None,
        project_recipes: Mapping[str, str | Path] | None = None,
        grace: float = GRACE,
    ) -> None:
        if grace < 0:
            raise ValueError(f"grace must be 0 or more seconds, not {grace}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        for folder in (recipes, *(project_recipes or {}).values()):
            if folder is not None and not Path(folder).is_dir():
                raise ValueError(f"recipes root: no such folder: {str(folder)!r}")
        self.url = url
        self.concurrency = concurrency
        self.executor_id = executor_id or default_executor_id()
        self.incarnation = uuid.uuid4().hex
        """This process's incarnation of the worker: the holder of the runs it takes."""
        self.database = Database(url, create=True)
        self.queue = Queue(url)
        database = AsyncDatabase(self.database, patient=True, threads=max(4, concurrency + 2))
        limits = limits if limits is not None else Limits()
        self.limiter = (
            StoreLimiter(database, limits, holder=self.incarnation, lease=SLOT_LEASE)
            if limits.endpoints
            else None
        )
        """Holds the model calls of its runs to the limits, over every worker of the store."""
        if self.limiter is not None:
            settings = dataclasses.replace(settings or RunSettings(), limiter=self.limiter)
        self.deltas = DeltaPublisher(url, origin=None if hub is None else hub.origin)
        """Sends its runs' token deltas to the followers of every process of the store."""
        self.runner = RunExecutor(
            database,
            executor_id=self.executor_id,
            incarnation=self.incarnation,
            settings=settings,
            hub=hub,
            deltas=self.deltas,
            lease=DEAD_AFTER,
            heartbeat=HEARTBEAT,
            capabilities=StoreCapabilities(
                database,
                expiry=limits.capability_expiry,
                demote_runs=limits.demote_after_runs,
            ),
            concurrency=concurrency,
            queue=self.queue,
            hand_back_after=HAND_BACK_AFTER,
            deps=deps,
            recipes=None if recipes is None else RecipeFolder(Path(recipes)),
            project_recipes={
                project: RecipeFolder(Path(folder))
                for project, folder in (project_recipes or {}).items()
            },
            project_limits=limits.projects,
        )
        self.project_limits = limits.projects
        """The limits per project it holds its runs to (and queues parked runs again by)."""
        self.on_ready = on_ready
        self.state: WorkerState = "starting"
        self.error: str | None = None
        """What is wrong while `state` is degraded or failed."""
        self.stranded: dict[str, list[str]] = {}
        """Runs of a newer minions format found when the worker started, by DBOS version."""
        self.retention = None if retention is None else Retention.parse(retention)
        self.audit_retention = None if audit_retention is None else audit_horizon(audit_retention)
        """Seconds the audit log's entries are kept (None: for ever)."""
        self.clock = clock
        self.grace = grace
        self.dispatcher = Dispatcher()
        """Dequeues the store's queue when woken, a place freed, or now and then."""
        self.runner.on_place_free = lambda run_id, attempt: self.dispatcher.place_freed(
            workflow_id(run_id, attempt)
        )
        self._stop = threading.Event()
        self._schedules_changed = threading.Event()
        self._checked: set[tuple[str, float]] = set()
        self._parked = threading.Event()
        """A run was parked here: its approval's deadlines are looked at."""
        self._deadline: float | None = 0.0
        """When the next approval deadline is due (None: none), as last read."""
        self._deadlines_look = 0.0
        self.runner.on_parked = self._parked.set
        self._next_takeover = 0.0

    def stop(self, *, now: bool = False) -> None:
        """Stop: claim nothing more, let the steps in flight finish within the grace, hand
        back what is left. Asked again (a second signal), or `now`: the grace is cut short."""
        if now or self._stop.is_set():
            self.runner.hurry()
        self._stop.set()

    def readiness(self) -> str | None:
        """Why this worker does not take runs now, or ``None`` when it does: it runs (its
        loop takes runs, its heartbeat reaches the store) and its store answers now with the
        schema this minions knows (one read; blocking). Said to anyone: no URL or host."""
        if self._stop.is_set() and self.state == "running":
            return "the worker is stopping"
        if self.state != "running":
            return f"the worker is {self.state}"
        from minions.runs._fleet import schema_problem

        try:
            return schema_problem(self.database)
        except Exception as exc:
            if transient(exc):
                return "the run store cannot be reached"
            return f"the run store cannot be read ({type(exc).__name__})"

    # -- running -------------------------------------------------------------------------------

    def run(self, *, handle_signals: bool = True) -> None:
        """Take runs until stopped.

        Raises:
            WorkerConflictError: a live worker has this executor id.
            StoreError: the store cannot be used.
        """
        global _RUNNER
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, lambda *_: self.stop())
        try:
            self._take_the_id()
        except Exception as exc:
            self.state = "failed"
            if not transient(exc):
                raise
            # Locked for longer than its busy timeout, its disk full, its server gone: said
            # as the store's opening says it, not as a traceback.
            raise StoreError(
                f"cannot use the run store {describe(self.url)!r}: {detail(exc)}"
            ) from None
        except BaseException:
            self.state = "failed"
            raise
        _RUNNER = self.runner
        dbos_log = logging.getLogger("dbos")
        dbos_log.setLevel(logging.WARNING)
        if not any(isinstance(f, _RunEndsInOneLine) for f in dbos_log.filters):
            dbos_log.addFilter(_RunEndsInOneLine())
        quiet = contextlib.ExitStack()
        DBOS(
            config={
                "name": "minions",
                "system_database_url": client_url(self.url),
                "executor_id": self.executor_id,
                "application_version": APP_VERSION,
                "log_level": "WARNING",
                "scheduler_polling_interval_sec": DBOS_LOOPS,
                # DBOS's flush of its own notifications (of workflow events and streams,
                # which minions does not use) woke every 10 ms: 0.5 % of a core, idle.
                "notification_coalesce_sec": 1.0,
            }
        )
        background: list[threading.Thread] = []
        # It hears, too, which runs the followers of every process follow: the deltas of
        # the others are not sent.
        listener = Listener(
            self.url, self._woken, heard=self.deltas.listening, greeting=self.deltas.greeting
        )
        try:
            quiet.enter_context(installed(self.dispatcher))
            DBOS.launch()
            self.queue.client()  # before any transaction enqueues (see Queue.enqueue)
            self._register_queue()
            listener.start()
            self.deltas.start()
            self.dispatcher.wake()  # what was queued before it started
            self._adopt_other_versions()
            # The model client (openai and its types: seconds of imports) loads now, beside
            # the worker, rather than inside its event loop when the first run needs a model
            # (which stalled every run of the worker meanwhile).
            threading.Thread(target=_warm_up, name="minions-warm-up", daemon=True).start()
            background.append(
                threading.Thread(target=self._fire_schedules, name="minions-schedules")
            )
            if self.retention is not None or self.audit_retention is not None:
                background.append(threading.Thread(target=self._prune, name="minions-retention"))
            if self.project_limits:
                background.append(threading.Thread(target=self._unpark, name="minions-projects"))
            for thread in background:
                thread.start()
            self.state = "running"
            if self.on_ready is not None:
                self.on_ready(self)
            while not self._stop.wait(HEARTBEAT if self.runner.held else IDLE_BEAT):
                self._beat()
        except BaseException as exc:
            self.state, self.error = "failed", str(exc)
            raise
        finally:
            self._stop.set()
            self.dispatcher.close()  # nothing more is claimed, from now on
            listener.stop()
            if self.state in ("running", "degraded"):
                self._drain()
                # DBOS records each handed-back run's workflow as done, not cut short.
                self.dispatcher.settle(AFTER_GRACE)
            for thread in background:
                thread.join()
            if self.state != "failed":
                self.state = "stopped"
            # What it still runs (a drain cut short by its store) stops, then it lets go of
            # it: a live worker (or this one, restarted) takes it over from its checkpoint.
            DBOS.destroy(workflow_completion_timeout_sec=0)
            self.deltas.stop()
            quiet.close()
            with contextlib.suppress(Exception):
                leases.release(self.database, self.incarnation)
                workers.stopped(self.database, self.executor_id, incarnation=self.incarnation)
            _RUNNER = None
            self.queue.close()
            for restored, handler in previous.items():
                signal.signal(restored, handler)

    def _drain(self) -> None:
        """Let the runner drain (see `grace`), renewing its leases meanwhile."""
        loop = self.runner.loop
        if loop is None or loop.is_closed():
            return  # no run was ever delivered
        drained = asyncio.run_coroutine_threadsafe(self.runner.drain(self.grace), loop)
        if self.runner.held:
            log.info(
                "worker draining: no new run or step starts; runs in flight are handed back",
                executor_id=self.executor_id,
                grace=self.grace,
                runs=len(self.runner.held),
            )
        deadline = time.monotonic() + self.grace + AFTER_GRACE
        while True:
            try:
                drained.result(timeout=max(0.0, min(HEARTBEAT, deadline - time.monotonic())))
                return
            except concurrent.futures.TimeoutError:
                if time.monotonic() >= deadline:
                    drained.cancel()
                    log.warning(
                        "the worker could not hand its runs back in time; they are taken "
                        "over once their leases end",
                        executor_id=self.executor_id,
                    )
                    return
                self._beat()  # the leases of the runs still in flight
            except Exception:
                log.exception("draining the worker failed", executor_id=self.executor_id)
                return

    def _register_queue(self) -> None:
        """Register the store's queue with this worker's limit (its concurrency and the one
        run that waits, `PREFETCH`): its dispatcher dequeues up to it. Each worker runs at
        most its own `concurrency` at a time (its runner waits for a place before it claims,
        and hands a waiting run back when another worker has a place)."""
        self.dispatcher.queue = DBOS.register_queue(
            QUEUE, worker_concurrency=self.concurrency + PREFETCH, polling_interval_sec=POLLING
        )

    def _woken(self, what: Wake) -> None:
        if what == "queue":
            self.dispatcher.wake()
        else:
            self._schedules_changed.set()

    def _fire_schedules(self) -> None:
        """Fire the schedules' due slots (every worker on the store does; each slot fires
        once). The store is read when a slot is due, when a schedule changed, and every
        `SCHEDULES_LOOK` seconds; between, a tick only compares the clock with the next
        slot's time."""
        scheduler = Scheduler(self.database, self.queue.enqueue, clock=self.clock)
        due: float | None = 0.0
        look = 0.0
        while not self._stop.wait(SCHEDULE_TICK):
            self._sweep_approvals()
            changed = self._schedules_changed.is_set()
            if not changed and time.monotonic() < look and (due is None or self.clock() < due):
                continue
            self._schedules_changed.clear()
            try:
                scheduler.tick()
                due = next_due(self.database)
                look = time.monotonic() + SCHEDULES_LOOK
            except Exception as exc:  # the store is down: the slots wait, then catch up
                if not transient(exc):
                    log.exception("firing schedules failed", executor_id=self.executor_id)

    def _unpark(self) -> None:
        """Queue again the runs parked by their project's limits, as room frees (every
        worker with limits per project does; a run's claim checks the limits again)."""
        from minions.runs._project_limits import unpark

        while not self._stop.wait(SCHEDULE_TICK):
            try:
                unpark(self.database, self.project_limits, enqueue=self.queue.enqueue)
            except Exception as exc:  # the store is down: parked runs wait for it
                if not transient(exc):
                    log.exception("queuing parked runs failed", executor_id=self.executor_id)

    def _sweep_approvals(self) -> None:
        """Escalate and time out the calls of parked runs that are due (every worker does;
        each is done once). The store is read when one is due, when a run was parked here,
        and every `SCHEDULES_LOOK` seconds."""
        parked = self._parked.is_set()
        deadline = self._deadline
        if (
            not parked
            and time.monotonic() < self._deadlines_look
            and (deadline is None or self.clock() < deadline)
        ):
            return
        self._parked.clear()
        try:
            self._deadline = decisions.sweep(
                self.database, enqueue=self.queue.enqueue, now=self.clock(), by=self.executor_id
            )
            self._deadlines_look = time.monotonic() + SCHEDULES_LOOK
        except Exception as exc:  # the store is down: the deadlines wait, then are met
            if not transient(exc):
                log.exception("approval deadlines failed", executor_id=self.executor_id)

    def _prune(self) -> None:
        """Prune finished runs as `retention` says, and the audit log's entries as
        `audit_retention` does, now and then."""
        retention, horizon = self.retention, self.audit_retention
        while True:
            try:
                if retention is not None:
                    done = prune(
                        self.database,
                        before=self.clock() - (retention.older_than or 0.0),
                        keep=retention.keep,
                        actor=SYSTEM,
                        audit=audit_entry(
                            "history.prune",
                            "runs",
                            Actor(name=SYSTEM, address=self.executor_id),
                            retention=retention.describe(),
                        ),
                        audit_empty=False,
                    )
                    if done.runs:
                        log.info("runs pruned", runs=done.runs, executor_id=self.executor_id)
                if horizon is not None:
                    gone = prune_audit(
                        self.database,
                        before=self.clock() - horizon,
                        audit=audit_entry(
                            "audit.prune",
                            "audit",
                            Actor(name=SYSTEM, address=self.executor_id),
                            retention=f"{horizon:g}s",
                        ),
                    )
                    if gone:
                        log.info("audit pruned", entries=gone, executor_id=self.executor_id)
            except Exception as exc:
                if not transient(exc):
                    log.exception("pruning runs failed", executor_id=self.executor_id)
            if self._stop.wait(RETENTION_EVERY):
                return

    def _take_the_id(self) -> None:
        """Become the worker `executor_id`: refused while another incarnation of it lives;
        one that crashed is replaced, and its runs are let go at once."""
        database = self.database
        row = workers.registration(database, self.executor_id)
        if row is not None and row.stopped_at is None and row.incarnation:
            seen = row.heartbeat_at
            gone = row.host == socket.gethostname() and row.pid and not _pid_alive(row.pid)
            dead = time.time() - seen > DEAD_AFTER or gone
            deadline = time.monotonic() + DEAD_AFTER + HEARTBEAT
            while not dead and time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(min(HEARTBEAT / 2, 0.5))
                now_row = workers.registration(database, self.executor_id)
                if now_row is None or now_row.stopped_at is not None:
                    break
                if now_row.heartbeat_at > seen:
                    raise WorkerConflictError(
                        f"another worker with executor id {self.executor_id!r} is running "
                        f"(process {now_row.pid} on {now_row.host}, its last heartbeat "
                        f"{time.time() - now_row.heartbeat_at:.1f}s ago): stop it, or give "
                        "this one another --executor-id"
                    )
            else:
                # Its holder never stopped: it crashed, or it is silent (frozen, cut off, a
                # loaded machine) and stands down at its next heartbeat. Said, for whoever
                # wonders why an id in use was taken.
                log.warning(
                    "executor id taken from a worker that stopped beating",
                    executor_id=self.executor_id,
                    pid=row.pid,
                    host=row.host,
                    process_gone=bool(gone),
                    silent=round(time.time() - seen, 1),
                    dead_after=DEAD_AFTER,
                )
        if row is not None and row.incarnation:
            leases.release(database, row.incarnation)  # a crashed one: its runs go on here
        workers.register(
            database,
            self.executor_id,
            incarnation=self.incarnation,
            version=APP_VERSION,
            host=socket.gethostname(),
            pid=os.getpid(),
            places=self.concurrency,
        )

    def _beat(self) -> None:
        """Say this worker lives and renew its leases; take over the runs of dead workers.
        A database that cannot be used now degrades the worker until it is back."""
        try:
            started = time.monotonic()
            renewed = workers.heartbeat(
                self.database,
                self.executor_id,
                incarnation=self.incarnation,
                runs=list(self.runner.held),
                lease_until=time.time() + DEAD_AFTER,
            )
            if renewed is None:
                self._stand_down()
                return
            # Only the runs it still holds: one taken over while this worker was frozen is
            # not renewed, and its holder asks the store before its next tool call.
            self.runner.renewed(renewed, started + DEAD_AFTER)
            if self.limiter is not None:
                self.limiter.renew()  # its calls in flight keep their places
            if self.runner.held or time.monotonic() >= self._next_takeover:
                self._take_over()
                self._next_takeover = time.monotonic() + IDLE_TAKEOVER
        except Exception as exc:
            if not transient(exc):
                log.exception("worker heartbeat failed", executor_id=self.executor_id)
            if self.state != "degraded":
                log.warning("run store unavailable; the worker waits for it", error=str(exc))
            self.state, self.error = "degraded", str(exc).splitlines()[0] if str(exc) else "?"
            return
        if self.state == "degraded" or _logsetup.outage_said():
            # A library's record (DBOS's listener) may have said the store went while this
            # worker's own beats never failed (an outage between two idle beats): it is
            # back as soon as a beat reaches it, and the log says so.
            log.warning("run store back; the worker goes on", executor_id=self.executor_id)
        self.state, self.error = "running", None

    def _stand_down(self) -> None:
        """Another incarnation took this worker's id (this one was declared dead, or a
        second worker started with the id): stop without writing anything of its runs."""
        self.error = f"another worker took executor id {self.executor_id!r}; this one stood down"
        log.error(self.error)
        self.state = "failed"
        self._stop.set()

    def _take_over(self) -> None:
        """Queue anew the runs whose holder's lease ran out, and the queued runs a dead
        worker had taken from DBOS's queue but not yet claimed."""
        database, queue, me = self.database, self.queue, self.executor_id
        now = time.time()
        for expired in runs.expired(database, now):
            run_id = expired.run_id
            if expired.recoveries >= MAX_RECOVERIES:
                runs.end_unheld(
                    database,
                    run_id,
                    status="failed",
                    error=f"taken over from dead workers {expired.recoveries} times: given up",
                    event=run_failed_row(run_id, "taken over from dead workers too often"),
                    when="unheld",
                    now=now,
                )
                continue
            requeued = runs.requeue(
                database,
                run_id,
                statuses=HELD,
                epoch=expired.epoch,
                recovery=True,
                enqueue=queue.enqueue,
                event=_taken_over(expired.executor_id or "", me),
            )
            if requeued is not None:
                log.info("run taken over", run_id=run_id, attempt=requeued.attempt)
        dead = [
            w.executor_id
            for w in workers.listed(database)
            if w.executor_id != self.executor_id
            and (w.stopped_at is not None or now - w.heartbeat_at > DEAD_AFTER)
            and (w.executor_id, w.heartbeat_at) not in self._checked
        ]
        self._expire(now)
        if not dead:
            return
        pending = DBOS.list_workflows(
            status="PENDING",
            name=WORKFLOW,
            executor_id=dead,
            load_input=False,
            load_output=False,
        )
        found = {attempt_of(w.workflow_id) for w in pending}
        queued = runs.queued_attempts(database, [f.run_id for f in found])
        holders = {w.workflow_id: w.executor_id or "" for w in pending}
        for f in found:
            current = queued.get(f.run_id)
            if current is not None and current.attempt == f.attempt:
                runs.requeue(
                    database,
                    f.run_id,
                    statuses=("queued",),
                    epoch=current.epoch,
                    recovery=True,
                    enqueue=queue.enqueue,
                    event=_taken_over(holders.get(workflow_id(f.run_id, f.attempt), ""), me),
                )
        for worker in workers.listed(database):
            if worker.executor_id in dead:
                self._checked.add((worker.executor_id, worker.heartbeat_at))

    def _expire(self, now: float) -> None:
        """Delete the records of workers dead or stopped for longer than `workers.EXPIRY`
        whose queued runs were looked at (no write while there is none: this runs at every
        heartbeat of a busy worker)."""
        before = now - workers.EXPIRY
        old = [executor for executor, beat in self._checked if beat < before]
        if old:
            workers.expire(self.database, old, before=before)
            self._checked = {c for c in self._checked if c[1] >= before}

    def _adopt_other_versions(self) -> None:
        """Queue anew, under this format, the queued and unfinished runs that minions before
        the format had its own version left in DBOS (nobody alive runs them); say which runs
        belong to a newer format."""
        database, queue = self.database, self.queue
        alive = {w.executor_id for w in workers.listed(database) if w.alive}
        for workflow in DBOS.list_workflows(
            status=["ENQUEUED", "PENDING"], name=WORKFLOW, load_input=False, load_output=False
        ):
            version = workflow.app_version or "?"
            if version == APP_VERSION:
                continue
            if not LEGACY_VERSION.match(version):
                self.stranded.setdefault(version, []).append(workflow.workflow_id)
                continue
            if workflow.status == "PENDING" and workflow.executor_id in alive:
                continue  # an old worker runs it still
            queue.cancel(workflow.workflow_id)
            runs.requeue(
                database,
                attempt_of(workflow.workflow_id).run_id,
                statuses=ACTIVE,
                epoch=None,
                recovery=False,
                enqueue=queue.enqueue,
                event=_adopted(version, self.executor_id),
            )
