"""Reading runs as an operator does, on SQLite and Postgres: the list filtered (status, recipe,
creation time, id prefix) and counted, a page at a time; a finished step's times, attempts and
loop items; one step's stored events (its loop items' too)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from runs_helpers import run_here, shouting_recipes

from minions.errors import TransientModelError, UnknownRunError
from minions.runs import RunStore
from minions.testing import ScriptedModel

pytestmark = pytest.mark.slow


async def test_runs_are_filtered_counted_and_paged(tmp_path: Path, url: str) -> None:
    alpha, beta = shouting_recipes(tmp_path)
    store = RunStore(url, create=True)
    try:
        first = [(await store.submit(alpha, {"words": ["a"]}))[0] for _ in range(3)]
        middle = time.time()
        later = [(await store.submit(beta, {"words": ["b"]}))[0] for _ in range(2)]

        assert await store.count_runs() == 5
        assert await store.count_runs(recipe="alpha") == 3
        assert {r.run_id for r in await store.list_runs(recipe="beta")} == set(later)
        assert {r.run_id for r in await store.list_runs(created_after=middle)} == set(later)
        assert {r.run_id for r in await store.list_runs(created_before=middle)} == set(first)
        assert await store.count_runs(created_before=middle, recipe="beta") == 0
        assert [r.run_id for r in await store.list_runs(id_prefix=first[1][:12])] == [first[1]]
        # A prefix is a prefix: the LIKE wildcards in it match themselves only.
        assert await store.list_runs(id_prefix="%") == []
        assert await store.list_runs(id_prefix="_") == []
        assert await store.count_runs(status="queued") == 5
        assert await store.count_runs(status="failed") == 0

        # Pages of two, newest first, every run once.
        seen = []
        before = None
        while True:
            page = await store.list_runs(limit=2, before=before)
            seen += [r.run_id for r in page]
            if len(page) < 2:
                break
            before = (page[-1].created_at, page[-1].run_id)
        assert seen == (first + later)[::-1]
        with pytest.raises(ValueError, match="unknown status 'done'"):
            await store.list_runs(status="done")
    finally:
        await store.aclose()


async def test_a_steps_times_attempts_items_and_events_are_read_back(
    tmp_path: Path, url: str
) -> None:
    alpha, _ = shouting_recipes(tmp_path)
    store = RunStore(url, create=True)
    try:
        run_id, _ = await store.submit(alpha, {"words": ["x", "y", "z"]})
        model = ScriptedModel(
            [TransientModelError("overloaded", status_code=503), [("shout", {"text": "x"})], "X"]
        )
        before = time.time()
        await run_here(url, run_id, model=model)
        record = await store.get(run_id)
        assert record.status == "completed", record.error
        each, ask = record.steps
        assert each.step_id == "each"
        assert [i.step_id for i in each.loop_items] == ["each[0]", "each[1]", "each[2]"]
        assert [i.output for i in each.loop_items] == ["X", "Y", "Z"]
        for step in (each, ask, *each.loop_items):
            assert step.started_at is not None
            assert step.finished_at is not None
            assert before <= step.started_at <= step.finished_at
        assert each.finished_at is not None
        assert ask.started_at is not None
        assert each.finished_at <= ask.started_at
        assert (ask.model_calls, ask.tool_calls, ask.attempts) == (3, 1, 2)

        events = await store.step_events(run_id, "each")
        assert {e.step_id for e in events} == {"each", "each[0]", "each[1]", "each[2]"}
        assert [e.seq for e in events] == sorted(e.seq for e in events)
        asked = await store.step_events(run_id, "ask")
        kinds = [e.kind for e in asked]
        assert kinds.count("model_call_started") == 3
        assert "retry_scheduled" in kinds
        assert {e.step_id for e in asked} == {"ask"}
        assert await store.step_events(run_id, "ea") == []
        with pytest.raises(UnknownRunError):
            await store.step_events("nope", "each")
    finally:
        await store.aclose()
