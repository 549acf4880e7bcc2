"""``minions serve --metrics`` scraped as Prometheus scrapes it, read with Prometheus's own text
parser: during runs behind a saturated endpoint, with a dead worker on the store, the store's
gauges and the process's metrics have the names, labels and values they should; after them,
the totals. ``/metrics`` needs the token unless ``--metrics-public``; the queue's depth and
age and the schedules' lateness come from the store at each scrape."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from service_helpers import app_in_thread, auth, server, submit, write_chat_recipe

from minions.runs import RunStore, _workers
from minions.runs._db import Database
from minions.service import ServiceConfig, create_app
from minions.testing import FakeOpenAIServer, FakeReply

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: httpx2.Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    found: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def named(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def until(check: Callable[[], bool], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        time.sleep(0.05)


def dead_worker(url: str) -> None:
    """A worker record whose heartbeats stopped a minute ago (killed, not stopped)."""
    store = Database(url)
    try:
        _workers.register(store, "gone", incarnation="x", version="v", host="h", pid=1)
        with store.begin() as db:
            db.execute(
                sa.text("UPDATE minions_workers SET heartbeat_at = :at WHERE executor_id = 'gone'"),
                {"at": time.time() - 60},
            )
    finally:
        store.close()


def test_a_scrape_during_a_saturated_endpoint_and_a_dead_worker(tmp_path: Path) -> None:
    gate = threading.Event()
    with FakeOpenAIServer(lambda _: FakeReply.text("Bees dance."), gate=gate) as model:
        recipes = tmp_path / "recipes"
        recipes.mkdir()
        write_chat_recipe(recipes, f"http://127.0.0.1:{model.port}")
        limits = tmp_path / "limits.yaml"
        endpoint = model.url
        limits.write_text(f"endpoints:\n  - {{match: '{endpoint}', max_concurrent: 1}}\n")
        url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
        args = ("--metrics", "--recipes", str(recipes), "--limits", str(limits))
        with (
            server(tmp_path, url, *args) as service,
            httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client,
        ):
            assert httpx2.get(service.base + "/metrics").status_code == 401  # the token
            dead_worker(url)
            runs = [submit(client, "chat") for _ in range(3)]
            until(lambda: model.in_flight == 1)

            def saturated() -> bool:
                samples = scrape(client)
                return value(samples, "minions_model_call_waiters", endpoint=endpoint) == 2

            until(saturated)
            samples = scrape(client)
            assert value(samples, "minions_store_up") == 1
            assert value(samples, "minions_model_calls_in_flight", endpoint=endpoint) == 1
            assert value(samples, "minions_endpoint_calls_in_flight", endpoint=endpoint) == 1
            assert value(samples, "minions_endpoint_waiting_workers", endpoint=endpoint) == 1
            assert value(samples, "minions_endpoint_requests_last_minute", endpoint=endpoint) == 1
            assert value(samples, "minions_runs_running") == 3  # waiting runs are running
            assert value(samples, "minions_runs_queued") == 0
            assert value(samples, "minions_runs_oldest_queued_seconds") == 0
            assert value(samples, "minions_runs_waiting_approval") == 0
            assert value(samples, "minions_workers_alive") == 1
            assert value(samples, "minions_workers_dead") == 1
            assert named(samples, "minions_runs_total") == {}  # none ended yet

            # A run cancelled while its call waits for the endpoint ends as cancelled.
            def kinds(run_id: str) -> list[str]:
                return [e["kind"] for e in client.get(f"/runs/{run_id}/events").json()]

            def waiting_runs() -> list[str]:
                found = [(r, kinds(r)) for r in runs]
                return [
                    r
                    for r, k in found
                    if "model_call_waiting" in k and "model_call_started" not in k
                ]

            until(lambda: bool(waiting_runs()))
            waiting = waiting_runs()[0]
            assert client.post(f"/runs/{waiting}/cancel").status_code == 200
            until(lambda: client.get(f"/runs/{waiting}").json()["status"] == "cancelled")
            gate.set()

            def ended() -> bool:
                statuses = {client.get(f"/runs/{r}").json()["status"] for r in runs}
                return statuses == {"completed", "cancelled"}

            until(ended)
            samples = scrape(client)
    assert value(samples, "minions_runs_total", recipe="chat", status="completed") == 2
    assert value(samples, "minions_runs_total", recipe="chat", status="cancelled") == 1
    assert value(samples, "minions_model_calls_in_flight", endpoint=endpoint) == 0
    assert value(samples, "minions_model_call_waiters", endpoint=endpoint) == 0
    assert value(samples, "minions_run_duration_seconds_count", recipe="chat") == 3
    assert value(samples, "minions_run_wait_seconds_count", recipe="chat") == 3
    steps = {"recipe": "chat", "step": "answer"}
    assert value(samples, "minions_step_duration_seconds_count", **steps) == 3
    assert value(samples, "minions_step_wait_seconds_count", **steps) == 3
    waited = value(samples, "minions_step_wait_seconds_sum", **steps)
    assert waited is not None
    assert waited > 0  # the runs behind the first waited for the endpoint
    tokens = named(samples, "minions_tokens_total")
    assert {dict(labels)["kind"] for labels in tokens} == {"input", "output"}
    assert {dict(labels)["recipe"] for labels in tokens} == {"chat"}
    assert all(v > 0 for v in tokens.values())
    usage = named(samples, "gen_ai_client_token_usage_count")
    assert {dict(labels)["gen_ai_token_type"] for labels in usage} == {"input", "output"}
    assert all(dict(labels)["gen_ai_operation_name"] == "chat" for labels in usage)
    durations = named(samples, "gen_ai_client_operation_duration_seconds_count")
    assert sum(durations.values()) == 2  # the cancelled run's call was never sent
    # No run id is ever a label.
    for run_id in runs:
        assert not any(run_id in str(labels) for (_, labels) in samples)


def test_the_queue_and_late_schedules_are_read_at_each_scrape(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "hello.yaml").write_text("id: hello\nsteps:\n  - {id: hi, goal: say hi}\n")
    config = ServiceConfig(
        token="t" * 32, database_url=url, recipes=recipes, metrics=True, metrics_public=True
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, timeout=30) as client,  # public: no token
    ):
        empty = scrape(client)
        assert value(empty, "minions_runs_queued") == 0
        assert value(empty, "minions_workers_alive") == 0
        headers = auth("t" * 32)
        for _ in range(2):
            made = client.post("/runs", json={"recipe": "hello"}, headers=headers)
            assert made.status_code == 201, made.text

        async def schedule() -> None:
            async with RunStore(url) as store:
                await store.add_schedule(recipes / "hello.yaml", every="1h", name="nightly")
                await store.add_schedule(recipes / "hello.yaml", every="1h", name="paused")
                await store.pause_schedule("paused")

        asyncio.run(schedule())
        store = Database(url)
        try:
            with store.begin() as db:
                db.execute(
                    sa.text("UPDATE minions_schedules SET next_at = :at"),
                    {"at": time.time() - 120},
                )
                # What a tick records of a slot skipped while a run of it was active.
                db.execute(
                    sa.text(
                        "UPDATE minions_schedules SET late = :late, late_slots = 3, "
                        "late_reason = 'overlap' WHERE name = 'nightly'"
                    ),
                    {"late": True},
                )
        finally:
            store.close()
        samples = scrape(client)
    assert value(samples, "minions_runs_queued") == 2
    oldest = value(samples, "minions_runs_oldest_queued_seconds")
    assert oldest is not None
    assert oldest > 0
    lag = named(samples, "minions_schedule_lag_seconds")
    assert list(lag) == [(("schedule", "nightly"),)]  # a paused schedule is never late
    assert lag[(("schedule", "nightly"),)] >= 120
    assert named(samples, "minions_schedule_late") == {(("schedule", "nightly"),): 1.0}
    assert named(samples, "minions_schedule_late_slots_total") == {(("schedule", "nightly"),): 3.0}
