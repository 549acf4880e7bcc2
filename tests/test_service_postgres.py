"""Several processes on one Postgres: `minions serve --no-worker` and two `minions worker`; runs
submitted through the API complete on the workers, and each run's event stream is complete
(LISTEN/NOTIFY wakes the API's streams)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from postgres import cluster, fresh_database
from runs_helpers import STEPS, ledger_lines, worker
from service_helpers import auth, read_stream, server, write_recipes

pytestmark = pytest.mark.slow


def test_an_api_process_and_two_workers_share_one_postgres(tmp_path: Path) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    ledger = tmp_path / "ledger.txt"
    with cluster() as postgres:
        url = fresh_database(postgres, "service")
        with (
            server(tmp_path, url, "--no-worker", "--recipes", str(recipes)) as api,
            worker(url, tmp_path, "w1", ledger),
            worker(url, tmp_path, "w2", ledger),
            httpx2.Client(base_url=api.base, headers=auth(), timeout=60) as client,
        ):
            alive = {w["executor_id"] for w in client.get("/workers").json() if w["alive"]}
            assert alive == {"w1", "w2"}  # the API process runs nothing itself
            run_ids = []
            for n in range(6):
                made = client.post("/runs", json={"recipe": "ledger", "inputs": {"tag": f"p{n}"}})
                assert made.status_code == 201, made.text
                run_ids.append(made.json()["run_id"])
            for run_id in run_ids:
                path = f"/runs/{run_id}/events/stream"
                with client.stream("GET", path) as response:
                    messages = read_stream(response)
                stored = client.get(f"/runs/{run_id}/events").json()
                assert [int(m["id"]) for m in messages] == list(range(1, len(stored) + 1))
                assert [m["data"] for m in messages] == stored
                assert messages[-1]["event"] == "run_completed"
                run = client.get(f"/runs/{run_id}").json()
                assert run["status"] == "completed"
                assert run["executor_id"] in {"w1", "w2"}
    done = [(run, step) for run, step, _ in ledger_lines(ledger)]
    assert sorted(done) == sorted((f"p{n}", s) for n in range(6) for s in STEPS)
