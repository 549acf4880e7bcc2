"""The REST API through a real `minions serve` (uvicorn, with its in-process worker) on
127.0.0.1, with httpx: every endpoint and error, auth, idempotent submit, approvals, cancel and
resume, and the event stream resumed after a dropped connection with no event lost or
repeated."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import stat
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from service_helpers import (
    ANSWER,
    TOKEN,
    ServerProcess,
    app_in_thread,
    auth,
    gated_model,
    read_stream,
    read_stream_iter,
    server,
    submit,
    watch_answer,
    write_chat_recipe,
    write_recipes,
)

from minions.errors import MinionsError
from minions.service import ServiceConfig, create_app, load_token
from minions.testing import FakeOpenAIServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service")


@pytest.fixture(scope="module")
def url(folder: Path) -> str:
    return f"sqlite:///{folder / 'store' / 'minions.db'}"


@pytest.fixture(scope="module")
def model() -> Iterator[tuple[FakeOpenAIServer, threading.Event]]:
    """A model server whose answer waits for the test's go (token deltas are live only)."""
    with gated_model() as (server, go):
        yield server, go


BIG = f"""\
id: big
description: An MCP tool's large result (cut to 200,000 characters).
mcp_servers:
  test: {{command: {sys.executable}, args: ['{Path(__file__).parent / "mcp_test_server.py"}']}}
steps:
  - {{id: fetch, tool: test.big, params: {{size: 500000}}}}
"""


LOOP = """\
id: loop
description: A step, a loop of three items two at a time, a step after it.
tools: [shouting]
steps:
  - {id: start, tool: shout, params: {text: go}}
  - {id: each, depends_on: [start], loop: [a, b, c], parallel: 2, tool: shout,
     params: {text: "{{ loop.item }}"}}
  - {id: after, depends_on: [each], tool: shout, params: {text: done}}
"""


@pytest.fixture(scope="module")
def service(
    folder: Path, url: str, model: tuple[FakeOpenAIServer, threading.Event]
) -> Iterator[ServerProcess]:
    recipes = write_recipes(folder / "recipes")
    write_chat_recipe(recipes, model[0].url)
    (recipes / "big.yaml").write_text(BIG)
    (recipes / "loop.yaml").write_text(LOOP)
    with server(
        folder,
        url,
        "--recipes",
        str(recipes),
        LEDGER=str(folder / "ledger.txt"),
        FLAKY_OK=str(folder / "flaky-ok"),
    ) as process:
        yield process


@pytest.fixture
def client(service: ServerProcess) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client:
        yield client


def stream_to_end(client: httpx2.Client, run_id: str, **params: Any) -> list[dict[str, Any]]:
    with client.stream("GET", f"/runs/{run_id}/events/stream", params=params) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_stream(response)


def until_status(client: httpx2.Client, run_id: str, status: str) -> dict[str, Any]:
    """Follow the run's stream until its status is `status` (waiting is told by an
    approval_requested event; the others by the stream's end)."""
    if status == "waiting":
        with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
            for message in read_stream_iter(response):
                if message["data"]["kind"] == "approval_requested":
                    break
        for _ in range(600):  # the status is written just after the event
            body: dict[str, Any] = client.get(f"/runs/{run_id}").json()
            if body["status"] == "waiting":
                return body
            import time

            time.sleep(0.05)
        raise AssertionError(f"run {run_id} is not waiting: {body['status']}")
    stream_to_end(client, run_id)
    body = client.get(f"/runs/{run_id}").json()
    assert body["status"] == status, body
    return body


def approval_path(run_id: str, call_id: str) -> str:
    from urllib.parse import quote

    return f"/runs/{run_id}/approvals/{quote(call_id, safe='/')}"


def error_of(response: httpx2.Response, status: int, kind: str | None = None) -> str:
    """The error's message, after checking the status and the error shape."""
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    body = response.json()
    assert set(body) == {"error"}
    extra = {"state"} if body["error"].get("type") == "wrong_state" else set()
    assert set(body["error"]) == {"type", "message"} | extra
    if kind is not None:
        assert body["error"]["type"] == kind
    message: str = body["error"]["message"]
    return message


# -- auth -----------------------------------------------------------------------------------

