"""Faults injected into `minions worker` processes of the tests, by environment variable (this
folder goes first on their PYTHONPATH; nothing here is part of minions).

- ``HOLD_BEFORE_CLAIM=FILE``: a run handed to the worker waits, before the worker claims it,
  while FILE exists (touching ``FILE.reached`` first): the worker holds the run in DBOS's
  queue without having claimed it.
- ``HOLD_BEFORE_TOOL=FILE``: the first tool call of the process waits, before it starts, while
  FILE exists (touching ``FILE.reached`` first): a worker that holds a run and is about to
  start a side effect.
- ``HOLD_BEFORE_CHECKPOINT=FILE``: the first checkpoint the process writes waits, before its
  transaction, while FILE exists (touching ``FILE.reached`` first): a worker between a step's
  completion and its checkpoint.
- ``HOLD_IN_CHECKPOINT=FILE``: the first checkpoint the process writes waits inside its
  transaction, before its commit (its run's row locked), while FILE exists (touching
  ``FILE.reached`` first). On Postgres a checkpoint is one statement, its own transaction:
  here it is written in a transaction of several, as the worker's other writes are (a
  heartbeat renewing its runs' leases), so that one stands for them all.
- ``CLAIMS=FILE``: each claim of a run by the worker is a line of FILE (``claim TIME PID RUN
  EPOCH``), and the epoch of the lease is `EPOCH` in the run's tasks (the fault tests' ledger
  tool writes it beside each call).
- ``HOLD_LISTEN=FILE``: the worker's LISTEN connection (Postgres), once lost, waits before it
  connects again while FILE exists (touching ``FILE.reached`` first): a worker that does not
  listen yet when the database is back.
- ``STORE_DOWN=FILE``: while FILE exists, every read and write of the run store fails as
  when its database is gone (a Postgres restart); DBOS's own tables are spared.
- ``STATEMENTS=FILE``: every SQL statement the process's database engines send (DBOS's and
  minions' alike) is counted; SIGUSR1 writes the count so far to FILE.
- ``DISK_FULL=FILE``: while FILE exists, every write transaction of the run store fails as
  SQLite fails on a full disk (``database or disk is full``, at its commit: nothing of it is
  stored); reads go on. DBOS's own tables are spared.
"""

from __future__ import annotations

import os
from contextvars import ContextVar

EPOCH: ContextVar[int] = ContextVar("EPOCH", default=0)
"""The epoch of the lease under which the current run's task runs (with ``CLAIMS``)."""

if os.environ.get("HOLD_BEFORE_CLAIM"):
    import asyncio
    import pathlib
    import time
    from typing import Any

    from minions.runs import _runner

    _claim = _runner.RunExecutor._claim
    _hold = pathlib.Path(os.environ["HOLD_BEFORE_CLAIM"])

    def _wait() -> None:
        pathlib.Path(f"{_hold}.reached").touch()
        while _hold.exists():
            time.sleep(0.02)

    async def _held_claim(self: Any, run_id: str, attempt: int) -> Any:
        await asyncio.to_thread(_wait)
        return await _claim(self, run_id, attempt)

    _runner.RunExecutor._claim = _held_claim  # type: ignore[method-assign]

if os.environ.get("HOLD_BEFORE_TOOL"):
    import asyncio
    import pathlib
    import time
    from typing import Any

    from minions._step import tool_call

    _execute = tool_call.ToolCallExecutor.execute
    _before_tool = pathlib.Path(os.environ["HOLD_BEFORE_TOOL"])
    _held: list[bool] = []

    def _wait_before_tool() -> None:
        pathlib.Path(f"{_before_tool}.reached").touch()
        while _before_tool.exists():
            time.sleep(0.02)

    async def _held_execute(self: Any, call: Any) -> Any:
        if not _held:
            _held.append(True)
            await asyncio.to_thread(_wait_before_tool)
        return await _execute(self, call)

    tool_call.ToolCallExecutor.execute = _held_execute  # type: ignore[method-assign]

if os.environ.get("HOLD_BEFORE_CHECKPOINT"):
    import pathlib
    import time
    from typing import Any

    from minions.runs import _leases

    _unheld_append = _leases.append
    _before_checkpoint = pathlib.Path(os.environ["HOLD_BEFORE_CHECKPOINT"])
    _checkpoints_held: list[bool] = []

    def _held_append(database: Any, lease: Any, **kwargs: Any) -> None:
        if kwargs.get("checkpoint") is not None and not _checkpoints_held:
            _checkpoints_held.append(True)
            pathlib.Path(f"{_before_checkpoint}.reached").touch()
            while _before_checkpoint.exists():
                time.sleep(0.02)
        _unheld_append(database, lease, **kwargs)

    _leases.append = _held_append

