"""Health that tells the truth, and logs that stay JSON, through a Postgres outage: the team
topology (`minions serve --no-worker` and a `minions worker`, both ``--log-format json``);
while Postgres is stopped `/health/ready` (and `/health`) of the server and the worker's
``--health-port`` probe say 503 with the reason, ``/metrics`` says ``minions_store_up 0``;
once it is back they say 200 again. Every line either process wrote parses as JSON, and the
worker said the outage once when it went and once when it was back."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from postgres import cluster, fresh_database, pg_ctl
from runs_helpers import worker
from service_helpers import auth, free_port, server, write_recipes

pytestmark = pytest.mark.slow


def until(check: Callable[[], bool], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        time.sleep(0.1)


def status(url: str) -> int:
    try:
        return httpx2.get(url, timeout=10).status_code
    except httpx2.TransportError:
        return 0


def json_lines(path: Path) -> list[dict[str, object]]:
    """Every line of a log, each parsed as JSON (a line that is not JSON fails the test)."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"{path.name}:{number} is not JSON: {line!r}") from None
    return records


def test_probes_and_json_logs_through_a_postgres_outage(tmp_path: Path) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    health = free_port()
    with cluster() as postgres:
        url = fresh_database(postgres, "fleet")
        with (
            server(
                tmp_path,
                url,
                "--no-worker",
                "--metrics",
                "--recipes",
                str(recipes),
                MINIONS_LOG_FORMAT="json",
            ) as api,
            worker(
                url, tmp_path, "w1", tmp_path / "ledger", "--health-port", str(health),
                "--log-format", "json",
            ) as running,
        ):  # fmt: skip
            ready, probe = f"{api.base}/health/ready", f"http://127.0.0.1:{health}/health/ready"
            until(lambda: status(probe) == 200)
            assert status(ready) == 200
            assert status(f"{api.base}/health/live") == 200

            pg_ctl(url, "stop")
            until(lambda: status(ready) == 503 and status(probe) == 503)
            answer = httpx2.get(ready, timeout=10).json()
            assert answer == {"status": "unavailable", "reason": "the run store cannot be reached"}
            said = httpx2.get(f"{api.base}/health", timeout=10)
            assert (said.status_code, said.json()["status"]) == (503, "unavailable")
            assert status(f"{api.base}/health/live") == 200  # the process is fine
            reason = httpx2.get(probe, timeout=10).json()["reason"]
            assert reason in ("the run store cannot be reached", "the worker is degraded")
            scraped = httpx2.get(f"{api.base}/metrics", headers=auth(), timeout=30)
            assert "minions_store_up 0.0" in scraped.text
            assert "127.0.0.1" not in answer["reason"]
            until(lambda: "run store unavailable" in running.log.read_text())

            pg_ctl(url, "start")
            until(lambda: status(ready) == 200 and status(probe) == 200)
            until(lambda: "run store back" in running.log.read_text())
            scraped = httpx2.get(f"{api.base}/metrics", headers=auth(), timeout=30)
            assert "minions_store_up 1.0" in scraped.text
        worker_log = json_lines(running.log)
        json_lines(api.log)
    events = [str(record.get("event", "")) for record in worker_log]
    assert sum(e.startswith("run store unavailable") for e in events) == 1, events
    assert sum(e.startswith("run store back") for e in events) == 1, events
    assert all("\n" not in line for line in running.log.read_text().splitlines())
