"""A worker's DBOS, quiet while idle: minions' queue is dequeued when something wakes the
worker (a run queued or queued again: `minions.runs._wake`; a place freed in it while its
last look left runs waiting for one) and at a rare look of its own, instead of DBOS's poll
of it every 50 ms; DBOS's other loops (its own queues, which minions does not use, its
background jobs and its schedules) look rarely.

DBOS offers no hook for this: a worker puts its dispatcher in place of DBOS's queue thread
for the time it runs (`installed`), and each dequeue is the one DBOS's queue thread makes
(its claim of the queue's next workflows, in one transaction, then their execution). The
statements an idle worker sends are counted by a test, so a DBOS release that changes
these loops is caught."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import structlog

if TYPE_CHECKING:
    from dbos import DBOS
    from dbos._queue import Queue as DBOSQueue

__all__: list[str] = []

log = structlog.get_logger(__name__)

LOOK_EVERY = float(os.environ.get("MINIONS_QUEUE_LOOK", "15"))
"""Seconds between a worker's looks at the queue when nothing woke it (a missed wake)."""
GAP = 0.05
"""Seconds a worker lets pass after a dequeue before the next that a submission asks for
(a place freed asks sooner: `FREED_GAP`; DBOS polled every 50 ms): the
wakes of a burst of submissions (each wakes every worker) are served by one dequeue, not one
each, which took SQLite's write lock from the submitters again and again (and with 20 ms,
W6b with the worker in the submitting process ran at 0.55-0.98x of polling)."""
FREED_GAP = 0.01
"""Seconds a worker lets pass, after a place freed while runs wait in the queue, before it
looks (within `GAP` of its last look): the places that free together are filled by one look.
With the `GAP` for these too, W6b's two workers ran 2 to 3.7 runs of their 8 at a time, and
about 0.86x as many runs a second."""
CLOSE_WAIT = 10.0
"""Seconds a stopping worker waits at most for a dequeue under way (its store may be away)."""
DBOS_LOOPS = 30.0
"""Seconds between the looks of DBOS's own loops (its internal queue, its background jobs,
its schedules): minions uses none of what they serve."""


class Dispatcher:
    """Dequeues minions' queue for a worker's DBOS when woken (`wake`), or every
    `look_every` seconds.

    Args:
        look_every: seconds between looks when nothing wakes it.
    """

    def __init__(self, *, look_every: float = LOOK_EVERY) -> None:
        self.look_every = look_every
        self.queue: DBOSQueue | None = None
        """minions' queue as this worker registered it (its concurrency, and the run that
        waits in it)."""
        self.dequeues = 0
        """Dequeues made (for tests)."""
        self._woken = threading.Event()
        self._more = True
        """Whether the last look may have left runs in the queue for want of a place here
        (it found this worker full, claimed all it had room for, or failed): a place that
        frees then brings a look. Set before each look, so a place freed during one counts."""
        self._closed = False
        self._looking = threading.Lock()
        """Held by a dequeue under way (`close` waits for it)."""
        self._dbos: DBOS | None = None
        self._room: int | None = None
        """The places the last dequeue had for runs (None: no limit)."""
        self._ending: set[str] = set()
        """The workflows whose runs ended here (their places are free), which DBOS may still
        count as running while it records their outcomes."""
        self._ending_lock = threading.Lock()
        self._freed = threading.Event()
        """Set when a place freed while runs may wait (cleared before each look)."""

    def wake(self) -> None:
        """Look at the queue now (a run was queued, a place freed). A submitter of a SQLite
        store may wake it before its transaction commits: the look's claim waits for its
        write lock (`_claiming`)."""
        self._woken.set()

    def place_freed(self, workflow: str | None = None) -> None:
        """A run here ended (`workflow`: the DBOS workflow of its attempt): look at the queue
        again soon (`FREED_GAP`) if the last look may have left runs waiting for a place.
        Otherwise the queue held none this worker had room for, and a run queued since wakes
        the worker itself (`wake`): a look would only take SQLite's write lock from the runs
        under way, once per run that ends.

        The place counts as free from now on, though DBOS counts the workflow as running
        until it has recorded its outcome (a transaction later): a look meanwhile found the
        worker full, and the place stayed empty until another run ended."""
        if self._more:
            if workflow is not None:
                with self._ending_lock:
                    self._ending.add(workflow)
            self._freed.set()
            self.wake()

    def close(self) -> None:
        """Stop dequeuing (the worker stops): a dequeue under way ends first (what it claimed
        reaches the worker, which hands it back as it drains), and none starts after. Without
        the wait, a dequeue that began before the stop claimed, once its drain had handed a
        run back, that very run again, in the stopping worker."""
        self._closed = True
        self._woken.set()
        self._freed.set()
        if self._looking.acquire(timeout=CLOSE_WAIT):
            self._looking.release()

    def settle(self, within: float) -> bool:
        """Wait (up to `within` seconds) until no workflow of the queue runs in this DBOS:
        the runs a drain handed back have recorded their outcomes. Whether none runs."""
        dbos, queue = self._dbos, self.queue
        if dbos is None or queue is None:
            return True
        deadline = time.monotonic() + within
        while dbos._active_workflows_set.count_for_queue(queue.name):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def run(self, stop: threading.Event, dbos: DBOS) -> None:
        """Dequeue until `stop` (DBOS's) is set or the dispatcher is closed."""
        self._dbos = dbos
        while not (stop.is_set() or self._closed):
            self._woken.wait(self.look_every)
            # Cleared before the look: a wake that comes during it brings another look.
            self._woken.clear()
            self._freed.clear()
            with self._looking:
                if stop.is_set() or self._closed or self.queue is None:
                    continue
                self._look(dbos, self.queue, stop=stop)
            if self._freed.wait(GAP):  # a place freed, and runs may wait for it
                stop.wait(FREED_GAP)

    def _look(self, dbos: DBOS, queue: DBOSQueue, *, stop: threading.Event) -> None:
        self._more = True
        try:
            claimed = self._dequeue(dbos, queue)
        except Exception as exc:  # the store is away: the next wake or look tries again
            if not stop.is_set():
                log.warning("could not look at the queue", error=str(exc).splitlines()[0])
            return
        room = self._room
        self._more = room is not None and claimed >= room

    def _dequeue(self, dbos: DBOS, queue: DBOSQueue) -> int:
        """What DBOS's queue thread does at each poll of a queue without partitions: claim
        the queue's next workflows up to this worker's room, then execute them."""
        from dbos._core import execute_dequeued_workflow
        from dbos._utils import GlobalParams, generate_uuid

        active = dbos._active_workflows_set
        running = active.count_for_queue(queue.name)
        if self._ending:
            with self._ending_lock:
                self._ending &= set(active.activeList())
                running = max(0, running - len(self._ending))
        limit = queue._worker_concurrency
        self._room = None if limit is None else limit - running
        if limit is not None and running >= limit:
            return 0  # a place that frees wakes the dispatcher
        self.dequeues += 1
        owner = generate_uuid()
        engine = dbos._sys_db.engine
        with _claiming(engine):
            claimed, _ = dbos._sys_db.start_queued_workflows(
                queue, GlobalParams.executor_id, GlobalParams.app_version, None, running,
                owner_xid=owner,
            )  # fmt: skip
        if not claimed:
            return 0
        found = {s["workflow_uuid"]: s for s in dbos._sys_db.get_workflow_statuses(claimed)}
        for workflow in claimed:
            try:
                status = found.get(workflow) or dbos._sys_db.get_workflow_status(workflow)
                if status is None:
                    raise RuntimeError(f"workflow {workflow} has no status")
                execute_dequeued_workflow(dbos, status, owner)
            except Exception as exc:
                log.error("could not start a dequeued run", workflow=workflow, error=str(exc))
        return len(claimed)