ENDPOINTS = [
    ("GET", "/runs"),
    ("POST", "/runs"),
    ("GET", "/runs/x"),
    ("POST", "/runs/x/cancel"),
    ("POST", "/runs/x/resume"),
    ("POST", "/runs/x/rerun"),
    ("POST", "/runs/x/rerun/preview"),
    ("GET", "/runs/x/diff/y"),
    ("POST", "/runs/x/approvals/c"),
    ("GET", "/runs/x/events"),
    ("GET", "/runs/x/events/stream"),
    ("GET", "/recipes"),
    ("GET", "/workers"),
    ("GET", "/evals"),
    ("GET", "/evals/x"),
    ("GET", "/openapi.json"),
    ("GET", "/no/such/endpoint"),
    ("POST", "/runs/x/events/ticket"),
    ("GET", "/console/no-such-file.js"),
    ("GET", "/console/"),
    ("GET", "/favicon.ico"),
    ("GET", "/keys"),
    ("POST", "/keys"),
    ("DELETE", "/keys/x"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_but_health_needs_the_token(
    service: ServerProcess, method: str, path: str
) -> None:
    missing = httpx2.request(method, service.base + path)
    assert "Authorization" in error_of(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = httpx2.request(method, service.base + path, headers=auth("not-the-token"))
    assert error_of(wrong, 401) == "the bearer key is wrong or was revoked"
    basic = httpx2.request(method, service.base + path, headers={"Authorization": TOKEN})
    error_of(basic, 401)


def test_health_and_the_console_page_need_no_token(service: ServerProcess) -> None:
    health = httpx2.get(service.base + "/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    page = httpx2.get(service.base + "/")
    assert page.status_code == 200
    assert "<title>minions" in page.text
    assert httpx2.get(service.base + "/console/console.js").status_code == 200


def test_the_console_is_es_modules_served_with_their_types_and_the_servers_names(
    service: ServerProcess,
) -> None:
    import re

    from minions._fold import ENDED, EXECUTION_STATUSES, RUN_STATUSES, TERMINAL, TERMINAL_KINDS
    from minions.runs import AUDIT_ACTIONS

    page = httpx2.get(service.base + "/").text
    assert '<script type="module" src="/console/console.js"></script>' in page
    # Every module the page imports, and those they import, is served (no token, no build
    # step, nothing from the network) as JavaScript.
    todo, seen = ["console.js"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        served = httpx2.get(f"{service.base}/console/{name}")
        assert served.status_code == 200, name
        assert served.headers["content-type"].startswith("text/javascript"), name
        imports = re.findall(r'from "([^"]+)"', served.text)
        assert all(i.startswith("./") for i in imports), (name, imports)
        todo += [i.removeprefix("./") for i in imports]
    assert {"console.js", "names.js", "state.js", "stream.js", "timeline.js"} <= seen
    # The statuses and event kinds are the server's own lists.
    names = httpx2.get(service.base + "/console/names.js").text
    lists = dict(re.findall(r"export const (\w+) = (\[.*\]);", names))
    assert json.loads(lists["RUN_STATUSES"]) == list(RUN_STATUSES)
    assert json.loads(lists["TERMINAL_STATUSES"]) == sorted(TERMINAL)
    assert json.loads(lists["EXECUTION_STATUSES"]) == list(EXECUTION_STATUSES)
    assert json.loads(lists["ENDED_STATUSES"]) == sorted(ENDED)
    assert "approval_requested" in json.loads(lists["EVENT_KINDS"])
    assert (
        json.loads(lists["TERMINAL_KINDS"])
        == sorted(TERMINAL_KINDS)
        == [
            "run_completed",
            "run_failed",
        ]
    )
    # Every list the console shares with the server is one the docstring names.
    from minions.service._routes import console

    assert [n for n in lists if f"`{n}`" not in (console.__doc__ or "")] == []
    assert json.loads(lists["AUDIT_ACTIONS"]) == list(AUDIT_ACTIONS)
    css = httpx2.get(service.base + "/console/console.css")
    assert css.headers["content-type"].startswith("text/css")


def test_the_openapi_schema_lists_every_endpoint(client: httpx2.Client) -> None:
    schema = client.get("/openapi.json").json()
    assert set(schema["paths"]) == {
        "/runs",
        "/runs/{run_id}",
        "/runs/{run_id}/cancel",
        "/runs/{run_id}/resume",
        "/runs/{run_id}/approvals/{call_id}",
        "/runs/{run_id}/events",
        "/runs/{run_id}/events/stream",
        "/runs/{run_id}/events/ticket",
        "/runs/{run_id}/steps",
        "/runs/{run_id}/steps/{step_id}",
        "/runs/{run_id}/rerun",
        "/runs/{run_id}/rerun/preview",
        "/runs/{run_a}/diff/{run_b}",
        "/recipes",
        "/workers",
        "/health",
        "/health/live",
        "/health/ready",
        "/schedules",
        "/schedules/{name}",
        "/schedules/{name}/pause",
        "/keys",
        "/keys/{name}",
        "/me",
        "/audit",
        "/projects",
        "/queue",
        "/endpoints/status",
        "/notifications",
        "/usage",
        "/schedules/{name}/resume",
        "/evals",
        "/evals/{eval_id}",
    }
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    listing = {p["name"] for p in schema["paths"]["/runs"]["get"]["parameters"]}
    assert {"created_after", "created_before", "id_prefix", "cursor"} <= listing
    assert "loop_items" in schema["components"]["schemas"]["StepOut"]["properties"]
    assert "tool_calls" in schema["components"]["schemas"]["StepDetail"]["properties"]


# -- runs -----------------------------------------------------------------------------------


def test_a_submitted_run_completes_and_shows_its_steps_graph_and_events(
    client: httpx2.Client,
) -> None:
    response = client.post("/runs", json={"recipe": "ledger", "inputs": {"tag": "t1"}})
    assert response.status_code == 201
    body = response.json()
    assert body["status"] == "queued"
    assert body["created"] is True
    run_id = body["run_id"]
    messages = stream_to_end(client, run_id)
    assert [int(m["id"]) for m in messages] == list(range(1, len(messages) + 1))
    assert messages[0]["event"] == "run_started"
    assert messages[-1]["event"] == "run_completed"
    run = client.get(f"/runs/{run_id}").json()
    assert run["status"] == "completed"
    assert run["recipe"] == "ledger"
    assert run["output"] == "t1:five"
    assert [s["step_id"] for s in run["steps"]] == ["one", "two", "three", "four", "five"]
    assert run["graph"][1] == {"id": "two", "kind": "tool", "depends_on": ["one"], "next": []}
    assert run["usage"]["calls"] == 0
    # The JSON events are the stream's, a page at a time.
    stored = client.get(f"/runs/{run_id}/events").json()
    assert [e["seq"] for e in stored] == [int(m["id"]) for m in messages]
    page = client.get(f"/runs/{run_id}/events", params={"after": 2, "limit": 3}).json()
    assert [e["seq"] for e in page] == [3, 4, 5]
    assert page == stored[2:5]


def test_submitting_again_with_one_key_gives_the_same_run(client: httpx2.Client) -> None:
    given = {"recipe": "ledger", "inputs": {"tag": "idem"}, "idempotency_key": "key-1"}
    first = client.post("/runs", json=given)
    again = client.post("/runs", json=given)
    assert first.status_code == again.status_code == 201
    assert again.json()["run_id"] == first.json()["run_id"]
    assert (first.json()["created"], again.json()["created"]) == (True, False)
    listed = client.get("/runs", params={"recipe": "ledger", "limit": 500}).json()["runs"]
    assert [r["run_id"] for r in listed].count(first.json()["run_id"]) == 1


def test_runs_are_listed_newest_first_with_filters_and_a_cursor(client: httpx2.Client) -> None:
    ids = [submit(client, "ledger", tag=f"list{i}") for i in range(3)]
    for run_id in ids:
        stream_to_end(client, run_id)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"recipe": "ledger", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/runs", params=params).json()
        seen += [r["run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert seen[:3] == ids[::-1]
    completed = client.get("/runs", params={"status": "completed", "limit": 500}).json()
    assert {r["status"] for r in completed["runs"]} == {"completed"}
    assert set(ids) <= {r["run_id"] for r in completed["runs"]}
    nothing = client.get("/runs", params={"recipe": "nothing-like-it"}).json()
    assert (nothing["runs"], nothing["next_cursor"], nothing["total"]) == ([], None, 0)
    assert nothing["history"]["oldest_at"] <= min(r["created_at"] for r in completed["runs"])


def test_runs_are_found_by_creation_time_and_id_prefix_and_counted(
    client: httpx2.Client,
) -> None:
    first = submit(client, "ledger", tag="when1")
    stream_to_end(client, first)
    created = client.get(f"/runs/{first}").json()["created_at"]
    second = submit(client, "ledger", tag="when2")
    stream_to_end(client, second)
    after = client.get("/runs", params={"created_after": created, "limit": 500}).json()
    assert [r["run_id"] for r in after["runs"]][-2:] == [second, first]
    assert after["total"] == len(after["runs"])
    before = client.get("/runs", params={"created_before": created, "limit": 500}).json()
    assert not {first, second} & {r["run_id"] for r in before["runs"]}
    found = client.get("/runs", params={"id_prefix": second[:8]}).json()
    assert [r["run_id"] for r in found["runs"]] == [second]
    assert found["total"] == 1
    # Filters together; the total counts every page.
    both = client.get(
        "/runs", params={"recipe": "ledger", "status": "completed", "limit": 1}
    ).json()
    assert len(both["runs"]) == 1
    assert both["next_cursor"] is not None
    assert both["total"] >= 2
    bad = client.get("/runs", params={"created_after": "yesterday"})
    assert "query.created_after" in error_of(bad, 422)
    assert "query.created_before" in error_of(
        client.get("/runs", params={"created_before": "nan"}), 422
    )


def test_a_steps_times_calls_and_errors_are_told(client: httpx2.Client) -> None:
    run_id = submit(client, "ledger", tag="detail")
    stream_to_end(client, run_id)
    run = client.get(f"/runs/{run_id}").json()
    one, two = run["steps"][:2]
    assert one["started_at"] <= one["finished_at"] <= two["started_at"] <= two["finished_at"]
    assert (one["tool_calls"], one["model_calls"], one["loop_items"]) == (1, 0, [])
    detail = client.get(f"/runs/{run_id}/steps/two").json()
    assert (detail["step_id"], detail["kind"], detail["status"]) == ("two", "tool", "completed")
    assert (detail["waited"], detail["waiting"]) == (0.0, None)
    assert detail["executions"] == [two]
    [call] = detail["tool_calls"]
    assert call["name"] == "mark"
    assert call["arguments"] == {"run": "detail", "step": "two", "seconds": 0.0}
    assert call["result"] == "detail:two"
    assert call["error"] is None
    assert detail["started_at"] <= call["started_at"] <= call["finished_at"]
    # A failed step: its error and its tool call's, with no stored execution.
    failed_id = submit(client, "flaky")
    until_status(client, failed_id, "failed")
    failed = client.get(f"/runs/{failed_id}/steps/second").json()
    assert failed["status"] == "failed"
    assert "not yet" in failed["error"]
    assert failed["executions"] == []
    assert failed["usage"]["calls"] == 0
    [flaky] = failed["tool_calls"]
    assert "not yet" in flaky["error"]
    assert flaky["result"] is None
    unknown = client.get(f"/runs/{failed_id}/steps/third")
    assert "no step 'third'" in error_of(unknown, 404, "unknown_step")
    error_of(client.get("/runs/nope/steps/first"), 404, "unknown_run")


def test_a_runs_steps_are_told_as_the_one_fold_of_its_events(client: httpx2.Client) -> None:
    run_id = submit(client, "loop")
    messages = stream_to_end(client, run_id)
    assert "states" not in {m["event"] for m in messages}  # only when asked for
    states = client.get(f"/runs/{run_id}/steps").json()
    assert (states["run_id"], states["seq"], states["full"]) == (run_id, len(messages), True)
    assert states["steps"] == {"start": "completed", "each": "completed", "after": "completed"}
    executions = {e["step_id"]: e for e in states["executions"]}
    assert set(executions) == {"start", "each", "each[0]", "each[1]", "each[2]", "after"}
    each, second = executions["each"], executions["each[1]"]
    assert (each["item"], each["items_started"], each["items_done"]) == (None, 3, 3)
    assert {e["waited"] for e in executions.values()} == {0.0}  # nothing waited
    assert (second["step"], second["item"], second["visit"], second["tool_calls"]) == (
        "each",
        1,
        1,
        1,
    )
    assert each["started_at"] <= second["started_at"] <= second["finished_at"]
    assert second["finished_at"] <= each["finished_at"] <= executions["after"]["started_at"]
    # One loop item, addressed as everywhere: its calls and its stored execution.
    item = client.get(f"/runs/{run_id}/steps/each[1]").json()
    assert (item["step_id"], item["status"], len(item["tool_calls"])) == ("each[1]", "completed", 1)
    assert [e["step_id"] for e in item["executions"]] == ["each[1]"]
    error_of(client.get(f"/runs/{run_id}/steps/each[9]"), 404, "unknown_step")
    error_of(client.get("/runs/nope/steps"), 404, "unknown_run")


def test_the_stream_keeps_the_step_states_it_was_asked_for_up_to_date(
    client: httpx2.Client,
) -> None:
    run_id = submit(client, "slow", tag="states")  # a step every 0.3 s: live events
    messages = stream_to_end(client, run_id, states="true")
    told = [m for m in messages if m["event"] == "states"]
    assert told[0]["data"]["full"] is True
    assert all("id" not in m for m in told)
    # Each message after the first holds the executions the event before it changed: kept
    # in a copy, they are what the run's steps are once it ended.
    kept = {(e["step_id"], e["visit"]): e for e in told[0]["data"]["executions"]}
    statuses = dict(told[0]["data"]["steps"])
    for message in told[1:]:
        assert message["data"]["full"] is False
        kept.update({(e["step_id"], e["visit"]): e for e in message["data"]["executions"]})
        statuses.update(message["data"]["steps"])
    final = client.get(f"/runs/{run_id}/steps").json()
    assert (
        statuses
        == final["steps"]
        == dict.fromkeys(["one", "two", "three", "four", "five"], "completed")
    )
    assert list(kept.values()) == final["executions"]
    assert final["seq"] == int(messages[-1]["id"])
    for before, message in itertools.pairwise(messages):  # each after its event
        if message["event"] == "states":
            assert message["data"]["seq"] == int(before["id"])
    # A stream resumed after an event starts from every execution as of that event.
    with client.stream(
        "GET", f"/runs/{run_id}/events/stream", params={"after": 3, "states": "true"}
    ) as response:
        [first, *events] = read_stream(response)
    assert (first["event"], first["data"]["full"], first["data"]["seq"]) == (
        "states",
        True,
        final["seq"],
    )
    assert first["data"]["executions"] == final["executions"]
    assert [int(m["id"]) for m in events if m["event"] != "states"] == list(
        range(4, final["seq"] + 1)
    )


def test_a_waiting_call_is_approved_over_the_api(client: httpx2.Client) -> None:
    run_id = submit(client, "release", text="go")
    run = until_status(client, run_id, "waiting")
    [approval] = run["approvals"]
    assert approval["tool"] == "shout"
    assert approval["arguments"] == {"text": "go"}
    assert approval["decided_at"] is None
    waits = client.get(f"/runs/{run_id}/steps/say").json()
    assert (waits["status"], waits["waiting"], waits["waited"]) == ("waiting", "approval", None)
    call = approval["call_id"]
    decided = client.post(approval_path(run_id, call), json={"approve": True})
    assert decided.status_code == 200, decided.text
    assert decided.json()["approvals"][0]["approved"] is True
    run = until_status(client, run_id, "completed")
    assert run["output"] == "DONE"
    said = client.get(f"/runs/{run_id}/steps/say").json()
    assert said["waiting"] is None
    assert said["waited"] == said["executions"][-1]["waited"]  # the fold's and the store's
    assert [a["approved"] for a in said["approvals"]] == [True]
    # The step started again when the decision queued its run (it was parked): the call
    # runs in that start.
    assert said["tool_calls"][-1]["result"] == "GO"
    # Deciding again: the run waits for nothing.
    again = client.post(approval_path(run_id, call), json={"approve": True})
    assert "was approved already" in error_of(again, 409, "wrong_state")


def test_a_rejected_call_fails_the_tool_step_with_the_reason(client: httpx2.Client) -> None:
    run_id = submit(client, "release")
    call = until_status(client, run_id, "waiting")["approvals"][0]["call_id"]
    rejected = client.post(
        approval_path(run_id, call),
        json={"approve": False, "reason": "not today"},
    )
    assert rejected.status_code == 200
    run = until_status(client, run_id, "failed")
    assert "not today" in run["error"]


def test_a_run_is_cancelled_and_resumed(client: httpx2.Client) -> None:
    run_id = submit(client, "release")  # waits for a person: it is still going when cancelled
    until_status(client, run_id, "waiting")
    cancelled = client.post(f"/runs/{run_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert "nothing to cancel" in error_of(client.post(f"/runs/{run_id}/cancel"), 409)
    resumed = client.post(f"/runs/{run_id}/resume")
    assert resumed.status_code == 200
    assert resumed.json()["status"] in ("queued", "running", "waiting")
    call = until_status(client, run_id, "waiting")["approvals"][0]["call_id"]
    client.post(approval_path(run_id, call), json={"approve": True})
    run = until_status(client, run_id, "completed")
    assert run["output"] == "DONE"
    assert "only a failed or cancelled run resumes" in error_of(
        client.post(f"/runs/{run_id}/resume"), 409, "wrong_state"
    )


def test_a_failed_run_resumes_from_its_last_completed_step(
    client: httpx2.Client, folder: Path
) -> None:
    run_id = submit(client, "flaky")
    failed = until_status(client, run_id, "failed")
    assert [(s["step_id"], s["status"]) for s in failed["steps"]] == [("first", "completed")]
    assert "not yet" in failed["error"]
    (folder / "flaky-ok").touch()
    assert client.post(f"/runs/{run_id}/resume").status_code == 200
    run = until_status(client, run_id, "completed")
    assert run["output"] == "two"
    events = client.get(f"/runs/{run_id}/events").json()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    started = [e["step_id"] for e in events if e["kind"] == "step_started"]
    assert started.count("first") == 1  # not run again
    # The step's detail tells both of its tries: the failed call, then the one that worked.
    second = client.get(f"/runs/{run_id}/steps/second").json()
    assert (second["status"], second["error"]) == ("completed", None)
    assert [(c["error"] is None, c["result"]) for c in second["tool_calls"]] == [
        (False, None),
        (True, "two"),
    ]
    assert second["started_at"] >= second["tool_calls"][0]["finished_at"]


# -- the stream -----------------------------------------------------------------------------


def test_the_stream_resumes_after_a_dropped_connection_with_nothing_lost_or_repeated(
    client: httpx2.Client,
) -> None:
    run_id = submit(client, "slow", tag="drop")
    received: list[dict[str, Any]] = []
    with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
        received += read_stream(response, stop_after=4)
    # The connection is closed mid-run; the client resumes from the last id it saw.
    last = received[-1]["id"]
    assert received[-1]["data"]["kind"] != "run_completed"
    with client.stream(
        "GET", f"/runs/{run_id}/events/stream", headers={"Last-Event-ID": last}
    ) as response:
        received += read_stream(response)
    ids = [int(m["id"]) for m in received if "id" in m]
    stored = client.get(f"/runs/{run_id}/events").json()
    assert ids == [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert [m["data"] for m in received if "id" in m] == stored
    assert received[-1]["data"]["kind"] == "run_completed"
    # ?after= too, and Last-Event-ID wins over it.
    tail = stream_to_end(client, run_id, after=len(stored) - 2)
    assert [int(m["id"]) for m in tail] == [len(stored) - 1, len(stored)]
    with client.stream(
        "GET",
        f"/runs/{run_id}/events/stream",
        params={"after": 0},
        headers={"Last-Event-ID": str(len(stored) - 1)},
    ) as response:
        assert [int(m["id"]) for m in read_stream(response)] == [len(stored)]
    # A client that saw the end already is told not to come back (204: an EventSource stops).
    for position in (len(stored), len(stored) + 5):
        done = client.get(f"/runs/{run_id}/events/stream", params={"after": position})
        assert (done.status_code, done.content) == (204, b"")
        done = client.get(f"/runs/{run_id}/events/stream", headers={"Last-Event-ID": str(position)})
        assert done.status_code == 204


def test_token_deltas_stream_live_without_ids(
    client: httpx2.Client, model: tuple[FakeOpenAIServer, threading.Event]
) -> None:
    _, go = model
    run_id = submit(client, "chat")
    messages = watch_answer(client, run_id, go)
    deltas = [m for m in messages if m["event"] == "token_delta"]
    assert len(deltas) > 1
    assert "".join(d["data"]["text"] for d in deltas) == ANSWER
    assert all("id" not in d for d in deltas)  # not stored: nothing to resume from
    stored = [m for m in messages if m["event"] != "token_delta"]
    assert [int(m["id"]) for m in stored] == list(range(1, len(stored) + 1))
    assert stored[-1]["event"] == "run_completed"
    assert client.get(f"/runs/{run_id}").json()["output"] == ANSWER
    # This server was started without content capture: the step's detail keeps no prompt.
    [call] = client.get(f"/runs/{run_id}/steps/answer").json()["model_calls"]
    assert (call["messages"], call["answer"]) == ([], None)


def test_a_server_started_with_content_capture_tells_prompts_and_answers(
    tmp_path: Path,
) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    with FakeOpenAIServer(lambda request: ANSWER) as model:
        write_chat_recipe(recipes, model.url)
        store = f"sqlite:///{tmp_path / 'minions.db'}"
        capture = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
        with (
            server(tmp_path, store, "--recipes", str(recipes), **capture) as process,
            httpx2.Client(base_url=process.base, headers=auth(), timeout=60) as client,
        ):
            run_id = submit(client, "chat")
            stream_to_end(client, run_id)
            [call] = client.get(f"/runs/{run_id}/steps/answer").json()["model_calls"]
            events = client.get(f"/runs/{run_id}/events").json()
    assert call["messages"] == [{"role": "user", "text": "How do bees tell where flowers are?"}]
    assert (call["messages_omitted"], call["answer"]) == (0, ANSWER)
    # Stored with the run's events as they were emitted.
    [started] = [e for e in events if e["kind"] == "model_call_started"]
    assert started["messages"] == call["messages"]


def test_an_idle_stream_sends_heartbeats_and_ends_with_its_run(
    tmp_path: Path, folder: Path
) -> None:
    """A store no worker serves: the run stays queued, its stream says it is alive in comment
    lines, and ends once the run is cancelled."""
    config = ServiceConfig(
        token=TOKEN,
        database_url=f"sqlite:///{tmp_path / 'idle' / 'minions.db'}",
        recipes=folder / "recipes",
        heartbeat=0.05,
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as c,
    ):
        run_id = submit(c, "ledger", tag="idle")
        heartbeats = 0
        with c.stream("GET", f"/runs/{run_id}/events/stream") as response:
            for line in response.iter_lines():
                heartbeats += line == ": keep-alive"
                if heartbeats == 2:
                    break
        assert c.post(f"/runs/{run_id}/cancel").json()["status"] == "cancelled"
        messages = stream_to_end(c, run_id)
        assert [(m["data"]["kind"], m["data"]["error"]) for m in messages] == [
            ("run_failed", "cancelled")
        ]


def test_a_stream_ticket_opens_its_runs_stream_only(
    client: httpx2.Client, service: ServerProcess
) -> None:
    """For a browser's EventSource, which cannot send the token: a short-lived ticket in
    the stream's URL, good for that run's stream and nothing else."""
    run_id = submit(client, "ledger", tag="ticket")
    other = submit(client, "ledger", tag="other")
    made = client.post(f"/runs/{run_id}/events/ticket")
    assert made.status_code == 200, made.text
    ticket = made.json()["ticket"]
    assert made.json()["expires_at"] > time.time()
    assert TOKEN not in ticket
    stream = f"{service.base}/runs/{run_id}/events/stream"
    with httpx2.stream("GET", stream, params={"ticket": ticket}, timeout=60) as response:
        assert response.status_code == 200
        assert read_stream(response)[-1]["event"] == "run_completed"
    for path, params in [
        (f"/runs/{other}/events/stream", {"ticket": ticket}),  # another run's stream
        (f"/runs/{run_id}/events", {"ticket": ticket}),  # anything else
        (f"/runs/{run_id}", {"ticket": ticket}),
        (f"/runs/{run_id}/events/stream", {"ticket": ticket[:-2] + "xx"}),  # forged
        (f"/runs/{run_id}/events/stream", {"ticket": "1." + ticket.split(".")[1]}),  # expired
    ]:
        refused = httpx2.get(service.base + path, params=params, timeout=60)
        assert refused.status_code == 401, (path, refused.text)
    unknown = client.post("/runs/nope/events/ticket")
    assert error_of(unknown, 404, "unknown_run")


def test_tickets_expire_and_name_their_run_and_key() -> None:
    from minions.service._tickets import TICKET_SECONDS, Tickets

    tickets = Tickets("a-token")
    ticket, expires = tickets.issue("run-1", key_id="0123abcd", now=1000.0)
    assert expires == 1000 + TICKET_SECONDS
    assert tickets.key_of("run-1", ticket, now=1000.0 + TICKET_SECONDS) == "0123abcd"
    assert tickets.key_of("run-1", ticket, now=1001.0 + TICKET_SECONDS) is None
    assert tickets.key_of("run-2", ticket, now=1000.0) is None
    assert Tickets("another-token").key_of("run-1", ticket, now=1000.0) is None
    assert tickets.key_of("run-1", ticket.replace(".", ".x", 1), now=1000.0) is None
    # The key it names is signed: another key's id in it does not open the stream.
    expiry, _, signature = ticket.split(".")
    assert tickets.key_of("run-1", f"{expiry}.token.{signature}", now=1000.0) is None


def test_a_large_tool_result_is_stored_once_not_in_every_event(client: httpx2.Client) -> None:
    """The events that carry an MCP tool's large result hold a preview; the run holds it."""
    run_id = submit(client, "big")
    stream_to_end(client, run_id)
    run = client.get(f"/runs/{run_id}").json()
    assert run["status"] == "completed", run
    whole = run["output"]
    assert whole.startswith("x" * 200_000)
    assert "[cut: 500,000 characters, showing the first 200,000]" in whole
    assert run["steps"][0]["output"] == whole
    events = client.get(f"/runs/{run_id}/events").json()
    previews = {
        e["kind"]: e.get("content", e.get("output"))
        for e in events
        if e["kind"] in ("tool_call_completed", "step_completed", "run_completed")
    }
    assert len(previews) == 3
    for preview in previews.values():
        assert preview.startswith("x" * 2_000)
        assert preview.endswith(f"[cut: {len(whole):,} characters, showing the first 2,000]")
    assert len(json.dumps(events)) < 20_000


# -- errors ---------------------------------------------------------------------------------


def test_bad_submissions_are_refused_naming_the_field(client: httpx2.Client) -> None:
    unknown = client.post("/runs", json={"recipe": "nope"})
    message = error_of(unknown, 400, "unknown_recipe")
    assert "`recipe`" in message
    assert "ledger" in message
    inputs = client.post("/runs", json={"recipe": "ledger", "inputs": {"tga": "x"}})
    message = error_of(inputs, 400, "invalid_inputs")
    assert "unknown input 'tga'" in message
    assert "'tag' is required" in message
    neither = client.post("/runs", json={"inputs": {}})
    assert "`recipe`" in error_of(neither, 400)
    not_json = client.post(
        "/runs", content=b"{not json", headers={"content-type": "application/json"}
    )
    error_of(not_json, 400, "invalid_json")
    schema = client.post("/runs", json={"recipe": "ledger", "inputs": [1, 2]})
    assert "body.inputs" in error_of(schema, 422, "invalid_request")
    extra = client.post("/runs", json={"recipe": "ledger", "colour": "red"})
    assert "body.colour" in error_of(extra, 422)
    inline = client.post("/runs", json={"recipe_yaml": "id: x\nsteps: []\n"})
    assert "--allow-inline-recipes" in error_of(inline, 403, "forbidden")
    too_big = client.post("/runs", json={"recipe": "ledger", "inputs": {"tag": "x" * 2_000_000}})
    assert "larger than" in error_of(too_big, 413, "body_too_large")
    bad_limit = client.get("/runs", params={"limit": 0})
    assert "query.limit" in error_of(bad_limit, 422)
    bad_status = client.get("/runs", params={"status": "sleeping"})
    assert "query.status" in error_of(bad_status, 422)
    bad_cursor = client.get("/runs", params={"cursor": "%%%"})
    assert "`cursor`" in error_of(bad_cursor, 400)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/runs/nope"),
        ("GET", "/runs/nope/events"),
        ("GET", "/runs/nope/events/stream"),
        ("POST", "/runs/nope/cancel"),
        ("POST", "/runs/nope/resume"),
    ],
)
def test_an_unknown_run_is_a_404(client: httpx2.Client, method: str, path: str) -> None:
    assert "no run 'nope'" in error_of(client.request(method, path), 404, "unknown_run")


def test_other_errors_have_the_same_shape(client: httpx2.Client) -> None:
    approve = client.post("/runs/nope/approvals/c", json={"approve": True})
    error_of(approve, 404, "unknown_run")
    no_body = client.post("/runs/nope/approvals/c")
    error_of(no_body, 422)
    assert "no endpoint GET /nothing" in error_of(client.get("/nothing"), 404, "not_found")
    error_of(client.delete("/runs"), 405, "method_not_allowed")
    bad_id = client.get("/runs/x/events/stream", headers={"Last-Event-ID": "abc"})
    assert "Last-Event-ID" in error_of(bad_id, 400)
    error_of(client.get("/runs/x/events", params={"after": -1}), 422)
    error_of(client.get("/runs/x/events", params={"after": 2**70}), 422)


# -- recipes, workers -----------------------------------------------------------------------


def test_recipes_and_workers_are_listed(client: httpx2.Client) -> None:
    recipes = {r["id"]: r for r in client.get("/recipes").json()}
    assert set(recipes) == {"ledger", "slow", "release", "flaky", "chat", "big", "loop"}
    assert recipes["release"]["description"] == "Shout, once a person said yes."
    assert recipes["release"]["file"] == "approval.yaml"
    assert recipes["ledger"]["inputs"] == {
        "type": "object",
        "properties": {"tag": {"type": "string"}},
        "required": ["tag"],
    }
    [worker] = [w for w in client.get("/workers").json() if w["alive"]]
    assert worker["executor_id"]
    assert isinstance(worker["runs"], list)


# -- inline recipes -------------------------------------------------------------------------


def test_inline_recipes_name_only_built_in_tools_and_the_servers_own(
    service: ServerProcess, folder: Path, url: str
) -> None:
    """A second server over the same store (its worker is the first server's), taking inline
    recipes: built-in tools and the folder's own modules pass; anything else is refused
    before anything is imported."""
    (folder / "evil.py").write_text("raise SystemExit('imported!')\n")
    config = ServiceConfig(
        token=TOKEN, database_url=url, recipes=folder / "recipes", allow_inline_recipes=True
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as c,
    ):
        own = "id: own\ntools: [shouting]\nsteps: [{id: a, tool: shout, params: {text: hi}}]\n"
        accepted = c.post("/runs", json={"recipe_yaml": own})
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        with httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as main:
            assert until_status(main, run_id, "completed")["output"] == "HI"
        for tools, field in [
            ("[os]", "tools.0"),
            ("['../evil']", "tools.0"),
            ("[evil]", "tools.0"),
            ("['shouting', 'json:loads']", "tools.1"),
        ]:
            text = (
                f"id: bad\ntools: {tools}\nsteps: [{{id: a, tool: shout, params: {{text: hi}}}}]\n"
            )
            refused = c.post("/runs", json={"recipe_yaml": text})
            message = error_of(refused, 400, "invalid_recipe")
            assert f"field '{field}'" in message
            assert "recipes folder" in message
        outside = "id: sub\nsteps: [{id: a, recipe: ../evil.yaml}]\n"
        assert "include only recipes" in error_of(
            c.post("/runs", json={"recipe_yaml": outside}), 400
        )
        workspace = "id: w\nworkspace: /\nsteps: [{id: a, tool: list_files, params: {}}]\n"
        assert "workspace" in error_of(c.post("/runs", json={"recipe_yaml": workspace}), 400)
        broken = c.post("/runs", json={"recipe_yaml": "id: [\n"})
        error_of(broken, 400, "invalid_recipe")
        # An MCP stdio server is a command the server would start; a model endpoint would
        # receive the server's API key.
        proof = folder / "mcp-ran"
        mcp = (
            "id: m\nmcp_servers:\n  x: {command: touch, args: ['" + str(proof) + "']}\n"
            "steps: [{id: a, goal: hi, tools: ['x.*']}]\n"
        )
        assert "MCP servers" in error_of(c.post("/runs", json={"recipe_yaml": mcp}), 400)
        assert not proof.exists()
        for model in (
            "model: openai-compatible:m@http://203.0.113.9/v1\nsteps: [{id: a, goal: hi}]\n",
            "steps: [{id: a, goal: hi, model: 'ollama:m@http://203.0.113.9:11434/v1'}]\n",
        ):
            message = error_of(c.post("/runs", json={"recipe_yaml": "id: e\n" + model}), 400)
            assert "model endpoint" in message


def counting_parses(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """From now on, each recipe YAML text parsed, and whether it was parsed on an event loop."""
    from minions._yaml import load_yaml
    from minions.recipes import _loader

    parsed: list[tuple[str, bool]] = []

    def counted(text: str, file: str = "") -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        parsed.append((text, on_loop))
        return load_yaml(text, file)

    monkeypatch.setattr(_loader, "load_yaml", counted)
    return parsed


def test_an_inline_recipe_is_parsed_once_and_its_graph_names_each_steps_kind(
    service: ServerProcess, folder: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = counting_parses(monkeypatch)
    config = ServiceConfig(
        token=TOKEN, database_url=url, recipes=folder / "recipes", allow_inline_recipes=True
    )
    text = (
        "id: kinds\ntools: [shouting]\nsteps:\n"
        "  - {id: shout, tool: shout, params: {text: hi}}\n"
        "  - {id: judge, tool: llm_analyze, context: Judge it., input: hi}\n"
        "  - {id: think, analyze: What is it?, input: hi}\n"
        "  - {id: ask, goal: Ask.}\n"
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as c,
    ):
        parsed.clear()  # the server read its folder's recipes when it started
        made = c.post("/runs", json={"recipe_yaml": text})
        assert made.status_code == 201, made.text
        assert parsed == [(text, False)]  # checked, built and stored from one parse, off the loop
        graph = c.get(f"/runs/{made.json()['run_id']}").json()["graph"]
    assert {n["id"]: n["kind"] for n in graph} == {
        "shout": "tool",
        "judge": "analysis",  # as `StepSpec.kind` says: `tool: llm_analyze` is an analysis
        "think": "analysis",
        "ask": "agent",
    }


def test_an_inline_rerun_and_its_preview_parse_the_recipe_once_off_the_event_loop(
    service: ServerProcess, folder: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServiceConfig(
        token=TOKEN, database_url=url, recipes=folder / "recipes", allow_inline_recipes=True
    )
    text = (
        "id: twice\ntools: [shouting]\ninputs: {text: {type: string, default: hi}}\nsteps:\n"
        "  - {id: one, tool: shout, params: {text: one}}\n"
        '  - {id: two, depends_on: [one], tool: shout, params: {text: "{{ inputs.text }}"}}\n'
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as c,
    ):
        made = c.post("/runs", json={"recipe_yaml": text})
        assert made.status_code == 201, made.text
        parent = made.json()["run_id"]
        with httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as main:
            assert until_status(main, parent, "completed")["output"] == "HI"
        parsed = counting_parses(monkeypatch)
        body = {"from_step": "two", "inputs": {"text": "again"}}
        shown = c.post(f"/runs/{parent}/rerun/preview", json=body)
        assert shown.status_code == 200, shown.text
        assert parsed == [(text, False)]  # checked, built and planned from one parse
        parsed.clear()
        rerun = c.post(f"/runs/{parent}/rerun", json=body)
        assert rerun.status_code == 201, rerun.text
        assert parsed == [(text, False)]
    assert {k: shown.json()[k] for k in ("reused", "rerun", "editable")} == {
        "reused": ["one"],
        "rerun": ["two"],
        "editable": ["one"],
    }
    assert {k: rerun.json()[k] for k in ("reused", "rerun")} == {
        "reused": ["one"],
        "rerun": ["two"],
    }


def test_a_runs_graph_is_parsed_once_for_every_read_and_a_damaged_stored_recipe_draws_none(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy as sa

    import minions.recipes

    parse_spec = minions.recipes.parse_spec
    parsed: list[str] = []

    def counted(text: str, *args: Any, **kwargs: Any) -> Any:
        parsed.append(text)
        return parse_spec(text, *args, **kwargs)

    url = f"sqlite:///{tmp_path / 'minions.db'}"  # no worker takes its run
    config = ServiceConfig(
        token=TOKEN, database_url=url, recipes=folder / "recipes", allow_inline_recipes=True
    )
    # A text no other test stores: no graph of it is kept yet in this process.
    text = (
        f"id: graphed\ndescription: run {uuid.uuid4().hex}\nsteps:\n"
        "  - {id: a, goal: A.}\n  - {id: b, goal: B., depends_on: [a]}\n"
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as c,
    ):
        made = c.post("/runs", json={"recipe_yaml": text})
        assert made.status_code == 201, made.text
        run_id = made.json()["run_id"]
        monkeypatch.setattr(minions.recipes, "parse_spec", counted)
        graphs = [c.get(f"/runs/{run_id}").json()["graph"] for _ in range(2)]
        step = c.get(f"/runs/{run_id}/steps/b")
        assert parsed == [text]  # two reads of the run and one of its step: one parse
        assert graphs[0] == graphs[1]
        assert graphs[0] == [
            {"id": "a", "kind": "agent", "depends_on": [], "next": []},
            {"id": "b", "kind": "agent", "depends_on": ["a"], "next": []},
        ]
        assert step.status_code == 200, step.text
        assert step.json()["kind"] == "agent"
        engine = sa.create_engine(url)
        try:
            with engine.begin() as db:
                db.execute(
                    sa.text("UPDATE minions_runs SET recipe_yaml = :text WHERE run_id = :run"),
                    {"text": "id: graphed\nsteps: [oops", "run": run_id},
                )
        finally:
            engine.dispose()
        damaged = c.get(f"/runs/{run_id}")
        assert damaged.status_code == 200, damaged.text
        assert damaged.json()["graph"] == []
        assert c.get(f"/runs/{run_id}/steps/b").status_code == 404  # in no recipe, no event


# -- the token ------------------------------------------------------------------------------


def test_the_token_is_generated_once_owner_only_and_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MINIONS_API_TOKEN", raising=False)
    url = f"sqlite:///{tmp_path / 'db' / 'minions.db'}"
    first = load_token(url)
    assert first.new
    assert first.file == tmp_path / "db" / "api-token"
    assert stat.S_IMODE(os.stat(first.file).st_mode) == 0o600
    again = load_token(url)
    assert (again.value, again.new) == (first.value, False)
    monkeypatch.setenv("MINIONS_API_TOKEN", "from-env")
    assert load_token(url).value == "from-env"
    monkeypatch.delenv("MINIONS_API_TOKEN")
    first.file.chmod(0o644)
    with pytest.raises(MinionsError, match="chmod 600"):
        load_token(url)


def test_serve_refuses_a_missing_folder_and_a_token_file_others_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from minions.cli._app import app

    monkeypatch.delenv("MINIONS_API_TOKEN", raising=False)
    url = f"sqlite:///{tmp_path / 'db' / 'minions.db'}"
    missing = CliRunner().invoke(
        app, ["serve", "--recipes", str(tmp_path / "nope"), "--database-url", url]
    )
    assert missing.exit_code == 2
    assert "--recipes: no such folder" in missing.output
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "api-token").write_text("t0ken\n")
    (tmp_path / "db" / "api-token").chmod(0o644)
    exposed = CliRunner().invoke(app, ["serve", "--database-url", url])
    assert exposed.exit_code == 2
    assert "chmod 600" in " ".join(exposed.output.split())
    assert "Traceback" not in exposed.output
