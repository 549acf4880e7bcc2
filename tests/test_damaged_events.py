"""A stored event row that holds no event (valid JSON of a kind this minions does not know,
without a kind, with a field of the wrong type; or not JSON) is a damaged store, named by its
run and number, whoever reads it: `DamagedStoreError` from the store, exit code 2 from the
CLI, the API's 503 for a store it cannot use (nothing of the server's in the answer), a
follow's error. It used to reach the caller as pydantic's `ValidationError`: a 500 from
``GET /runs/{id}/events``, a traceback from the CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
import structlog
from fastapi.testclient import TestClient
from runs_helpers import insert_run, until
from service_helpers import TOKEN, app_in_thread, auth, read_stream
from typer.testing import CliRunner

from minions.cli import app as cli
from minions.errors import StoreError
from minions.events import Event, ModelCallCompleted, RunStarted, StepStarted
from minions.runs import RunStore
from minions.runs import _events as events
from minions.runs._db import DamagedStoreError, Database
from minions.runs._events import EventRow, row_of
from minions.service import ServiceConfig, create_app

BAD = {
    "unknown kind": (
        '{"kind": "from_the_future", "run_id": "r1", "seq": 2, "timestamp": 1.0}',
        "not an event (its kind 'from_the_future' is not one this minions knows)",
    ),
    "no kind": ('{"run_id": "r1", "seq": 2}', "not an event (it has no kind)"),
    "wrong type": (
        '{"kind": "step_started", "step_id": "a", "seq": "two"}',
        "not an event (seq: Input should be a valid integer",
    ),
    "not JSON": ('{"kind": "step_sta', "not JSON ("),
}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def store_rows(url: str, run_id: str, *rows: EventRow) -> None:
    """`rows` stored straight into the run's log, after what it has."""
    database = Database(url, create=True)
    with database.begin() as db:
        events.insert(db, run_id, rows)
        db.execute(
            sa.text("UPDATE minions_runs SET last_seq = :s WHERE run_id = :r"),
            {"s": rows[-1].seq, "r": run_id},
        )
    database.close()


def good(event: Event, seq: int) -> EventRow:
    return row_of(dataclasses.replace(event, run_id="r1", seq=seq, timestamp=time.time()))


def a_run_with_a_bad_event(url: str, data: str, kind: str = "step_started") -> None:
    """Run r1, queued: its event 1 is `run_started`, its event 2 a row of `kind` holding
    `data`, event 3 a step's start."""
    database = Database(url, create=True)
    insert_run(database, "r1")
    database.close()
    store_rows(
        url,
        "r1",
        good(RunStarted(), 1),
        EventRow(2, kind, "a", data),
        good(StepStarted(step_id="a"), 3),
    )


@pytest.mark.parametrize("bad", list(BAD), ids=list(BAD))
async def test_the_store_names_an_event_that_is_no_event(url: str, bad: str) -> None:
    data, said = BAD[bad]
    a_run_with_a_bad_event(url, data)
    store = RunStore(url)
    try:
        damaged = f"is damaged: event 2 of run 'r1': {said}"
        with pytest.raises(DamagedStoreError) as raised:
            await store.events("r1")
        assert damaged in str(raised.value)
        assert [e.seq for e in await store.events("r1", after=2)] == [3]
        with pytest.raises(DamagedStoreError) as raised:
            await store.step_events("r1", "a")
        assert damaged in str(raised.value)
        with pytest.raises(DamagedStoreError) as raised:
            async for _ in store.follow("r1"):
                pass
        assert damaged in str(raised.value)
    finally:
        await store.aclose()


