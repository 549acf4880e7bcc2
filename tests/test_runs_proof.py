"""The proof of durable runs: 20 five-step runs while workers are SIGKILLed at moments drawn
from a seed (gates: the ledger of side effects reaching a number of lines; between a tool's
side effect and its checkpoint included) and a reader of the event stream
reconnects at random. Step `three` is an agent step: its model (a real HTTP server answering
with a tool call, then text, and a 429 to every fourth request) marks the ledger through the
same tool. Every run completes; every run's events are contiguous, without a gap or a
duplicate, and are what the reader received; a step completes once and is never run again
after it completed; a tool step in flight at a kill runs again (once per kill that caught it,
each time a new `step_started`) under one idempotency key; the run's usage is the sum of its
steps', and the agent step's is the sum of the model calls of its last execution, retried
attempts included."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres import cluster
from runs_helpers import (
    STEPS,
    WorkerProcess,
    finished,
    ledger_entries,
    ledger_lines,
    marking_model,
    until,
    write_ledger_recipe,
)

from minions.events import Event
from minions.runs import RunStore
from minions.testing import FakeOpenAIServer

pytestmark = pytest.mark.slow

RUNS = 20


async def read_everything(
    store: RunStore, run_id: str, rng: random.Random, received: list[Event]
) -> list[Event]:
    """Follow the run's events to its end (into `received`), dropping the connection at
    random and resuming from the last sequence number received."""
    while not received or received[-1].kind not in ("run_completed", "run_failed"):
        after = received[-1].seq if received else 0
        budget = rng.randint(1, 6)
        async for event in store.follow(run_id, after=after):
            received.append(event)
            budget -= 1
            if budget == 0:
                break  # the connection drops
    return received


AGENT = "three"


def reached(ledger: Path, lines: int) -> bool:
    return len(ledger_lines(ledger)) >= lines


async def prove(url: str, folder: Path, workers: int, kill_for_good: bool) -> None:
    with marking_model() as server:
        await _prove(url, folder, workers, kill_for_good, server)


async def _prove(
    url: str, folder: Path, workers: int, kill_for_good: bool, server: FakeOpenAIServer
) -> None:
    rng = random.Random(1234)
    recipe = write_ledger_recipe(folder, seconds=0.05, agent=AGENT)
    ledger = folder / "ledger.txt"
    env = {
        "PAUSE_AFTER_EFFECT": "0.05",  # a window between a side effect and its checkpoint
        "MINIONS_MODEL": f"openai-compatible:fake-model@{server.url}",
        "OPENAI_API_KEY": "sk-test",
    }
    store = RunStore(url, create=True)
    run_ids = [(await store.submit(recipe, {"tag": f"p{i}"}))[0] for i in range(RUNS)]
    progress: dict[str, list[Event]] = {r: [] for r in run_ids}
    readers = [asyncio.create_task(read_everything(store, r, rng, progress[r])) for r in run_ids]
    pool = [WorkerProcess(url, folder, f"w{n}", ledger, **env) for n in range(workers)]
    # Each kill waits for a gate: the ledger (every side effect of every run) reaching a
    # number of lines drawn from the seed, not a span of time.
    gates = sorted(rng.sample(range(3, RUNS * len(STEPS) - 10), rng.randint(3, 5)))
    killed: set[int] = set()
    try:
        for kill, gate in enumerate(gates):
            await until(functools.partial(reached, ledger, gate), within=180)
            victim = pool[0]
            killed.add(victim.process.pid)
            victim.kill()
            if kill_for_good and kill == 0:
                pool.pop(0)  # this one never comes back: the others recover its runs
            else:
                pool[0] = WorkerProcess(url, folder, victim.executor_id, ledger, **env)
        statuses = [await finished(store, r, within=180) for r in run_ids]
        _, stuck = await asyncio.wait(readers, timeout=180)
        if stuck:  # say where each stuck reader was, and where its run's log is
            where = [
                (run_id, progress[run_id][-1:], (await store.get(run_id)).status)
                for run_id, reader in zip(run_ids, readers, strict=True)
                if reader in stuck
            ]
            raise AssertionError(f"readers never saw their run end: {where}")
        received = [reader.result() for reader in readers]
    finally:
        for process in pool:
            process.stop()
    assert statuses == ["completed"] * RUNS
    lines = ledger_entries(ledger)
    for run_id, tag, got in zip(run_ids, [f"p{i}" for i in range(RUNS)], received, strict=True):
        stored = await store.events(run_id)
        assert [e.seq for e in stored] == list(range(1, len(stored) + 1)), run_id
        terminal = [e.seq for e in stored if e.kind in ("run_completed", "run_failed")]
        assert terminal == [len(stored)], [(e.seq, e.kind, e.step_id) for e in stored]
        # The reader saw exactly the log, nothing lost, nothing twice (beside the text the
        # model streamed, which is live only and never stored).
        assert [e for e in got if e.kind != "token_delta"] == stored
        assert stored[-1].kind == "run_completed"
        record = await store.get(run_id)
        assert [s.step_id for s in record.steps] == STEPS  # each step checkpointed once
        mine = [(step, key, pid) for run, step, key, pid in lines if run == tag]
        for step in STEPS:
            entries = [(key, pid) for s, key, pid in mine if s == step]
            completed = [e for e in stored if e.kind == "step_completed" and e.step_id == step]
            # Completed once; run again only while in flight at a kill: every side effect but
            # the completing one was done by a worker killed afterwards (its step_started may
            # not have reached the log: events are written a few at a time), and a tool step
            # runs again under the same idempotency key (an agent step's key holds the call id
            # its model gave, new on each execution).
            assert len(completed) == 1, (tag, step)
            assert entries, (tag, step)
            assert all(pid in killed for _, pid in entries[:-1]), (tag, step, entries, killed)
            if step != AGENT:
                assert len({key for key, _ in entries}) == 1
        # Usage: the run's is the sum of its steps'; the agent step's is the sum of the model
        # calls of its last execution (after its last `step_started`), every attempt counted.
        for key in ("prompt_tokens", "completion_tokens", "calls"):
            assert record.usage[key] == sum(s.usage.get(key, 0) for s in record.steps), key
        last_start = max(
            i for i, e in enumerate(stored) if e.kind == "step_started" and e.step_id == AGENT
        )
        calls = [
            e
            for e in stored[last_start:]
            if e.step_id == AGENT and e.kind in ("model_call_completed", "model_call_failed")
        ]
        agent_usage = next(s.usage for s in record.steps if s.step_id == AGENT)
        assert agent_usage["calls"] == sum(e.usage.calls for e in calls) >= 2
        assert agent_usage["prompt_tokens"] == sum(e.usage.prompt_tokens for e in calls) > 0
    assert any(r.path.endswith("/chat/completions") for r in server.requests)
    retried = [e for r in run_ids for e in await store.events(r) if e.kind == "retry_scheduled"]
    assert retried, "no model call was retried: the 429s never happened"


async def test_sqlite_one_worker_killed_again_and_again(tmp_path: Path) -> None:
    await prove(f"sqlite:///{tmp_path / 'minions.db'}", tmp_path, workers=1, kill_for_good=False)


@pytest.fixture
def postgres() -> Iterator[str]:
    with cluster() as url:
        yield url


async def test_postgres_two_workers_one_killed_for_good(tmp_path: Path, postgres: str) -> None:
    await prove(postgres, tmp_path, workers=2, kill_for_good=True)
