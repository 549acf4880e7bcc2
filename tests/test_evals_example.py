"""The eval shipped in examples/evals runs offline from its recordings, and the recordings are
what the stand-in models make today."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from minions.cli._app import app

EXAMPLE = Path(__file__).parent.parent / "examples" / "evals"


def test_the_example_eval_replays_offline() -> None:
    result = CliRunner().invoke(
        app,
        [
            "eval",
            str(EXAMPLE / "capitals.eval.yaml"),
            "--replay",
            str(EXAMPLE / "recordings"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["mode"], report["errors"], report["judge_model"]) == (
        "replay",
        0,
        "stand-in-judge",
    )
    rates = {c["id"]: (c["passed"], c["runs"], c["flaky"]) for c in report["cases"]}
    assert rates == {"france": (3, 3, False), "japan": (3, 3, False), "peru": (2, 3, True)}
    (failure,) = report["cases"][2]["failures"]
    assert failure["reason"] == "says more than the capital"


def test_the_stand_in_reproduces_the_recordings(tmp_path: Path) -> None:
    """After a change to the recipe or the dataset, `python examples/evals/record.py` is all it
    takes to record again."""
    copy = tmp_path / "evals"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__", "recordings"))
    done = subprocess.run(
        [sys.executable, str(copy / "record.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "8 passed, 1 failed, 0 errors" in done.stdout
    made = sorted(p.relative_to(copy / "recordings") for p in (copy / "recordings").rglob("*.json"))
    kept = sorted(
        p.relative_to(EXAMPLE / "recordings") for p in (EXAMPLE / "recordings").rglob("*.json")
    )
    assert made == kept
    for name in kept:
        assert (copy / "recordings" / name).read_text() == (
            EXAMPLE / "recordings" / name
        ).read_text(), name


def test_the_measured_claim_replays_to_the_numbers_in_the_docs() -> None:
    """docs/evals.md, "Fresh context or full history": the live measurement's recordings
    replay to the pass counts and tokens the page gives."""
    claim = Path(__file__).parent / "live" / "claim"
    result = CliRunner().invoke(
        app,
        ["eval", str(claim / "people.eval.yaml"), "--replay", str(claim / "recordings"), "--json"],
    )
    report = json.loads(result.stdout)
    assert report["errors"] == 0
    totals: dict[str, list[int]] = {"fresh": [0, 0, 0], "full_history": [0, 0, 0]}
    for case in report["cases"]:
        total = totals[case["target"]]
        total[0] += case["passed"]
        total[1] += case["runs"]
        total[2] += case["tokens"]
    assert totals == {"fresh": [7, 20, 7269], "full_history": [8, 20, 7637]}
