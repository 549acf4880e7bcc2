"""A worker's dispatcher looks at the queue again when one of its runs ends only if its last
look may have left runs waiting for a place there: with the queue empty at the last look, a
run queued since wakes the worker itself, and a look at each run's end only took SQLite's
write lock from the runs under way (W6a: about 45 us a step)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import dbos._core
import pytest
import sqlalchemy as sa

from minions.runs._dispatch import Dispatcher, _claiming


class FakeDBOS:
    """What a dequeue reads of DBOS: the runs this process runs of the queue, and its claim
    of the queue's next workflows, up to the room it is given."""

    def __init__(self, *, queued: int, running: int) -> None:
        self.queued = [f"run-{i}" for i in range(queued)]
        self.active = [f"active-{i}" for i in range(running)]
        """The workflows DBOS counts as running in this process."""
        self.claims = 0
        self.fail = False
        self._active_workflows_set = self
        self._sys_db = self
        self.engine = self
        self.dialect = SimpleNamespace(name="postgresql")

    @property
    def running(self) -> int:
        return len(self.active)

    def count_for_queue(self, name: str) -> int:
        return self.running

    def activeList(self) -> list[str]:  # DBOS names it so
        return list(self.active)

    def start_queued_workflows(self, queue: Any, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        if self.fail:
            raise OSError("the store is away")
        room = queue._worker_concurrency - kwargs.get("local_running_count", args[3])
        claimed, self.queued = self.queued[:room], self.queued[room:]
        self.active += claimed
        return claimed, None

    def get_workflow_statuses(self, claimed: list[str]) -> list[dict[str, str]]:
        return [{"workflow_uuid": w} for w in claimed]


class FakeQueue:
    name = "minions-runs"
    _worker_concurrency = 2


@pytest.fixture(autouse=True)
def _started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dbos._core, "execute_dequeued_workflow", lambda *_: None)


def look(dispatcher: Dispatcher, fake: FakeDBOS) -> None:
    dispatcher._look(cast(Any, fake), cast(Any, FakeQueue()), stop=threading.Event())


def woken(dispatcher: Dispatcher) -> bool:
    dispatcher._woken.clear()
    dispatcher.place_freed()
    return dispatcher._woken.is_set()


@pytest.mark.parametrize(
    ("queued", "running", "more"),
    [
        (0, 0, False),  # the queue was empty: nothing waits for a place
        (1, 0, False),  # it claimed the one run there, with room to spare
        (2, 0, True),  # it claimed all it had room for: more may wait
        (3, 1, True),  # one place, one claimed, one left waiting
        (1, 2, True),  # full: the run waits for a place here
    ],
)
def test_a_place_freed_brings_a_look_only_if_the_last_one_may_have_left_runs_waiting(
    queued: int, running: int, more: bool
) -> None:
    dispatcher, fake = Dispatcher(look_every=3600), FakeDBOS(queued=queued, running=running)
    look(dispatcher, fake)
    assert woken(dispatcher) is more
    assert len(fake.queued) == (queued - min(queued, max(0, 2 - running)))


def test_a_failed_look_and_a_look_under_way_count_as_runs_left_waiting() -> None:
    dispatcher, fake = Dispatcher(look_every=3600), FakeDBOS(queued=0, running=0)
    assert woken(dispatcher)  # before any look: what the queue holds is unknown
    look(dispatcher, fake)
    assert not woken(dispatcher)
    fake.fail = True
    look(dispatcher, fake)
    assert woken(dispatcher)  # the store was away: the queue was not seen
    fake.fail = False

    seen: list[bool] = []

    class During(FakeDBOS):
        def start_queued_workflows(self, queue: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(woken(dispatcher))  # a run ends while the look claims
            return super().start_queued_workflows(queue, *args, **kwargs)

    look(dispatcher, During(queued=0, running=0))
    assert seen == [True]


def test_a_place_freed_counts_as_free_while_dbos_records_its_run_s_outcome() -> None:
    """A run's execution ends (its place in the worker is free) before DBOS has recorded its
    workflow's outcome and stopped counting it: a look then still found the worker full, and
    the place stayed empty until another run ended (W6b's two workers ran 2 to 3.5 runs of 8
    at a time). The workflow whose place was freed is not counted while DBOS finishes it."""
    dispatcher, fake = Dispatcher(look_every=3600), FakeDBOS(queued=3, running=2)
    look(dispatcher, fake)
    assert (fake.claims, len(fake.queued)) == (0, 3)  # full: no claim made
    dispatcher.place_freed("active-1")  # its execution ended; DBOS still counts it
    look(dispatcher, fake)
    assert fake.active == ["active-0", "active-1", "run-0"]  # claimed into the place freed
    fake.active.remove("active-1")  # DBOS has recorded its outcome
    look(dispatcher, fake)
    assert fake.active == ["active-0", "run-0"]  # full: the ended one is not counted twice
    assert dispatcher._ending == set()


def test_a_claim_on_sqlite_holds_the_write_lock_from_its_first_read(tmp_path: Path) -> None:
    """DBOS's claim reads the queue's next workflows, then flips those still queued; pysqlite
    begins its transaction only at the write. Two workers claiming at once read the same runs
    and the second flipped none: it claimed nothing while runs waited, took the queue for
    empty and looked no more (in SERVICE's throughput one of two workers ran 9 of 300 runs).
    A claim the dispatcher makes holds the write lock from its first read; the engine's other
    transactions are left as they were."""
    path = tmp_path / "queue.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    # As DBOS's system database: a transaction begins (IMMEDIATE) at its first write.
    sa.event.listen(
        engine, "connect", lambda connection, _: setattr(connection, "isolation_level", "IMMEDIATE")
    )
    with engine.begin() as db:
        db.exec_driver_sql("PRAGMA journal_mode=WAL")
        db.exec_driver_sql("CREATE TABLE queue (id INTEGER PRIMARY KEY, status TEXT)")
        db.exec_driver_sql("INSERT INTO queue (status) VALUES ('ENQUEUED'), ('ENQUEUED')")

    def another_writer_can_write() -> bool:
        probe = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            return False
        finally:
            probe.close()

    def claim() -> bool:
        with engine.connect() as connection, connection.begin():
            connection.exec_driver_sql("SELECT id FROM queue WHERE status = 'ENQUEUED' LIMIT 1")
            locked_out = not another_writer_can_write()
            connection.exec_driver_sql("UPDATE queue SET status = 'PENDING' WHERE id = 1")
        return locked_out

    with _claiming(engine):
        assert claim()  # the read was made under the write lock
    assert not claim()  # outside a claim: as DBOS made it
    engine.dispose()
