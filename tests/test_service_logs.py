"""What a `minions serve` process writes in its log when requests fail: each failure once,
briefly (a traceback without local variables), with no secret in it (the token, an API key),
whoever logs it; and the server goes on answering while a hundred requests fail at once.

The server is a real process whose `GET /workers` is patched to fail (after waiting for the
test's go, so that a hundred such requests are in flight together), with the token and an
API key in the exception's message, in a local variable, and in lines logged through the
standard library and structlog on the way."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest
from service_helpers import BAD_INPUTS, TOKEN, auth, raw_request, server, write_recipes

pytestmark = pytest.mark.slow

API_KEY = "sk-test-api-key-0123456789"
IN_FLIGHT = 100

FAILING = """\
import asyncio, logging, os, sys, uuid
from pathlib import Path

import structlog

from minions.runs import RunStore


async def workers(self):
    Path(os.environ["ARRIVED"], uuid.uuid4().hex).touch()
    while not Path(os.environ["GO"]).exists():
        await asyncio.sleep(0.01)
    hidden_local_value = "LOCAL " + os.environ["MINIONS_API_TOKEN"]
    logging.getLogger("some.library").warning("calling with key %s", os.environ["OPENAI_API_KEY"])
    try:
        raise ValueError("inner " + hidden_local_value)
    except ValueError:
        structlog.get_logger("some.module").exception("handled", key=os.environ["OPENAI_API_KEY"])
    raise RuntimeError(
        "the store refused token " + os.environ["MINIONS_API_TOKEN"]
        + " and key " + os.environ["OPENAI_API_KEY"]
    )


RunStore.workers = workers
from minions.cli import main

sys.argv = ["minions", *sys.argv[1:]]
main()
"""


def test_failures_are_logged_once_briefly_without_secrets_and_stall_nothing(
    tmp_path: Path,
) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    arrived, go = tmp_path / "arrived", tmp_path / "go"
    arrived.mkdir()
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with server(
        tmp_path,
        url,
        "--recipes",
        str(recipes),
        python=("-c", FAILING),
        ARRIVED=str(arrived),
        GO=str(go),
        OPENAI_API_KEY=API_KEY,
    ) as service:
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            failing = [
                pool.submit(httpx2.get, service.base + "/workers", headers=auth(), timeout=120)
                for _ in range(IN_FLIGHT)
            ]
            ready = threading.Event()
            for _ in range(2400):  # until every request is in the server
                if len(list(arrived.iterdir())) == IN_FLIGHT:
                    ready.set()
                    break
                ready.wait(0.05)
            assert ready.is_set()
            # While a hundred requests are in flight, and while they fail together, the
            # server answers (within a timeout far above the normal time: never a measure).
            assert httpx2.get(service.base + "/health", timeout=30).status_code == 200
            go.touch()
            assert httpx2.get(service.base + "/health", timeout=30).status_code == 200
            answers = [f.result() for f in failing]
        assert [a.status_code for a in answers] == [500] * IN_FLIGHT
        assert {a.json()["error"]["type"] for a in answers} == {"internal_error"}
        assert all(TOKEN not in a.text and "Traceback" not in a.text for a in answers)
        # Every bad input is refused, never failing the server.
        for _, method, target, headers, body, status, _ in BAD_INPUTS:
            assert raw_request(service.port, method, target, headers, body)[0] == status
        assert httpx2.get(service.base + "/health", timeout=30).status_code == 200
    log = service.log.read_text() + service.out.read_text()
    assert TOKEN not in log
    assert API_KEY not in log
    assert log.count("request failed") == IN_FLIGHT  # once each, by the service
    assert "Exception in ASGI application" not in log  # not a second time, by uvicorn
    assert log.count("the store refused token [redacted] and key [redacted]") == IN_FLIGHT
    assert log.count("calling with key [redacted]") == IN_FLIGHT  # the standard library's
    assert log.count("ValueError: inner LOCAL [redacted]") == IN_FLIGHT  # structlog's
    assert "hidden_local_value =" not in log  # no local variables
    assert "Traceback (most recent call last)" in log
    assert service.out.read_text() == ""  # stdout is for the token, printed once
