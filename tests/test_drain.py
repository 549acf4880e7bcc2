"""A stopped worker drains (issue 36): real `minions worker` processes, and `minions serve`
with its worker in the process, on SQLite and Postgres.

SIGTERM (or Ctrl-C) stops the worker's claims at once; a 3 s tool step in flight finishes and
is checkpointed (its side effect done once), no new step starts, and the run is handed back
to the queue; the next worker goes on from the checkpoint. With ``--grace 0`` the step in
flight is cut short and handed back at once, and the run keeps its place in the queue ahead
of runs submitted after it. Side effects are counted in a ledger file; nothing waits on a
clock for ordering: every wait polls a state, a file or a process.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, cast

import httpx2
import pytest
from runs_helpers import (
    TOOLS,
    WorkerProcess,
    finished,
    ledger_entries,
    ledger_lines,
    minions,
    until,
    watched,
)
from service_helpers import ServerProcess, auth, read_stream_iter, server

from minions.events import Event, RunDraining, RunHandedBack, RunTakenOver
from minions.runs import RunStore

SLOW = """\
id: slow
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - {id: one, tool: mark, params: {run: "{{ inputs.tag }}", step: one, seconds: 3}}
  - {id: two, depends_on: [one], tool: mark, params: {run: "{{ inputs.tag }}", step: two}}
"""
QUICK = """\
id: quick
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - {id: one, tool: mark, params: {run: "{{ inputs.tag }}", step: one}}
"""


def recipes(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    (folder / "slow.yaml").write_text(SLOW)
    (folder / "quick.yaml").write_text(QUICK)
    return folder / "slow.yaml", folder / "quick.yaml"


async def in_flight(store: RunStore, run_id: str, step: str) -> None:
    """Wait until the run's tool call of `step` has started (its event is stored)."""

    async def started() -> bool:
        return any(
            e.kind == "tool_call_started" and e.step_id == step for e in await store.events(run_id)
        )

    for _ in range(1200):
        if await started():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the tool call of {step} never started")


Stopping = Literal["worker", "serve"]
"""What stops: `minions worker`, or `minions serve` with its worker in the process."""


@contextmanager
def stopping(
    how: Stopping, url: str, folder: Path, ledger: Path, *args: str, **env: str
) -> Iterator[WorkerProcess | ServerProcess]:
    """The process that takes the run, then is stopped: worker ``w1``, or a server."""
    if how == "worker":
        with watched(WorkerProcess(url, folder, "w1", ledger, *args, **env)) as process:
            yield process
    else:
        with server(folder, url, *args, LEDGER=str(ledger), **env) as serving:
            yield serving


async def stopped(
    worker: WorkerProcess | ServerProcess,
    signum: signal.Signals,
    release: tuple[RunStore, str, Path] | None = None,
) -> str:
    """Send `signum` to the worker, wait for it to exit by itself; its output. `release`:
    once the run's drain is stored, let its tool calls held at the gate end."""
    worker.process.send_signal(signum)
    if release is not None:
        store, run_id, gate = release
        for _ in range(1200):
            if "run_draining" in kinds(await store.events(run_id)):
                break
            await asyncio.sleep(0.05)
        gate.unlink()
    await until(lambda: worker.process.poll() is not None, within=60)
    assert worker.process.returncode == 0, worker.log.read_text()
    return worker.log.read_text()


def kinds(events: list[Event]) -> list[str]:
    return [e.kind if e.step_id is None else f"{e.kind} {e.step_id}" for e in events]


def quiet(output: str) -> None:
    """Nothing of asyncio's or Python's complaints at exit."""
    for noise in ("Task was destroyed", "Traceback", "was never awaited", "Unclosed", "Error"):
        assert noise not in output, output


