"""Durable runs: submit a recipe run to a store, let workers execute it, watch its events,
cancel, resume, approve.

A run is one DBOS workflow whose id is the run id; each finished step is a checkpoint, so a
run resumes after a crash from its last completed step. The store is SQLite by default
(``sqlite:///./.minions/minions.db``, or ``MINIONS_DATABASE_URL``) and Postgres for several
machines (``postgresql://...``). See docs/runs.md.

    store = RunStore()                               # MINIONS_DATABASE_URL or the default
    run_id, _ = await store.submit("recipe.yaml", {"n": 3})
    async for event in store.follow(run_id):          # stored events, then live ones
        print(event["kind"])
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions.errors import RunStateError
from minions.runs._store import (
    DEFAULT_URL,
    STATUSES,
    ApprovalRecord,
    RunRecord,
    StepRecord,
    Store,
    WorkerRecord,
)

if TYPE_CHECKING:
    from minions.runs._durable import Queue

__all__ = [
    "ApprovalRecord",
    "RunRecord",
    "RunStore",
    "StepRecord",
    "WorkerRecord",
    "database_url",
]

TERMINAL_KINDS = frozenset({"run_completed", "run_failed"})


def database_url(given: str | None = None) -> str:
    """`given`, else ``MINIONS_DATABASE_URL``, else ``sqlite:///./.minions/minions.db``."""
    return given or os.environ.get("MINIONS_DATABASE_URL") or DEFAULT_URL


