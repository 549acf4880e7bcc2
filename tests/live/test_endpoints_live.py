"""What a real llama.cpp server taught the structured-output ladder, shared through the run
store (`make test-live`): on a server that ignores tools (Gemma's template), a run finds native
JSON after two ignored output-tool calls; once `DEFAULT_DEMOTE_RUNS` runs found it (one run's
prose demotes nothing for the others: it could be that client's prompt), the later runs
through that worker, and through a second worker started afterwards, make no discovery
calls."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from minions.events import Event
from minions.models._internal import DEFAULT_DEMOTE_RUNS
from minions.runs import RunStore

from .conftest import LiveServer

pytestmark = pytest.mark.live

RECIPE = """\
id: pack
inputs: {city: {type: string}}
steps:
  - id: pack
    goal: "I am in {{ inputs.city }} tomorrow. Should I take an umbrella?"
    tools: [current_datetime]
    output: {umbrella: false}
    config: {max_output_retries: 4}
"""

WORKER = """\
import sys

from minions._step.settings import RunSettings
from minions.models import OpenAIChatModel
from minions.runs import Worker

url, executor_id, base_url, model = sys.argv[1:5]


def resolve(_spec):
    # Greedy decoding, a fixed seed and answers of at most 200 tokens (at 64, Gemma 3 270M
    # had its JSON cut off before it closed).
    settings = {"temperature": 0, "seed": 1, "max_tokens": 200}
    return OpenAIChatModel(model, base_url=base_url, timeout=180, settings=settings)


def ready(_worker):
    print("running queued runs", flush=True)


Worker(
    url, concurrency=1, executor_id=executor_id, settings=RunSettings(model_resolver=resolve),
    on_ready=ready,
).run()
"""


class LiveWorker:
    """A worker process whose models are the live server's (with short answers)."""

    def __init__(self, folder: Path, url: str, executor_id: str, server: LiveServer) -> None:
        script = folder / "live_worker.py"
        script.write_text(WORKER)
        self.log = folder / f"{executor_id}.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), url, executor_id, server.base_url, server.model],
                cwd=folder,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120
        while "running queued runs" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start: {self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


async def run_through(store: RunStore, recipe: Path, city: str) -> list[Event]:
    run_id, _ = await store.submit(recipe, {"city": city})
    async for _ in store.follow(run_id):
        pass
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    return await store.events(run_id)


def modes(events: list[Event]) -> list[str | None]:
    return [getattr(e, "output_mode", None) for e in events if e.kind.startswith("model_call_")]


async def test_later_runs_through_any_worker_start_at_the_mode_that_worked(
    gemma_strict: LiveServer, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    store = RunStore(url, create=True)
    first = LiveWorker(tmp_path, url, "live-1", gemma_strict)
    try:
        cities = ("Oslo", "Lima", "Rome", "Kyiv", "Accra")[:DEFAULT_DEMOTE_RUNS]
        learned = [await run_through(store, recipe, city) for city in cities]
        later = [await run_through(store, recipe, "Bergen")]
    finally:
        first.stop()
    for events in learned:  # each run's own discovery, until enough runs agree
        assert [e.kind for e in events].count("output_mode_demoted") == 1
        assert "tool" in modes(events)  # the output tool, ignored
    known = await store.endpoints()
    assert [(e.base_url, e.output_mode) for e in known] == [
        (gemma_strict.base_url.rstrip("/"), "json_schema")
    ]
    second = LiveWorker(tmp_path, url, "live-2", gemma_strict)
    try:
        later.append(await run_through(store, recipe, "Paris"))
    finally:
        second.stop()
    await store.aclose()
    for events in later:
        assert set(modes(events)) <= {"json_schema", None}, modes(events)
        assert all(e.kind != "output_mode_demoted" for e in events)
