"""A diff of two runs runs off the service's event loop (a diff of big outputs takes about a
second to compute and shape: /health and every other request are answered meanwhile), and
within a bound: beyond `MAX_DIFF_VALUES` values of step outputs it is a clear 422 from the API
and exit 2 from `minions runs diff`, not a second of the server for each request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from runs_helpers import minions, run_here
from service_helpers import app_in_thread, auth

import minions.runs._diff as diff_module
import minions.service._routes.rerun as diff_route
from minions.errors import DiffTooLargeError
from minions.runs import RunStore
from minions.runs._diff import MAX_DIFF_VALUES
from minions.service import ServiceConfig, create_app

pytestmark = pytest.mark.slow

TOKEN = "t" * 40

ITEMS = '''
from minions import tool

@tool
def items(n: int, salt: str) -> list[int | str]:
    """n numbers, the last one salted."""
    return [*range(n - 1), salt]
'''

RECIPE = """\
id: items
tools: [tools]
inputs: {n: {type: integer}, salt: {type: string}}
steps:
  - {id: make, tool: items, params: {n: "{{ inputs.n }}", salt: "{{ inputs.salt }}"}}
"""


async def two_runs(url: str, folder: Path, n: int) -> tuple[str, str]:
    """Two finished runs whose one output is a list of `n` values, differing in the last."""
    (folder / "tools.py").write_text(ITEMS)
    (folder / "items.yaml").write_text(RECIPE)
    store = RunStore(url, create=True)
    try:
        ids = []
        for salt in ("a", "b"):
            run_id, _ = await store.submit(folder / "items.yaml", {"n": n, "salt": salt})
            await run_here(url, run_id)
            assert (await store.get(run_id)).status == "completed"
            ids.append(run_id)
    finally:
        await store.aclose()
    return ids[0], ids[1]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'minions.db'}"


@pytest.fixture(params=["the diff", "its answer"])
def held_diff(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The diff (or the shaping of its answer), held until the test says: (started,
    release)."""
    started, release = threading.Event(), threading.Event()
    module, name = {
        "the diff": (diff_module, "diff_runs"),
        "its answer": (diff_route, "_diff_json"),
    }[request.param]
    real = getattr(module, name)

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, held)
    try:
        yield started, release
    finally:
        release.set()


def test_the_server_answers_while_a_diff_runs(
    tmp_path: Path, store_url: str, held_diff: tuple[threading.Event, threading.Event]
) -> None:
    started, release = held_diff
    run_a, run_b = asyncio.run(two_runs(store_url, tmp_path, 50))
    config = ServiceConfig(token=TOKEN, database_url=store_url)
    answers: list[httpx2.Response] = []
    with app_in_thread(create_app(config)) as base:

        def ask_for_the_diff() -> None:
            with httpx2.Client(base_url=base, headers=auth(TOKEN), timeout=120) as client:
                answers.append(client.get(f"/runs/{run_a}/diff/{run_b}"))

        asking = threading.Thread(target=ask_for_the_diff)
        asking.start()
        assert started.wait(timeout=60), "the diff never started"
        try:
            # The diff is held mid-way: the server must still answer.
            with httpx2.Client(base_url=base, headers=auth(TOKEN), timeout=30) as client:
                health = client.get("/health")
                shown = client.get(f"/runs/{run_a}")
        finally:
            release.set()
        asking.join(timeout=120)
        assert health.status_code == 200
        assert shown.status_code == 200
        assert not answers or answers[0].status_code == 200  # (not before `release`)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["first_divergence"] == "make"
    assert body["steps"][0]["changes"] == [{"path": "$[49]", "a": "a", "b": "b"}]


def test_a_diff_beyond_the_bound_is_a_422_naming_it(tmp_path: Path, store_url: str) -> None:
    run_a, run_b = asyncio.run(two_runs(store_url, tmp_path, 60))
    config = ServiceConfig(token=TOKEN, database_url=store_url, max_diff_values=100)
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(TOKEN), timeout=60) as client,
    ):
        refused = client.get(f"/runs/{run_a}/diff/{run_b}")
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["type"] == "diff_too_large"
        assert error["message"] == (
            f"runs {run_a} and {run_b} are too large to diff: their step outputs hold more "
            "than 100 JSON values (the most one diff compares)"
        )
        assert client.get("/health").status_code == 200


def test_the_default_bound_holds_in_python_and_on_the_command_line(
    tmp_path: Path, store_url: str
) -> None:
    n = MAX_DIFF_VALUES // 2 + 1  # two lists of n values: more than the bound together
    run_a, run_b = asyncio.run(two_runs(store_url, tmp_path, n))

    async def diff(**bound: Any) -> Any:
        store = RunStore(store_url)
        try:
            return await store.diff(run_a, run_b, **bound)
        finally:
            await store.aclose()

    with pytest.raises(DiffTooLargeError, match=f"more than {MAX_DIFF_VALUES:,} JSON values"):
        asyncio.run(diff())
    assert asyncio.run(diff(max_values=2 * n + 2)).first_divergence == "make"

    refused = minions("runs", "diff", run_a, run_b, "--database-url", store_url)
    assert refused.returncode == 2
    assert f"more than {MAX_DIFF_VALUES:,} JSON values" in refused.stderr
    assert "--max-values" in refused.stderr
    assert "Traceback" not in refused.stderr
    allowed = minions(
        "runs", "diff", run_a, run_b, "--max-values", str(2 * n + 2), "--database-url", store_url
    )
    assert allowed.returncode == 0, allowed.stderr
    assert "first divergence: make" in allowed.stdout
    bad = minions("runs", "diff", run_a, run_b, "--max-values", "0", "--database-url", store_url)
    assert bad.returncode == 2
