"""Shared fixtures and checks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import structlog

from minions import ExecutionConfig, Message, Step, StepInput, tool

FAST = ExecutionConfig(retry_initial_delay=0.0, tool_retry_initial_delay=0.0)
"""Retries without waiting, for tests."""


@pytest.fixture(autouse=True)
def _unconfigured_structlog() -> Iterator[None]:
    # `structlog.testing.capture_logs` leaves structlog "configured" when it restores the
    # processors; the library logs only for applications that configured structlog, so each
    # test starts from an application that did not.
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server for the session (tests/postgres.py)."""
    from postgres import cluster

    with cluster() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh run store: SQLite in a temporary folder, or a new database on a real Postgres."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    from postgres import fresh_database

    server: str = request.getfixturevalue("postgres")
    return fresh_database(server, f"t{uuid.uuid4().hex[:12]}")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Lookup(Step):
    """A step class of a user's own that names no `kind`: it calls its model like any step."""

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []


class Offline(Lookup):
    """A step class of a user's own that calls no model."""

    kind = "offline"

    def uses_model(self) -> bool:
        return False


def assert_tool_invariant(messages: Sequence[Message]) -> None:
    """Every assistant message with tool calls is followed by exactly one tool result per call
    id, in order, before the next non-tool message."""
    i = 0
    while i < len(messages):
        message = messages[i]
        if message.role == "tool":
            raise AssertionError(f"tool result {message.tool_call_id!r} answers no open call")
        if message.role == "assistant" and message.tool_calls:
            expected = [c.id for c in message.tool_calls]
            answered = []
            j = i + 1
            while j < len(messages) and messages[j].role == "tool":
                answered.append(messages[j].tool_call_id)
                j += 1
            assert answered == expected, f"calls {expected} answered by {answered}"
            i = j
            continue
        i += 1


@pytest.fixture
def fast_config() -> ExecutionConfig:
    return FAST
