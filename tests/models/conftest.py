"""Fixtures for provider tests: fast retries, and a clean memory of endpoint capabilities."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minions import ExecutionConfig
from minions.models._structured import capabilities

FAST = ExecutionConfig(retry_initial_delay=0.01, retry_max_delay=0.05)
"""Tiny backoff, so retries cost milliseconds."""


@pytest.fixture(autouse=True)
def _fresh_capabilities() -> Iterator[None]:
    # A stopped server's port can be reused by the next test's server: forget what was learned.
    capabilities.forget()
    yield
    capabilities.forget()


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MINIONS_MODEL", "OLLAMA_HOST"):
        monkeypatch.delenv(name, raising=False)
