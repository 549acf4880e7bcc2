"""A seeded random driver of the run store's rooms with a crash injected between its writes
(tests/test_runs_store_faults.py).

Everything runs in this process, one operation at a time: `RunStore` (submit, cancel, resume,
rerun, prune, approve) and the worker's `RunExecutor` (a claim and its run to its end, or
until it waits for a person), both over a `FaultyDatabase`. Before a write transaction, in it
(rolled back) or after its commit, the database may "kill the process": that write and every
later one of the same process raise `Crashed`, and its tools do nothing more, as when the
process died there. The next operation is a new process (a fresh `FaultyDatabase` over the
same engine). A worker that died is taken over as a live worker would (its lease is read as
expired: the time is given, not waited for).

Every tool call of the recipe is a side effect as an outside system sees it (`World.effects`);
when it starts, the store is read (unfaulted) to say whether the call runs a step that was
already checkpointed (completed, or reused by a rerun): that must never happen.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from minions.errors import MinionsError
from minions.runs import RunStore
from minions.runs import _runs as runs
from minions.runs._async import AsyncDatabase
from minions.runs._db import Database
from minions.runs._events import run_failed_row
from minions.runs._queue import status_table
from minions.runs._runner import RunExecutor
from minions.runs._tables import HELD, TERMINAL, runs_table
from minions.tools import tool_context

STEPS = ("one", "gate", "two", "three")
"""The recipe's steps in order; `gate` waits for a person's decision."""

RECIPE = """\
id: effects
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - {id: one, tool: effect, params: {step: one}}
  - {id: gate, depends_on: [one], requires_approval: true, tool: effect, params: {step: gate}}
  - {id: two, depends_on: [gate], tool: effect, params: {step: two}}
  - {id: three, depends_on: [two], tool: effect, params: {step: three}}
"""

TOOLS = """\
from minions import tool

import store_faults_helpers


@tool
async def effect(step: str) -> str:
    \"\"\"A side effect, as an outside system sees it.\"\"\"
    return store_faults_helpers.effect(step)
"""

MAX_RECOVERIES = 5
"""As the worker's: a run taken over this often fails."""


class Crashed(Exception):
    """The process died here (injected): nothing after it happens."""