_CLAIMING = threading.local()
_SERIALIZED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()


@contextlib.contextmanager
def _claiming(engine: sa.Engine) -> Iterator[None]:
    """DBOS's claim of the queue's next workflows, made in this thread meanwhile, holds
    SQLite's write lock from its first statement. pysqlite begins a transaction at the first
    write: the claim read the queue's next runs, then flipped those still queued. Two workers
    claiming at once read the same runs, and the second flipped none: it claimed nothing
    while runs waited, took the queue for empty, and looked no more (in SERVICE's throughput,
    one of two workers ran 9 to 44 of the 300 runs). Postgres locks the rows it reads."""
    if engine.dialect.name != "sqlite":
        yield
        return
    if engine not in _SERIALIZED:
        sa.event.listen(engine, "begin", _begin_claim)
        _SERIALIZED.add(engine)
    _CLAIMING.on = True
    try:
        yield
    finally:
        _CLAIMING.on = False


def _begin_claim(connection: sa.Connection) -> None:
    if getattr(_CLAIMING, "on", False):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


_DISPATCHER: Dispatcher | None = None


def _queues(stop: threading.Event, dbos: DBOS) -> None:
    """In place of DBOS's queue thread: DBOS's own queues polled rarely, each in a thread
    of its own as DBOS does, and minions' queue dispatched by the worker's `Dispatcher`."""
    from dbos._queue import queue_worker_thread

    internal = {q.name: q for q in [dbos._registry.get_internal_queue(), *_internal(dbos)]}
    threads = []
    for queue in internal.values():
        queue._polling_interval_sec = max(queue._polling_interval_sec, DBOS_LOOPS)
        thread = threading.Thread(
            target=queue_worker_thread,
            args=(stop, dbos, queue),
            name=f"queue-worker-{queue.name}",
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    dispatcher = _DISPATCHER
    if dispatcher is not None:
        dispatcher.run(stop, dbos)
    else:
        stop.wait()
    for thread in threads:
        thread.join(timeout=10)


def _internal(dbos: DBOS) -> list[Any]:
    return list(dbos._registry.internal_queues())


@contextlib.contextmanager
def installed(dispatcher: Dispatcher) -> Iterator[None]:
    """Put `dispatcher` in place of DBOS's queue thread, and make DBOS's other loops look
    rarely, for a `DBOS.launch()` made meanwhile (and as long as that DBOS runs); put DBOS's
    back afterwards."""
    global _DISPATCHER
    import dbos._dbos as dbos_main
    import dbos._scheduler as dbos_schedules
    import dbos._workflow_commands as dbos_jobs

    names = vars(dbos_main)  # the module's names: `launch` looks `queue_thread` up there
    saved = (
        names["queue_thread"],
        dbos_jobs._BACKGROUND_JOBS_INTERVAL_SEC,
        dbos_schedules._STARTUP_FAST_POLL_DURATION_SEC,
    )
    _DISPATCHER = dispatcher
    names["queue_thread"] = _queues
    dbos_jobs._BACKGROUND_JOBS_INTERVAL_SEC = DBOS_LOOPS
    dbos_schedules._STARTUP_FAST_POLL_DURATION_SEC = 0.0
    try:
        yield
    finally:
        (
            names["queue_thread"],
            dbos_jobs._BACKGROUND_JOBS_INTERVAL_SEC,
            dbos_schedules._STARTUP_FAST_POLL_DURATION_SEC,
        ) = saved
        _DISPATCHER = None
