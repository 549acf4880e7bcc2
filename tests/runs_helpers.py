"""Durable runs in tests: a recipe whose tool steps append to a ledger (fsynced), and worker
processes (`minions worker`) against a store in a temporary folder."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from minions.runs import RunStore
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

TOOLS = '''\
import asyncio
import os

from minions import tool
from minions.tools import tool_context


def _append(line: str) -> None:
    with open(os.environ["LEDGER"], "a") as ledger:
        ledger.write(line + "\\n")
        ledger.flush()
        os.fsync(ledger.fileno())


@tool
async def mark(run: str, step: str, seconds: float = 0.0) -> str:
    """Append (run, step) to the ledger, after `seconds`."""
    if seconds:
        await asyncio.sleep(seconds)
    context = tool_context()
    key = context.idempotency_key if context is not None else "-"
    _append(f"{run} {step} {key} {os.getpid()}")
    if os.environ.get("PAUSE_AFTER_EFFECT"):
        await asyncio.sleep(float(os.environ["PAUSE_AFTER_EFFECT"]))
    gate = os.environ.get("GATE")
    while gate and os.path.exists(gate):  # held after its effect while the gate file exists
        await asyncio.sleep(0.02)
    return f"{run}:{step}"
'''

STEPS = ["one", "two", "three", "four", "five"]


def chain(seconds: float = 0.0, steps: list[str] = STEPS, agent: str | None = None) -> str:
    """Tool steps in a line, each marking the ledger; `agent` is an agent step instead, whose
    model is asked to mark the ledger through the same tool."""
    lines = ["id: ledger", "tools: [tools]", "inputs: {tag: {type: string}}", "steps:"]
    previous = None
    for step in steps:
        depends = f", depends_on: [{previous}]" if previous else ""
        if step == agent:
            lines.append(
                f'  - {{id: {step}{depends}, tools: [mark], goal: "mark run '
                f'{{{{ inputs.tag }}}} step {step}"}}'
            )
        else:
            lines.append(
                f"  - {{id: {step}{depends}, tool: mark, "
                f'params: {{run: "{{{{ inputs.tag }}}}", step: {step}, seconds: {seconds}}}}}'
            )
        previous = step
    return "\n".join(lines) + "\n"


def write_ledger_recipe(
    folder: Path, seconds: float = 0.0, name: str = "recipe.yaml", agent: str | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    path = folder / name
    path.write_text(chain(seconds, agent=agent))
    return path


def ledger_lines(path: Path) -> list[tuple[str, str, str]]:
    """The ledger's side effects: (run tag, step, idempotency key) each."""
    return [(run, step, key) for run, step, key, _ in ledger_entries(path)]


def ledger_entries(path: Path) -> list[tuple[str, str, str, int]]:
    """The ledger's side effects with the process that did each: (run tag, step, key, pid)."""
    if not path.exists():
        return []
    found = []
    # A line is whole once its newline is written: a worker may be writing the last one.
    for line in path.read_text().split("\n")[:-1]:
        run, step, key, pid = line.split(" ")
        found.append((run, step, key, int(pid)))
    return found


def marking_model(tool: str = "mark") -> FakeOpenAIServer:
    """The model of the agent steps of these recipes: asked to "mark run TAG step STEP", it
    calls `tool` with them; given the result, it answers in text. Every fourth request is
    refused with a 429 (tried again after 10 ms)."""
    count = itertools.count(1)
    lock = threading.Lock()

    def reply(request: FakeRequest) -> FakeReply:
        with lock:
            number = next(count)
        if number % 4 == 0:
            return FakeReply.rate_limit(retry_after=0.01)
        if request.last_message.get("role") == "tool":
            return FakeReply.text("marked")
        text = " ".join(str(m.get("content") or "") for m in request.messages)
        asked = re.search(r"mark run (\S+) step (\S+)", text)
        assert asked is not None, text
        return FakeReply.calls((tool, {"run": asked[1], "step": asked[2]}))

    return FakeOpenAIServer(reply)


def overlapping_server() -> FakeOpenAIServer:
    """A model server whose every request waits a little (0.2 s) for another to arrive:
    requests sent together are seen together (`max_in_flight`)."""
    arrived = threading.Condition()

    def reply(_: FakeRequest) -> FakeReply:
        with arrived:
            arrived.notify_all()
            arrived.wait(0.2)
        return FakeReply.text("done")

    return FakeOpenAIServer(reply)