def test_the_api_answers_an_event_that_is_no_event_as_a_store_it_cannot_use(url: str) -> None:
    """A 503 of type `unavailable` that says nothing of the store (its log says what), as for
    any damaged store; no traceback; the events after it are read."""
    a_run_with_a_bad_event(url, BAD["unknown kind"][0])
    app = create_app(ServiceConfig(token=TOKEN, database_url=url))
    with (
        structlog.testing.capture_logs() as logs,
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        answer = client.get("/runs/r1/events", headers=auth())
        assert answer.status_code == 503
        assert answer.json() == {
            "error": {
                "type": "unavailable",
                "message": "the run store cannot be used now; see the server's log",
            }
        }
        assert "Traceback" not in answer.text
        later = client.get("/runs/r1/events?after=2", headers=auth())
        assert [e["seq"] for e in later.json()] == [3]
    [logged] = [e for e in logs if e["event"] == "run store error"]
    assert "is damaged: event 2 of run 'r1': not an event (its kind" in logged["error"]
    assert not [e for e in logs if e["event"] == "request failed"]


def test_an_event_stream_that_reads_an_event_that_is_no_event_ends_unavailable(url: str) -> None:
    """The run's event stream ends with a last `unavailable` message (the server's log says
    which event); one that starts past it follows on."""
    a_run_with_a_bad_event(url, BAD["no kind"][0])
    app = create_app(ServiceConfig(token=TOKEN, database_url=url))
    with structlog.testing.capture_logs() as logs, app_in_thread(app) as base:

        def read(after: int) -> list[dict[str, Any]]:
            path = f"/runs/r1/events/stream?after={after}"
            with (
                httpx2.Client(base_url=base, headers=auth(TOKEN), timeout=60) as client,
                client.stream("GET", path) as response,
            ):
                assert response.status_code == 200
                return read_stream(response, stop_after=1 if after else None)

        messages = read(0)
        assert [m["event"] for m in messages] == ["unavailable"]
        assert "event 2" not in messages[0]["data"]["error"]["message"]
        assert [m["id"] for m in read(2)] == ["3"]
    [logged] = [e for e in logs if e["event"] == "run store error"]
    assert "is damaged: event 2 of run 'r1': not an event (it has no kind)" in logged["error"]


@pytest.mark.parametrize("follow", [False, True], ids=["events", "events --follow"])
def test_runs_events_names_an_event_that_is_no_event(url: str, follow: bool) -> None:
    a_run_with_a_bad_event(url, BAD["wrong type"][0])
    command = ["runs", "events", "r1", "--database-url", url, *(["--follow"] if follow else [])]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 2, result.output
    assert "is damaged: event 2 of run 'r1': not an event (seq: " in result.stderr
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output


async def test_a_follower_whose_feed_reads_an_event_that_is_no_event_is_told(url: str) -> None:
    """The run's feed reads the bad row after the follower started: the follower ends with a
    `StoreError` naming the run and the event."""
    database = Database(url, create=True)
    insert_run(database, "r1")
    database.close()
    store_rows(url, "r1", good(RunStarted(), 1))
    store = RunStore(url, poll=0.01)
    try:
        received: list[Event] = []

        async def follow() -> None:
            async for event in store.follow("r1"):
                received.append(event)

        follower = asyncio.create_task(follow())
        await until(lambda: len(received) == 1)
        store_rows(url, "r1", EventRow(2, "from_the_future", None, BAD["unknown kind"][0]))
        with pytest.raises(StoreError) as raised:
            await asyncio.wait_for(follower, 60)
        said = str(raised.value)
        assert said.startswith("following run 'r1' failed: the run store ")
        assert "is damaged: event 2 of run 'r1': not an event (its kind" in said
        assert isinstance(raised.value.__cause__, DamagedStoreError)
    finally:
        await store.aclose()


async def test_usage_and_a_reruns_reused_steps_name_an_event_that_is_no_event(
    url: str,
) -> None:
    """The other readers of stored events: the usage of model calls (a report, a running
    run's usage so far) and what a resumed rerun said it reused."""
    database = Database(url, create=True)
    insert_run(database, "r1")
    database.close()
    ended = good(ModelCallCompleted(step_id="a"), 1)
    store_rows(url, "r1", ended, EventRow(2, "model_call_completed", "a", '{"kind": 7}'))
    store = RunStore(url)
    try:
        with pytest.raises(DamagedStoreError, match=r"event 2 of run 'r1': not an event"):
            await store.usage(since=0)
    finally:
        await store.aclose()
    store_rows(url, "r1", EventRow(3, "step_reused", "a", '{"kind": "step_reused", "visit": []}'))
    database = Database(url)
    try:
        with pytest.raises(DamagedStoreError, match=r"event 3 of run 'r1': not an event \(visit"):
            events.reuses_said(database, "r1")
    finally:
        database.close()