@dataclass
class World:
    """The outside world of one store: the side effects done, what was wrong about them,
    and the faults' dice."""

    database: Database
    """The store's database, unfaulted: what the world reads."""
    rng: random.Random
    rate: float = 0.0
    """The chance of a crash at each write transaction."""
    effects: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(run id, step): calls done."""
    wrong: list[str] = field(default_factory=list)
    crashes: Counter[str] = field(default_factory=Counter)
    """Run id: crashes of a worker running it (each may do a step's effect once more)."""
    injected: Counter[str] = field(default_factory=Counter)
    """Where crashes were injected (before, in, after a write)."""
    process: Process | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fault(self) -> str | None:
        with self.lock:
            if self.rate and self.rng.random() < self.rate:
                return self.rng.choice(("before", "in", "after"))
        return None


WORLD: World | None = None
"""The world the recipe's tools act on (one test at a time)."""


@dataclass
class Process:
    """A process using the store: it dies once (`die`), and then does nothing more."""

    world: World
    dead: bool = False

    def die(self, where: str) -> None:
        self.dead = True
        self.world.injected[where] += 1
        raise Crashed(where)

    def check(self) -> None:
        if self.dead:
            raise Crashed("dead")


def effect(step: str) -> str:
    """A tool call's side effect (see the module's docstring)."""
    world = WORLD
    context = tool_context()
    assert world is not None
    assert context is not None
    assert world.process is not None
    world.process.check()  # a dead process calls nothing
    with world.database.read() as db:
        done = db.execute(
            sa.text(
                "SELECT status FROM minions_steps WHERE run_id = :run AND step_id = :step "
                "AND status IN ('completed', 'reused')"
            ),
            {"run": context.run_id, "step": step},
        ).first()
    if done is not None:
        world.wrong.append(f"run {context.run_id}: step {step} ran again, after it was {done[0]}")
    world.effects[(context.run_id, step)] += 1
    return f"{step} done"


class FaultyDatabase(Database):
    """The database seen by one process of the world: a write may kill the process."""

    def __init__(self, database: Database, process: Process) -> None:
        self.__dict__.update(database.__dict__)  # the same engine and write turns
        self.process = process
        self.inside = threading.local()

    @contextmanager
    def _faulted(self, opened: Any) -> Iterator[sa.Connection]:
        self.process.check()
        if getattr(self.inside, "yes", False):  # SQLite's `statement` is a `begin`
            with opened as db:
                yield db
            return
        where = self.process.world.fault()
        if where == "before":
            self.process.die(where)
        self.inside.yes = True
        try:
            with opened as db:
                yield db
                if where == "in":  # rolled back
                    self.process.die(where)
        finally:
            self.inside.yes = False
        if where == "after":  # committed; the caller never learns it
            self.process.die(where)

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        with self._faulted(Database.begin(self)) as db:
            yield db

    @contextmanager
    def statement(self) -> Iterator[sa.Connection]:
        with self._faulted(Database.statement(self)) as db:
            yield db

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        self.process.check()
        with Database.read(self) as db:
            yield db


@dataclass
class Submitted:
    key: str
    run_id: str | None = None
    """Its run, once a submission of it answered."""


@dataclass
class Driver:
    """Random operations on one store (see the module's docstring)."""

    store: RunStore
    world: World
    recipe: Path
    rng: random.Random
    journal: list[str] = field(default_factory=list)
    submitted: list[Submitted] = field(default_factory=list)
    reruns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """A rerun's id: the steps it reuses."""
    pruned: set[str] = field(default_factory=set)
    incarnations: int = 0
    threads: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(4))
    """The workers' store threads (what a dead worker's tasks still try fails)."""

    # -- processes ---------------------------------------------------------------------------

    def _process(self) -> Process:
        process = Process(self.world)
        self.world.process = process
        return process

    def _client(self) -> None:
        """The next client call is a new process's."""
        self.store._database.database = FaultyDatabase(self.world.database, self._process())

    async def _ids(self, *statuses: str) -> list[str]:
        with self.world.database.read() as db:
            query = sa.select(runs_table.c.run_id).order_by(runs_table.c.created_at)
            if statuses:
                query = query.where(runs_table.c.status.in_(statuses))
            return [r.run_id for r in db.execute(query)]

    def _pick(self, ids: list[str]) -> str | None:
        return self.rng.choice(ids) if ids else None

    # -- operations --------------------------------------------------------------------------

    async def step(self) -> None:
        kind = self.rng.choice(
            (
                "submit",
                "submit",
                "retry",
                "claim",
                "claim",
                "claim",
                "take_over",
                "cancel",
                "resume",
                "rerun",
                "prune",
                "approve",
            )
        )
        self._client()
        try:
            said = await getattr(self, kind)()
        except Crashed as exc:
            said = f"crashed {exc}"
        except MinionsError as exc:  # refused: the state moved on (a compare-and-set lost)
            said = f"refused: {type(exc).__name__}"
        self.journal.append(f"{kind}: {said}")

    async def submit(self, key: str | None = None) -> str:
        if key is None:
            key = f"k{len(self.submitted)}-{self.rng.randrange(10**9)}"
            self.submitted.append(Submitted(key))
        run_id, new = await self.store.submit(self.recipe, {"tag": key}, idempotency_key=key)
        for submission in self.submitted:
            if submission.key == key:
                if submission.run_id not in (None, run_id, *self.pruned):
                    self.world.wrong.append(f"key {key}: run {run_id}, and {submission.run_id}")
                submission.run_id = run_id
        return f"{run_id} {'new' if new else 'known'}"

    async def retry(self) -> str:
        """A submission tried again with its key (its first try may have died)."""
        if not self.submitted:
            return await self.submit()
        return await self.submit(self.rng.choice(self.submitted).key)

    async def claim(self, run_id: str | None = None) -> str:
        """A worker process claims a queued run and runs it: to its end, until it waits for
        a person (the worker then dies), or until it dies."""
        run_id = run_id or self._pick(await self._ids("queued"))
        if run_id is None:
            return "nothing queued"
        record = await self.store.get(run_id)
        process = self._process()
        self.incarnations += 1
        database = AsyncDatabase(FaultyDatabase(self.world.database, process), patient=True)
        database._pool = self.threads
        runner = RunExecutor(
            database,
            executor_id="w",
            incarnation=f"w{self.incarnations}",
            cancel_poll=0.01,
        )
        task = asyncio.ensure_future(runner.execute(run_id, record.attempt))
        while not task.done():
            await asyncio.wait({task}, timeout=0.01)
            if not task.done() and (await self.store.get(run_id)).status == "waiting":
                break
        if not task.done():  # it waits for a person: its worker dies meanwhile
            process.dead = True
            task.cancel()
            await asyncio.wait({task})
            return f"{run_id} waits"
        failed = task.exception()
        if failed is not None:
            if process.dead:
                self.world.crashes[run_id] += 1
                return f"{run_id} crashed"
            if isinstance(failed, MinionsError):
                return f"{run_id} {type(failed).__name__}"
            raise failed
        return f"{run_id} {(await self.store.get(run_id)).status}"

    async def take_over(self, now: float | None = None) -> str:
        """A live worker takes over the runs of dead ones (their leases read as run out)."""
        database = self.store._database.database
        queue = await self.store._dbos()
        now = time.time() + 3600 if now is None else now
        taken = []
        for expired in runs.expired(database, now):
            run_id = expired.run_id
            if expired.recoveries >= MAX_RECOVERIES:
                runs.end_unheld(
                    database,
                    run_id,
                    status="failed",
                    error="given up",
                    event=run_failed_row(run_id, "given up"),
                    when="unheld",
                    now=now,
                )
                continue
            if runs.requeue(
                database,
                run_id,
                statuses=HELD,
                epoch=expired.epoch,
                recovery=True,
                enqueue=queue.enqueue,
            ):
                taken.append(run_id)
        return f"took over {taken}"

    async def cancel(self) -> str:
        run_id = self._pick(await self._ids("queued", "running", "waiting"))
        if run_id is None:
            return "nothing to cancel"
        return f"{run_id} {(await self.store.cancel(run_id, wait=0)).status}"

    async def resume(self) -> str:
        run_id = self._pick(await self._ids("failed", "cancelled"))
        if run_id is None:
            return "nothing to resume"
        return f"{run_id} {(await self.store.resume(run_id)).status}"

    async def rerun(self) -> str:
        run_id = self._pick(await self._ids(*TERMINAL))
        if run_id is None:
            return "nothing to rerun"
        parent = await self.store.get(run_id)
        finished = {s.step_id for s in parent.steps if s.status in ("completed", "reused")}
        plan = await self.store.rerun(run_id, from_step=self.rng.choice(STEPS))
        # A step the plan reuses but the parent did not finish (a rejected gate before the
        # step rerun from) has nothing to reuse: it runs in the rerun, as in its parent.
        self.reruns[plan.run_id] = tuple(s for s in plan.reused if s in finished)
        return f"{run_id} -> {plan.run_id} reusing {list(plan.reused)}"

    async def prune(self) -> str:
        before = set(await self._ids())
        ended = set(await self._ids(*TERMINAL))
        try:
            result = await self.store.prune(0, keep=self.rng.randrange(4))
        finally:
            # A prune that died in a later transaction (a batch, DBOS's rows) deleted the
            # runs of the ones it committed before: they are pruned, not lost.
            gone = before - set(await self._ids())
            self.pruned |= gone
            if gone - ended:
                self.world.wrong.append(f"prune deleted runs that had not ended: {gone - ended}")
        return f"{result.runs} pruned"

    async def approve(self) -> str:
        run_id = self._pick(await self._ids("waiting"))
        if run_id is None:
            return "nobody waits"
        approved = self.rng.random() < 0.8
        return f"{run_id} {(await self.store.approve(run_id, approved=approved)).status}"

    # -- the end -----------------------------------------------------------------------------

    async def settle(self) -> None:
        """Lift the faults; take over, approve and run until every run has ended."""
        self.world.rate = 0.0
        for _ in range(50):
            self._client()
            await self.take_over()
            for run_id in await self._ids("waiting"):
                await self.store.approve(run_id)
            queued = await self._ids("queued")
            if not queued and not await self._ids("running", "waiting"):
                return
            for run_id in queued:
                self.journal.append(f"settle claim: {await self.claim(run_id)}")
        raise AssertionError("the runs did not settle:\n" + self.report())

    def report(self) -> str:
        return "\n".join(self.journal[-60:])