def wait_stopped(pid: int, within: float = 60) -> None:
    """Wait until every thread of process `pid`, sent SIGSTOP, has stopped (or the process is
    gone). The signal stops a thread only when it next leaves the kernel: one in a system call
    (taking a file lock, an fsync) goes on until that call returns, so a process just sent
    SIGSTOP may still take a lock."""
    deadline = time.monotonic() + within
    while True:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            return
        states = []
        for task in tasks:
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended
        if all(state in "tTZX" for state in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not stop: its threads are {states}")
        time.sleep(0.001)


def holds_write_lock(url: str, pid: int) -> bool:
    """Whether process `pid` holds the write lock of the SQLite store `url` (Linux: its WAL
    write lock, byte 120 of the ``-shm`` file, in /proc/locks)."""
    try:
        shm = os.stat(f"{url.removeprefix('sqlite:///')}-shm")
    except FileNotFoundError:  # Postgres, or nobody has the SQLite file open
        return False
    device = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[3:7] == ["WRITE", str(pid), device, "120"]:
            return True
    return False


WORKER_ENV = {
    "MINIONS_WORKER_HEARTBEAT": "0.3",
    "MINIONS_WORKER_DEAD_AFTER": "2",
}


class WorkerProcess:
    """`minions worker` in a process of its own, ready to take runs."""

    args: tuple[str, ...] = ()
    """More arguments of its command (a subclass's)."""

    def __init__(
        self,
        url: str,
        folder: Path,
        executor_id: str,
        ledger: Path,
        *args: str,
        **env: str,
    ) -> None:
        self.url = url
        self.executor_id = executor_id
        self.log = folder / f"worker-{executor_id[:40]}-{time.monotonic_ns()}.log"
        environment = {**os.environ, **WORKER_ENV, "LEDGER": str(ledger), **env}
        # Faults injected by environment variables (tests/inject/sitecustomize.py).
        inject = str(Path(__file__).parent / "inject")
        environment["PYTHONPATH"] = os.pathsep.join(
            p for p in (inject, environment.get("PYTHONPATH")) if p
        )
        command = [
            sys.executable, "-m", "minions", "worker",
            "--database-url", url, "--executor-id", executor_id, "--concurrency", "4", *args,
            *self.args,
        ]  # fmt: skip
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=folder, env=environment, stdout=log, stderr=subprocess.STDOUT
            )
        self._ready()

    def _ready(self) -> None:
        if not self.started():
            raise RuntimeError(f"the worker exited: {self.log.read_text()}")

    def started(self) -> bool:
        """Wait until the worker takes runs (True) or exits (False)."""
        deadline = time.monotonic() + 60
        while "running queued runs" not in self.log.read_text():
            if self.process.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start: {self.log.read_text()}")
            time.sleep(0.05)
        return True

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        return stop_process(self.process)