if os.environ.get("HOLD_IN_CHECKPOINT"):
    import contextlib
    import pathlib
    import threading
    import time
    from collections.abc import Iterator
    from typing import Any

    from minions.runs import _db, _leases

    _begin_outside = _db.Database.begin
    _statement_outside = _db.Database.statement
    _append_outside = _leases.append
    _in_checkpoint = threading.local()
    _in_hold = pathlib.Path(os.environ["HOLD_IN_CHECKPOINT"])
    _held_inside: list[bool] = []

    @contextlib.contextmanager
    def _begin_holding(self: Any) -> Iterator[Any]:
        with _begin_outside(self) as db:
            yield db
            if getattr(_in_checkpoint, "on", False) and not _held_inside:
                _held_inside.append(True)
                pathlib.Path(f"{_in_hold}.reached").touch()
                while _in_hold.exists():
                    time.sleep(0.02)

    @contextlib.contextmanager
    def _statement_holding(self: Any) -> Iterator[Any]:
        if getattr(_in_checkpoint, "on", False) and not _held_inside:
            with _begin_holding(self) as db:
                yield db
            return
        with _statement_outside(self) as db:
            yield db

    def _append_marked(database: Any, lease: Any, **kwargs: Any) -> None:
        _in_checkpoint.on = kwargs.get("checkpoint") is not None
        try:
            _append_outside(database, lease, **kwargs)
        finally:
            _in_checkpoint.on = False

    _db.Database.begin = _begin_holding  # type: ignore[method-assign]
    _db.Database.statement = _statement_holding  # type: ignore[method-assign]
    _leases.append = _append_marked

if os.environ.get("CLAIMS"):
    import time
    from typing import Any

    from minions.runs import _leases, _runner

    _unrecorded_claim = _runner.RunExecutor._claim

    def _say_claim(line: str) -> None:
        with open(os.environ["CLAIMS"], "a") as claims:
            claims.write(line + "\n")
            claims.flush()
            os.fsync(claims.fileno())

    async def _recorded_claim(self: Any, run_id: str, attempt: int) -> Any:
        start = await _unrecorded_claim(self, run_id, attempt)
        if isinstance(start, _leases.Start):  # not a refusal
            EPOCH.set(start.lease.epoch)  # in the task that goes on to run the run
            _say_claim(f"claim {time.time()!r} {os.getpid()} {run_id} {start.lease.epoch}")
        return start

    _runner.RunExecutor._claim = _recorded_claim  # type: ignore[method-assign]

if os.environ.get("DISK_FULL"):
    import contextlib
    import pathlib
    import sqlite3
    from collections.abc import Iterator
    from typing import Any

    from minions.runs import _db

    _begin = _db.Database.begin
    _full = pathlib.Path(os.environ["DISK_FULL"])

    @contextlib.contextmanager
    def _begin_on_a_full_disk(self: Any) -> Iterator[Any]:
        with _begin(self) as db:
            yield db
            if _full.exists():  # the commit finds no room: everything is rolled back
                raise sqlite3.OperationalError("database or disk is full")

    _db.Database.begin = _begin_on_a_full_disk  # type: ignore[method-assign]

if os.environ.get("HOLD_LISTEN"):
    import pathlib
    import threading
    import time
    from typing import Any

    import psycopg

    _connect = psycopg.connect
    _listen_hold = pathlib.Path(os.environ["HOLD_LISTEN"])
    _listened: list[bool] = []

    def _connect_held_again(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "minions-wake":  # `minions.runs._wake.Listener`
            if _listened:
                pathlib.Path(f"{_listen_hold}.reached").touch()
                while _listen_hold.exists():
                    time.sleep(0.02)
            _listened.append(True)
        return _connect(*args, **kwargs)

    psycopg.connect = _connect_held_again

if os.environ.get("STORE_DOWN"):
    import contextlib
    import pathlib
    import sqlite3
    from collections.abc import Iterator
    from typing import Any

    from minions.runs import _db

    _down = pathlib.Path(os.environ["STORE_DOWN"])

    def _gone(opened: Any) -> Any:
        @contextlib.contextmanager
        def opened_unless_down(self: Any) -> Iterator[Any]:
            if _down.exists():
                raise sqlite3.OperationalError("unable to open database file")
            with opened(self) as db:
                yield db

        return opened_unless_down

    _db.Database.begin = _gone(_db.Database.begin)  # type: ignore[method-assign]
    _db.Database.read = _gone(_db.Database.read)  # type: ignore[method-assign]
    _db.Database.statement = _gone(_db.Database.statement)  # type: ignore[method-assign]


if os.environ.get("STATEMENTS"):
    import pathlib
    import signal
    import threading
    from typing import Any

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    _statements = [0]
    _counting = threading.Lock()

    @event.listens_for(Engine, "before_cursor_execute")
    def _count_statement(*_: Any) -> None:
        with _counting:
            _statements[0] += 1

    def _say_statements(*_: Any) -> None:
        pathlib.Path(os.environ["STATEMENTS"]).write_text(str(_statements[0]))

    signal.signal(signal.SIGUSR1, _say_statements)