def problems(driver: Driver) -> list[str]:
    """What is wrong with the store and the world once the runs settled."""
    world, database = driver.world, driver.world.database
    found = list(world.wrong)
    with database.read() as db:
        rows = {r.run_id: r for r in db.execute(sa.select(runs_table))}
        # No lost run: each submission that answered has its run (or pruned it).
        for submission in driver.submitted:
            gone = submission.run_id not in rows and submission.run_id not in driver.pruned
            if submission.run_id is not None and gone:
                found.append(f"key {submission.key}: its run {submission.run_id} is gone")
        keys = Counter(r.idempotency_key for r in rows.values() if r.idempotency_key)
        found += [f"key {k}: {n} runs" for k, n in keys.items() if n > 1]
        # Settled: every run ended.
        found += [f"run {i} is {r.status}" for i, r in rows.items() if r.status not in TERMINAL]
        # Prune leaves no orphans: nothing of a run that is gone, in minions' tables or DBOS'.
        for table in ("minions_steps", "minions_events", "minions_approvals"):
            orphans = db.execute(
                sa.text(
                    f"SELECT DISTINCT run_id FROM {table} WHERE run_id NOT IN "
                    "(SELECT run_id FROM minions_runs)"
                )
            ).all()
            found += [f"{table} keeps rows of run {o.run_id}, which is gone" for o in orphans]
        workflows = {
            r[0]
            for r in db.execute(
                sa.text(f"SELECT workflow_uuid FROM {status_table(database.postgres)}")
            )
        }
        for run_id in driver.pruned:
            left = [w for w in workflows if w == run_id or w.startswith(f"{run_id}-")]
            found += [f"DBOS keeps workflow {w} of pruned run {run_id}" for w in left]
        # Each run's log: numbered without a gap up to its head, ending with its end.
        for run_id, row in rows.items():
            seqs = [
                (s.seq, s.kind)
                for s in db.execute(
                    sa.text(
                        "SELECT seq, kind FROM minions_events WHERE run_id = :run ORDER BY seq"
                    ),
                    {"run": run_id},
                )
            ]
            if [s for s, _ in seqs] != list(range(1, row.last_seq + 1)):
                found.append(f"run {run_id}: events {[s for s, _ in seqs]}, head {row.last_seq}")
            elif not seqs or seqs[-1][1] not in ("run_completed", "run_failed"):
                found.append(f"run {run_id} ended ({row.status}) but its log does not")
            if row.status == "completed":
                steps = {
                    s.step_id: s.status
                    for s in db.execute(
                        sa.text("SELECT step_id, status FROM minions_steps WHERE run_id = :run"),
                        {"run": run_id},
                    )
                }
                for step in STEPS:
                    if steps.get(step) not in ("completed", "reused"):
                        found.append(f"run {run_id} completed without step {step}")
                    elif steps[step] == "completed" and not world.effects[(run_id, step)]:
                        found.append(f"run {run_id}: step {step} completed with no effect")
    # No duplicated side effect: a step's effect is done once, or once more for each crash of
    # a worker running it (between the effect and its checkpoint); a reused step never.
    for (run_id, step), count in world.effects.items():
        if count > 1 + world.crashes[run_id]:
            found.append(f"run {run_id}: step {step} ran {count} times")
        if step in driver.reruns.get(run_id, ()):
            found.append(f"rerun {run_id}: reused step {step} ran")
    return found