@pytest.mark.parametrize("how", ["worker", "serve"])
async def test_a_step_in_flight_finishes_and_is_not_run_again(
    tmp_path: Path, url: str, how: Stopping
) -> None:
    slow, _ = recipes(tmp_path)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    try:
        run_id, _ = await store.submit(slow, {"tag": "a"})
        # Its tool call, after its 3 s and its effect, is held at a gate until the drain began:
        # it is surely in flight when SIGTERM comes, whatever the machine's load.
        gate = tmp_path / "gate"
        gate.touch()
        with stopping(
            how, url, tmp_path, ledger, MINIONS_WORKER_GRACE="25", GATE=str(gate)
        ) as first:
            await in_flight(store, run_id, "one")
            output = await stopped(first, signal.SIGTERM, release=(store, run_id, gate))
        quiet(output)
        # Its step in flight finished in the stopping worker, and nothing after it started.
        assert ledger_lines(ledger) == [("a", "one", f"{run_id}/one#1/one-call")]
        events = await store.events(run_id)
        assert kinds(events) == [
            "run_started",
            "step_started one",
            "tool_call_started one",
            "run_draining",
            "tool_call_completed one",
            "step_completed one",
            "run_handed_back",
        ]
        draining = next(e for e in events if isinstance(e, RunDraining))
        assert (draining.grace, draining.in_flight) == (25.0, ("one",))
        if how == "worker":
            assert draining.executor_id == "w1"
        back = next(e for e in events if isinstance(e, RunHandedBack))
        assert (back.reason, back.attempt, back.cut_short) == ("drain", 2, ())
        assert back.executor_id == draining.executor_id
        record = await store.get(run_id)
        assert (record.status, record.attempt) == ("queued", 2)
        assert [s.step_id for s in record.steps] == ["one"]

        with watched(WorkerProcess(url, tmp_path, "w2", ledger)):
            assert await finished(store, run_id) == "completed"
        # Step one was not run again: one side effect each.
        assert sorted(ledger_lines(ledger)) == [
            ("a", "one", f"{run_id}/one#1/one-call"),
            ("a", "two", f"{run_id}/two#1/two-call"),
        ]
        after = kinds(await store.events(run_id))[len(events) :]
        assert "step_started one" not in after
        # The CLI shows the drain in the run's log.
        shown = await asyncio.to_thread(minions, "runs", "events", run_id, "--database-url", url)
        assert shown.returncode == 0, shown.stderr
        assert "run_draining" in shown.stdout
        assert "run_handed_back" in shown.stdout
    finally:
        await store.aclose()


@pytest.mark.parametrize("how", ["worker", "serve"])
async def test_with_no_grace_a_run_is_handed_back_in_its_place(
    tmp_path: Path, url: str, how: Stopping
) -> None:
    slow, quick = recipes(tmp_path)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    try:
        gate = tmp_path / "gate"
        gate.touch()  # never opened: the step is in flight when the worker stops
        with stopping(
            how, url, tmp_path, ledger, "--grace", "0", "--concurrency", "1", GATE=str(gate)
        ) as first:
            run_id, _ = await store.submit(slow, {"tag": "a"})
            await in_flight(store, run_id, "one")
            # Submitted after it: the first waits in the worker for its place (unclaimed),
            # the others in the queue.
            later = [(await store.submit(quick, {"tag": t}))[0] for t in ("b", "c", "d")]
            output = await stopped(first, signal.SIGINT)
        quiet(output)
        events = await store.events(run_id)
        assert kinds(events)[-2:] == ["run_draining", "run_handed_back"]
        back = events[-1]
        assert isinstance(back, RunHandedBack)
        assert (back.reason, back.attempt, back.cut_short) == ("drain", 2, ("one",))
        # Nothing more was claimed or started by the stopping worker.
        for other in later:
            record = await store.get(other)
            assert record.status == "queued", record
            assert record.started_at is None, record
            assert "run_started" not in kinds(await store.events(other))

        # The next worker takes it before the runs submitted after it.
        second = WorkerProcess(url, tmp_path, "w2", ledger, "--concurrency", "1")
        with watched(second):
            statuses = [await finished(store, r) for r in (run_id, *later)]
        assert statuses == ["completed"] * 4
        for other in later:  # each says it started, handed back before that or not
            assert kinds(await store.events(other)).count("run_started") == 1
        order = [
            run
            for run, step, _, pid in ledger_entries(ledger)
            if step == "one" and pid == second.process.pid
        ]
        assert sorted(order) == ["a", "b", "c", "d"]
        # One place is taken at a time; the worker holds one more run waiting for it (the
        # first two in the queue's order): the run handed back is one of those.
        assert order.index("a") < 2, order
        assert [e.step_id for e in await store.events(run_id) if e.kind == "step_completed"] == [
            "one",
            "two",
        ]
    finally:
        await store.aclose()