class RunStore:
    """The runs of one database, as async operations (the CLI and the REST service use it).

    Args:
        url: the database (see `database_url`).
        create: make the database when it does not exist (submitting does; reading an
            unknown store is an error instead, and writes nothing).

    Raises:
        StoreError: the database cannot be reached, is not a minions store, or is newer.
    """

    def __init__(self, url: str | None = None, *, create: bool = False) -> None:
        self.url = database_url(url)
        self._store = Store(self.url, create=create)
        self._queue: Queue | None = None

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()
        self._store.close()

    def _dbos(self) -> Queue:
        """The DBOS queue (imported on first use: DBOS is heavy to import)."""
        if self._queue is None:
            from minions.runs._durable import Queue

            self._queue = Queue(self.url)
        return self._queue

    async def submit(
        self,
        recipe: str | Path,
        inputs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> tuple[str, bool]:
        """Queue a run of the recipe file; its YAML is snapshotted into the run. Returns the
        run id and whether it is new (False: `idempotency_key` named an earlier run).

        Raises:
            RecipeError: the recipe or the inputs are invalid (nothing is queued).
        """
        from minions.recipes._loader import read_recipe_text

        path = await asyncio.to_thread(Path(recipe).resolve)
        text = await asyncio.to_thread(read_recipe_text, path)
        return await self._queue_run(text, path, inputs, idempotency_key)

    async def submit_yaml(
        self,
        text: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        base: str | Path,
        idempotency_key: str | None = None,
    ) -> tuple[str, bool]:
        """Queue a run of recipe YAML given as text (the REST service's inline recipes): its
        tools modules and sub-recipes are found in folder `base`. Returns what `submit` does.

        Raises:
            RecipeError: the recipe or the inputs are invalid (nothing is queued).
        """
        from minions.recipes._loader import parse_spec

        folder = await asyncio.to_thread(Path(base).resolve)
        spec, _ = await asyncio.to_thread(parse_spec, text)
        return await self._queue_run(
            text, folder / f"{spec.id}.inline.yaml", inputs, idempotency_key
        )

    async def _queue_run(
        self,
        text: str,
        path: Path,
        inputs: Mapping[str, Any] | None,
        idempotency_key: str | None,
    ) -> tuple[str, bool]:
        """Check the recipe snapshot `text` (as the file `path`) and the inputs, store the run
        and queue it."""
        from minions.runs._runner import recipe_of

        built = await asyncio.to_thread(recipe_of, text, str(path))
        checked = built.check_inputs(dict(inputs or {}))
        run_id, created = await asyncio.to_thread(
            self._store.insert_run,
            run_id=uuid.uuid4().hex,
            recipe_id=built.id,
            recipe_yaml=text,
            recipe_path=str(path),
            recipe_hash=hashlib.sha256(text.encode()).hexdigest(),
            inputs=checked,
            idempotency_key=idempotency_key,
        )
        if created:
            await asyncio.to_thread(self._dbos().enqueue, run_id)
        return run_id, created

    async def recipe_yaml(self, run_id: str) -> str:
        """The recipe YAML snapshotted into the run at submission.

        Raises:
            UnknownRunError: no run has this id.
        """
        text, _path, _inputs = await asyncio.to_thread(self._store.run_source, run_id)
        return text

    async def get(self, run_id: str) -> RunRecord:
        """The run with its finished steps and approvals.

        Raises:
            UnknownRunError: no run has this id.
        """
        return await asyncio.to_thread(self._store.get_run, run_id)

    async def list_runs(
        self,
        *,
        status: str | None = None,
        recipe: str | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first (`before`: the created_at and run id of a page's last run)."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; one of: {', '.join(STATUSES)}")
        return await asyncio.to_thread(
            self._store.list_runs, status=status, recipe=recipe, limit=limit, before=before
        )

    async def events(
        self, run_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Stored events of the run after sequence number `after`, in order."""
        await self.get(run_id)
        return await asyncio.to_thread(self._store.events, run_id, after=after, limit=limit)

    async def follow(
        self, run_id: str, *, after: int = 0, poll: float = 0.1
    ) -> AsyncIterator[dict[str, Any]]:
        """The stored events after `after`, then new ones as they are stored, until the run's
        terminal event."""
        await self.get(run_id)
        last = after
        async with self._listener() as wait:
            while True:
                batch = await asyncio.to_thread(self._store.events, run_id, after=last, limit=500)
                for event in batch:
                    last = event["seq"]
                    yield event
                    if event["kind"] in TERMINAL_KINDS:
                        return
                if not batch:
                    await wait(run_id, poll)

    @contextlib.asynccontextmanager
    async def _listener(self) -> AsyncIterator[Callable[[str, float], Awaitable[None]]]:
        """A wait for a run's next events: LISTEN/NOTIFY on Postgres (a poll at most every
        second as a safety net), a short sleep on SQLite."""
        if not self.url.startswith(("postgresql://", "postgres://")):

            async def sleep(run_id: str, poll: float) -> None:
                await asyncio.sleep(poll)

            yield sleep
            return
        import psycopg

        connection = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        try:
            await connection.execute("LISTEN minions_events")

            async def notified(run_id: str, poll: float) -> None:
                async for note in connection.notifies(timeout=1.0):
                    if note.payload == run_id:
                        return

            yield notified
        finally:
            await connection.close()

    async def cancel(self, run_id: str, *, wait: float = 10.0) -> RunRecord:
        """Cancel the run: a queued one at once, a running one at its next step boundary (its
        model calls are cancelled). Returns the run as it is then.

        Raises:
            RunStateError: the run has ended already.
        """
        record = await self.get(run_id)
        if record.terminal:
            raise RunStateError(f"run {run_id} is {record.status}: there is nothing to cancel")
        await asyncio.to_thread(self._store.update_run, run_id, cancel_requested=True)
        await asyncio.to_thread(self._dbos().cancel, run_id)
        if record.status == "queued" or not await self._worker_alive(record.executor_id):
            await self._end_cancelled(run_id)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            record = await self.get(run_id)
            if record.terminal:
                return record
            await asyncio.sleep(0.1)
        await self._end_cancelled(run_id)
        return await self.get(run_id)

    async def _worker_alive(self, executor_id: str | None) -> bool:
        from minions.runs._durable import DEAD_AFTER

        if executor_id is None:
            return False
        workers = await asyncio.to_thread(self._store.workers)
        now = time.time()
        return any(
            w.executor_id == executor_id
            and w.stopped_at is None
            and now - w.heartbeat_at <= DEAD_AFTER
            for w in workers
        )

    async def _end_cancelled(self, run_id: str) -> None:
        """Write the terminal state of a run no worker is running."""
        import json

        from minions.events import RunFailed, event_to_json

        def end() -> None:
            store = self._store
            record = store.get_run(run_id, details=False)
            if record.terminal:
                return
            event = json.loads(event_to_json(RunFailed(run_id=run_id, error="cancelled")))
            event.update(seq=store.last_seq(run_id) + 1, timestamp=time.time())
            store.write(
                run_id,
                [event],
                run={"status": "cancelled", "finished_at": time.time(), "error": "cancelled"},
            )

        await asyncio.to_thread(end)

    async def resume(self, run_id: str) -> RunRecord:
        """Queue a failed or cancelled run again: it goes on from its last completed step.

        Raises:
            RunStateError: the run did not fail and was not cancelled.
        """
        record = await self.get(run_id)
        if record.status not in ("failed", "cancelled"):
            raise RunStateError(
                f"run {run_id} is {record.status}; only a failed or cancelled run resumes"
            )
        await asyncio.to_thread(
            self._store.update_run,
            run_id,
            status="queued",
            cancel_requested=False,
            finished_at=None,
            error=None,
        )
        await asyncio.to_thread(self._dbos().resume, run_id)
        return await self.get(run_id)

    async def approve(
        self,
        run_id: str,
        call_id: str | None = None,
        *,
        approved: bool = True,
        reason: str | None = None,
    ) -> RunRecord:
        """Decide a call the run waits for (the only one when `call_id` is not given).

        Raises:
            RunStateError: the run waits for no approval, or for several and none was named.
        """
        record = await self.get(run_id)
        waiting = [a for a in record.approvals if a.decided_at is None]
        if not waiting:
            raise RunStateError(f"run {run_id} is {record.status} and waits for no approval")
        if call_id is None:
            if len(waiting) > 1:
                calls = ", ".join(a.call_id for a in waiting)
                raise RunStateError(f"run {run_id} waits for several calls; name one: {calls}")
            call_id = waiting[0].call_id
        if call_id not in {a.call_id for a in waiting}:
            calls = ", ".join(a.call_id for a in waiting)
            raise RunStateError(
                f"run {run_id} does not wait for call {call_id!r}; it waits for {calls}"
            )
        await asyncio.to_thread(
            self._store.decide, run_id, call_id, approved=approved, reason=reason
        )
        return await self.get(run_id)

    async def workers(self) -> list[WorkerRecord]:
        return await asyncio.to_thread(self._store.workers)
