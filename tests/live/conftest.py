"""Servers for the live suite (`make test-live`): real llama.cpp servers with real small models.

`MINIONS_LIVE_BASE_URL` (and `MINIONS_LIVE_MODEL`) name a running server to use for SmolLM2's
tests; otherwise ``../shared/tools/local-llm`` starts one (it builds llama-server once, about
12 minutes, then caches it). Gemma 3 270M is always started with its official chat template,
which refuses two messages of one role in a row.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

LOCAL_LLM = Path(__file__).resolve().parents[3] / "shared" / "tools" / "local-llm"


@dataclass(frozen=True)
class LiveServer:
    base_url: str
    model: str


def _start(*args: str) -> tuple[LiveServer, str]:
    if not LOCAL_LLM.exists():
        pytest.fail(f"the live suite needs {LOCAL_LLM} or MINIONS_LIVE_BASE_URL")
    done = subprocess.run(
        [str(LOCAL_LLM), "start", *args], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        pytest.fail(f"local-llm start {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    fields = dict(part.split("=", 1) for part in done.stdout.split())
    return LiveServer(fields["base_url"], fields["model"]), fields["pid"]


def _stop(pid: str) -> None:
    subprocess.run([str(LOCAL_LLM), "stop", pid], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def smollm2() -> Iterator[LiveServer]:
    given = os.environ.get("MINIONS_LIVE_BASE_URL")
    if given:
        yield LiveServer(given, os.environ.get("MINIONS_LIVE_MODEL", "smollm2"))
        return
    server, pid = _start("smollm2")
    try:
        yield server
    finally:
        _stop(pid)


@pytest.fixture(scope="session")
def gemma_strict() -> Iterator[LiveServer]:
    templates = subprocess.run(
        [str(LOCAL_LLM), "templates"], capture_output=True, text=True, timeout=60
    ).stdout.strip()
    template = f"{templates}/google-gemma-2-2b-it.jinja"
    server, pid = _start("gemma3-270m", "--", "--chat-template-file", template)
    try:
        yield server
    finally:
        _stop(pid)
