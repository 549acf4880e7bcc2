"""Fixtures for provider tests: fast retries, no provider settings from the environment.

What a model learns about its endpoint is its own (`CapabilityMemory`), so tests need no
cleaning between them."""

from __future__ import annotations

import pytest

from minions import ExecutionConfig

FAST = ExecutionConfig(retry_initial_delay=0.01, retry_max_delay=0.05)
"""Tiny backoff, so retries cost milliseconds."""


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MINIONS_MODEL", "OLLAMA_HOST"):
        monkeypatch.delenv(name, raising=False)
