"""examples/plan_and_execute runs offline from its recording, which is what the example asks
today, and the stand-in model reproduces that recording."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from minions.models import Recording, RecordingModel, ReplayModel

FOLDER = Path(__file__).parent.parent / "examples" / "plan_and_execute"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_plan_example", FOLDER / "run.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_replays_offline_and_its_recording_is_current(tmp_path: Path) -> None:
    run = example()
    model = ReplayModel(FOLDER / "recording.json")
    shutil.copytree(FOLDER / "project", tmp_path / "project")
    result = asyncio.run(run.plan_and_run(model, tmp_path / "project"))
    assert run.summary(result) == {
        "ok": True,
        "steps": ["analyze", "user_model", "auth", "api", "validate", "cleanup"],
        "replans": 0,
    }
    assert model.changed_prompts == []
    assert "def check_password" in (tmp_path / "project" / "app" / "auth.py").read_text()
    assert result.tokens[0].name == "planner"


def test_the_stand_in_reproduces_the_recording(tmp_path: Path) -> None:
    run = example()
    recording = Recording()
    shutil.copytree(FOLDER / "project", tmp_path / "project")
    model = RecordingModel(run.stand_in(), recording)
    result = asyncio.run(run.plan_and_run(model, tmp_path / "project"))
    assert result.ok
    committed = Recording.load(FOLDER / "recording.json")
    assert recording.entries == committed.entries


def test_the_example_script_runs_offline(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(FOLDER / "run.py"), "--workspace", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "files written: app/auth.py, app/user_routes.py, app/users.py" in done.stdout
    assert not (FOLDER / "project" / "app" / "auth.py").exists()