def stop_process(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after 30 s; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@contextmanager
def worker(
    url: str, folder: Path, executor_id: str, ledger: Path, *args: str, **env: str
) -> Iterator[WorkerProcess]:
    """A worker process (`args`: more options of `minions worker`)."""
    with watched(WorkerProcess(url, folder, executor_id, ledger, *args, **env)) as process:
        yield process


@contextmanager
def watched(process: WorkerProcess) -> Iterator[WorkerProcess]:
    """`process`, stopped at the end; its log in the report of a test that fails."""
    try:
        yield process
    except BaseException:
        # What the worker said, in the failing test's report.
        print(f"--- log of worker {process.executor_id}:\n{process.log.read_text()[-4000:]}")
        raise
    finally:
        process.stop()


async def until(condition: Callable[[], bool], within: float = 60) -> None:
    """Wait for `condition` (polled): for things only the file system or another process
    can tell, such as a line in the ledger."""
    import asyncio

    for _ in range(int(within / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition never held")


async def completed(store: RunStore, run_id: str, step_id: str, within: float = 60) -> None:
    """Wait until the store keeps `step_id` of the run as completed: its checkpoint, not its
    side effect (a ledger line is written before its step ends, and a step cancelled between
    the two runs again when its run resumes)."""
    import asyncio

    for _ in range(int(within / 0.05)):
        record = await store.get(run_id)
        if any(s.step_id == step_id and s.status == "completed" for s in record.steps):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"step {step_id} of run {run_id} was never stored as completed")


async def finished(store: RunStore, run_id: str, within: float = 60) -> str:
    """The run's final status, waiting for it (by following its events to the end)."""
    import asyncio

    async def follow() -> None:
        async for _ in store.follow(run_id):
            pass

    try:
        await asyncio.wait_for(follow(), within)
    except TimeoutError:
        record = await store.get(run_id)
        events = await store.events(run_id)
        last = [(e.seq, e.kind, e.step_id) for e in events[-5:]]
        raise AssertionError(
            f"run {run_id} did not finish within {within}s: {record.status}, "
            f"worker {record.executor_id}, last events {last}"
        ) from None
    for _ in range(100):  # the terminal event and the status are written together
        record = await store.get(run_id)
        if record.terminal:
            return record.status
        await asyncio.sleep(0.05)
    return (await store.get(run_id)).status


SHORT = "id: short\nsteps:\n  - {id: now, tool: current_datetime}\n"
"""A recipe of one tool step (no model)."""


async def queued(url: str, folder: Path) -> str:
    """A run of `SHORT`, stored and queued in the store of `url` (made if need be): nobody
    runs it until the test does."""
    (folder / "short.yaml").write_text(SHORT)
    store = RunStore(url, create=True)
    try:
        run_id, _ = await store.submit(folder / "short.yaml")
    finally:
        await store.aclose()
    return run_id


def minions(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`minions ARGS...` in a process of its own (`env`: added to the environment)."""
    return subprocess.run(
        [sys.executable, "-m", "minions", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, **env},
    )


def insert_run(database: Any, run_id: str) -> None:
    """A queued run straight into a `Database` (no DBOS queue): for tests of the store
    itself."""
    from minions.runs import _runs
    from minions.runs._snapshot import RecipeSnapshot

    snapshot = RecipeSnapshot(recipe_id="x", yaml="", path=None, hash="-", request_hash="-")
    row = _runs.queued_row(snapshot, run_id=run_id, idempotency_key=None)
    _runs.insert(database, row, enqueue=lambda *_: None)


async def run_here(url: str, run_id: str, attempt: int = 1, **settings: Any) -> None:
    """Run a queued run in this process, as a worker's DBOS workflow would (`settings`: of
    its runs, `RunSettings` fields)."""
    from minions import RunSettings
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database
    from minions.runs._runner import RunExecutor

    store = AsyncDatabase(Database(url), patient=True)
    try:
        runner = RunExecutor(
            store, executor_id="here", incarnation="here", settings=RunSettings(**settings)
        )
        await runner.execute(run_id, attempt)
    finally:
        store.close()


SHOUTING_TOOLS = '''\
from minions import tool


@tool
def shout(text: str) -> str:
    """Shout."""
    return text.upper()
'''

SHOUTING = """\
id: {id}
tools: [tools]
inputs: {{words: {{type: array}}}}
steps:
  - id: each
    loop: "{{{{ inputs.words }}}}"
    parallel: 2
    tool: shout
    params: {{text: "{{{{ loop.item }}}}"}}
  - id: ask
    depends_on: [each]
    goal: Shout the first word.
    tools: [shout]
    config: {{retry_initial_delay: 0.0}}
"""


def shouting_recipes(folder: Path) -> tuple[Path, Path]:
    """Recipes `alpha` and `beta` in `folder`: a loop of tool calls (`each`), then an agent
    step that may call the tool (`ask`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(SHOUTING_TOOLS)
    paths = []
    for name in ("alpha", "beta"):
        path = folder / f"{name}.yaml"
        path.write_text(SHOUTING.format(id=name))
        paths.append(path)
    return paths[0], paths[1]


def model_calls(database: Any, run_id: str, made: list[tuple[str, str, int, int, float]]) -> None:
    """Model calls of a run as its worker stores them: (model, endpoint, prompt tokens,
    answer tokens (-1: the server said none), when)."""
    import sqlalchemy as sa

    from minions.events import ModelCallCompleted, ModelCallStarted, UsageRecord, event_to_json

    rows = []
    seq = 0
    for turn, (model, endpoint, prompt, answer, at) in enumerate(made, start=1):
        started = ModelCallStarted(
            run_id=run_id, step_id="s", seq=seq + 1, timestamp=at, turn=turn, model=model,
            endpoint=endpoint,
        )  # fmt: skip
        usage = (
            UsageRecord(calls=1, unknown_calls=1)
            if answer < 0
            else UsageRecord(prompt_tokens=prompt, completion_tokens=answer, calls=1)
        )
        ended = ModelCallCompleted(
            run_id=run_id, step_id="s", seq=seq + 2, timestamp=at, turn=turn, usage=usage
        )
        seq += 2
        for event in (started, ended):
            rows.append(
                {"run_id": run_id, "seq": event.seq, "kind": event.kind, "step_id": "s",
                 "data": event_to_json(event)}
            )  # fmt: skip
    with database.begin() as db:
        db.execute(sa.text(
            "INSERT INTO minions_events (run_id, seq, kind, step_id, data) "
            "VALUES (:run_id, :seq, :kind, :step_id, :data)"), rows)  # fmt: skip
        db.execute(
            sa.text("UPDATE minions_runs SET last_seq = :seq WHERE run_id = :run"),
            {"seq": seq, "run": run_id},
        )
