"""The claim, measured on a real model (`make test-live`): the same three-step recipe with each
step in a fresh conversation and with the full history (`memory: agent`), on SmolLM2-135M,
every case 5 times (docs/evals.md, "Fresh context or full history").

The pass rates are what they are: the test checks that every case run was a real, graded run
on both recipes and prints the two side by side (``EVAL_CLAIM_REPEAT`` sets the repeat).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minions.cli._app import app
from minions.models import OpenAIChatModel

from .conftest import LiveServer

pytestmark = pytest.mark.live

CLAIM = Path(__file__).parent / "claim" / "people.eval.yaml"


def test_fresh_context_and_full_history_side_by_side(smollm2: LiveServer, tmp_path: Path) -> None:
    from minions.cli._app import Settings

    repeat = os.environ.get("EVAL_CLAIM_REPEAT", "5")
    settings = Settings(
        resolve_model=lambda spec: OpenAIChatModel(
            smollm2.model, base_url=smollm2.base_url, api_key="local", timeout=300
        )
    )
    out = tmp_path / "claim.json"
    result = CliRunner().invoke(
        app,
        ["eval", str(CLAIM), "--model", "live", "--repeat", repeat, "--concurrency", "2",
         "--out", str(out), "-q"],
        obj=settings,
    )  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    report = json.loads(out.read_text())
    assert report["errors"] == 0, report["cases"]
    runs = {"fresh": 0, "full_history": 0}
    tokens = {"fresh": 0, "full_history": 0}
    passed = {"fresh": 0, "full_history": 0}
    for case in report["cases"]:
        runs[case["target"]] += case["runs"]
        tokens[case["target"]] += case["tokens"]
        passed[case["target"]] += case["passed"]
    assert runs == {"fresh": 4 * int(repeat), "full_history": 4 * int(repeat)}
    for target in runs:
        print(
            f"{target}: {passed[target]}/{runs[target]} passed, "
            f"{tokens[target] / runs[target]:.0f} tokens a run"
        )