async def test_a_run_taken_over_from_a_dead_worker_says_so(tmp_path: Path) -> None:
    slow, _ = recipes(tmp_path)
    ledger = tmp_path / "ledger.txt"
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = RunStore(url, create=True)
    try:
        run_id, _ = await store.submit(slow, {"tag": "a"})
        gate = tmp_path / "gate"
        gate.touch()  # never opened: the step is in flight when the worker dies
        first = WorkerProcess(url, tmp_path, "w1", ledger, GATE=str(gate))
        with watched(first):
            await in_flight(store, run_id, "one")
            first.kill()  # SIGKILL: no drain, its lease runs out
        with watched(WorkerProcess(url, tmp_path, "w2", ledger)):
            assert await finished(store, run_id) == "completed"
        events = await store.events(run_id)
        taken = [e for e in events if isinstance(e, RunTakenOver)]
        assert [(e.executor_id, e.by, e.attempt) for e in taken] == [("w1", "w2", 2)]
        # Said before the step in flight starts again, in the worker that took it over.
        starts = [e.seq for e in events if e.kind == "step_started" and e.step_id == "one"]
        assert starts[0] < taken[0].seq < starts[1]
    finally:
        await store.aclose()


LOOP = """\
id: looped
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - id: each
    loop: [1, 2, 3, 4, 5, 6]
    parallel: 2
    tool: mark
    params: {run: "{{ inputs.tag }}", step: "i{{ loop.item }}", seconds: 3}
"""


async def test_a_loop_step_s_items_in_flight_finish_and_no_new_item_starts(
    tmp_path: Path,
) -> None:
    recipes(tmp_path)
    (tmp_path / "loop.yaml").write_text(LOOP)
    ledger = tmp_path / "ledger.txt"
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = RunStore(url, create=True)
    try:
        run_id, _ = await store.submit(tmp_path / "loop.yaml", {"tag": "a"})
        gate = tmp_path / "gate"
        gate.touch()  # the items in flight end once the drain began
        first = WorkerProcess(url, tmp_path, "w1", ledger, GATE=str(gate))
        with watched(first):
            await in_flight(store, run_id, "each[1]")
            quiet(await stopped(first, signal.SIGTERM, release=(store, run_id, gate)))
        # The two items in flight finished; none started after the drain began.
        assert sorted(step for _, step, _ in ledger_lines(ledger)) == ["i1", "i2"]
        events = await store.events(run_id)
        assert kinds(events)[-1] == "run_handed_back"
        draining = next(e for e in events if isinstance(e, RunDraining))
        assert sorted(draining.in_flight) == ["each[0]", "each[1]"]
        back = events[-1]
        assert isinstance(back, RunHandedBack)
        assert back.cut_short == ()  # its items in flight finished
        started = [e.step_id for e in events if e.kind == "step_started"]
        assert started == ["each", "each[0]", "each[1]"]
        with watched(WorkerProcess(url, tmp_path, "w2", ledger)):
            assert await finished(store, run_id) == "completed"
        done = [step for _, step, _ in ledger_lines(ledger)]
        assert sorted(done) == [f"i{n}" for n in range(1, 7)]  # each item once
    finally:
        await store.aclose()


# -- `minions serve` with its worker drains the same way -----------------------------------------


def test_serve_refuses_grace_and_concurrency_without_its_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    for option, value in (("--grace", "5"), ("--concurrency", "2")):
        done = minions("serve", "--no-worker", option, value, "--database-url", url)
        assert done.returncode == 2, done.stderr
        assert f"{option}: --no-worker runs no worker in this process" in done.stderr


