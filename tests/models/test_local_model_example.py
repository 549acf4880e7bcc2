"""examples/local_model.py runs offline, against its `FakeOpenAIServer`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local_model.py"


def test_local_model_example_runs_offline() -> None:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("MINIONS_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OLLAMA_HOST")
    }
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "offline: FakeOpenAIServer at http://127.0.0.1:" in out
    assert "Let me look up the forecast for Oslo." in out  # Streamed tokens.
    assert 'tool get_forecast -> {"city":"Oslo","sky":"rain","celsius":9}' in out
    assert "output mode tool" in out
    assert "Advice(city='Oslo', umbrella=True" in out
    assert result.stderr == ""
