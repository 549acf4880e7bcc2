"""`minions serve` logs a run that failed normally (a step failed: no bug of anyone's) in one
line, the run's id and the cause, like `minions worker`: not DBOS's traceback of forty lines."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from service_helpers import auth, read_stream, server, submit, write_recipes

pytestmark = pytest.mark.slow


def test_a_failed_run_is_one_line_of_the_serve_log(tmp_path: Path) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with (
        server(tmp_path, url, "--recipes", str(recipes), FLAKY_OK=str(tmp_path / "never")) as api,
        httpx2.Client(base_url=api.base, headers=auth(), timeout=60) as client,
    ):
        run_id = submit(client, "flaky")
        with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
            assert read_stream(response)[-1]["event"] == "run_failed"
        assert client.get(f"/runs/{run_id}").json()["status"] == "failed"
    log = api.log.read_text()
    assert "Traceback" not in log, log
    said = [line for line in log.splitlines() if run_id in line]
    assert len(said) == 1, log
    assert "second" in said[0]  # the step that failed, and why
    assert "not yet" in said[0]