async def test_serve_ends_its_event_streams_whole_when_it_stops(tmp_path: Path) -> None:
    """A client streaming a run (the console) when `minions serve` gets SIGTERM: its stream
    ends whole at once, with nothing in the server's log (it used to hold the stop for the
    graceful timeout, then be cut with a traceback), and the worker drains as ever."""
    slow, _ = recipes(tmp_path)
    ledger = tmp_path / "ledger.txt"
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = RunStore(url, create=True)
    try:
        run_id, _ = await store.submit(slow, {"tag": "a"})
        gate = tmp_path / "gate"
        gate.touch()
        with server(tmp_path, url, LEDGER=str(ledger), GATE=str(gate)) as api:
            seen: list[str] = []

            def watch() -> None:
                with (
                    httpx2.Client(base_url=api.base, headers=auth(), timeout=60) as client,
                    client.stream("GET", f"/runs/{run_id}/events/stream") as response,
                ):
                    seen.extend(message["event"] for message in read_stream_iter(response))

            watching = asyncio.create_task(asyncio.to_thread(watch))
            await until(lambda: "tool_call_started" in seen)
            api.process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(watching, 60)  # ended by the server, whole
            gate.unlink()  # the drain lets the step finish, then hands the run back
            await until(lambda: api.process.poll() is not None, within=60)
        assert api.process.returncode == 0
        quiet(api.log.read_text())
        assert "run_completed" not in seen
        assert kinds(await store.events(run_id))[-1] == "run_handed_back"
    finally:
        await store.aclose()


def test_a_stopping_worker_s_dispatcher_lets_its_dequeue_under_way_end_and_starts_none() -> None:
    """A worker's stop closes its dispatcher before the drain: a dequeue under way then ends
    first (what it claimed reaches the draining worker), and none starts after. A dequeue
    that went on past the close claimed, once the drain had handed a run back, that run
    again, in the stopping worker (seen on SQLite, whose claims wait for its write lock)."""
    from minions.runs._dispatch import Dispatcher

    order: list[str] = []
    entered, release = threading.Event(), threading.Event()

    class Held(Dispatcher):
        def _dequeue(self, dbos: Any, queue: Any, *, writer: bool = False) -> int:
            order.append("dequeue")
            entered.set()
            release.wait(30)
            order.append("dequeued")
            return 0

    dispatcher = Held(look_every=60)
    dispatcher.queue = cast(Any, object())
    stop = threading.Event()
    dispatching = threading.Thread(target=dispatcher.run, args=(stop, cast(Any, object())))
    dispatching.start()
    try:
        dispatcher.wake()
        assert entered.wait(30)

        def close() -> None:
            dispatcher.close()
            order.append("closed")

        closing = threading.Thread(target=close)
        closing.start()
        for _ in range(600):  # its close has begun
            if dispatcher._closed:
                break
            time.sleep(0.05)
        release.set()
        closing.join(30)
        dispatcher.wake()  # after the close: no dequeue
        dispatching.join(30)
        assert not dispatching.is_alive()
        assert order == ["dequeue", "dequeued", "closed"]
    finally:
        release.set()
        stop.set()


async def test_a_second_signal_cuts_serve_s_drain_short(tmp_path: Path) -> None:
    """A second SIGTERM to `minions serve` while its worker drains, the server closed
    already, cuts the grace short as it does to `minions worker` (it used to kill the process
    there, mid-drain): the step in flight is cut, its run handed back, the exit clean."""
    slow, _ = recipes(tmp_path)
    ledger = tmp_path / "ledger.txt"
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = RunStore(url, create=True)
    try:
        run_id, _ = await store.submit(slow, {"tag": "a"})
        gate = tmp_path / "gate"
        gate.touch()  # never opened: the step would hold the drain for its whole grace
        with server(tmp_path, url, "--grace", "600", LEDGER=str(ledger), GATE=str(gate)) as api:
            await in_flight(store, run_id, "one")
            api.process.send_signal(signal.SIGTERM)

            def closed() -> bool:
                try:
                    httpx2.get(f"{api.base}/health/live", timeout=1)
                except httpx2.TransportError:
                    return True
                return False

            await until(closed)  # the server stopped; the worker drains
            api.process.send_signal(signal.SIGTERM)
            await until(lambda: api.process.poll() is not None, within=60)
        assert api.process.returncode == 0, api.log.read_text()
        quiet(api.log.read_text())
        back = (await store.events(run_id))[-1]
        assert isinstance(back, RunHandedBack)
        assert back.cut_short == ("one",)
    finally:
        await store.aclose()
