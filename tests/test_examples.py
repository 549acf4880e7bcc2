"""The examples run offline from the recordings beside their recipes, and the recordings are
what the recipes ask today."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from minions import AgentExecutor, AgentResult, StepStatus, load_recipe
from minions.events import StepCompleted, StepStarted
from minions.models._recording import Recording, ReplayModel

EXAMPLES = Path(__file__).parent.parent / "examples"
RECIPES = sorted(p.parent.name for p in EXAMPLES.glob("*/recipe.yaml"))


@pytest.fixture(autouse=True)
def pristine_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of the activity monitor starts from the example's own data."""
    data = tmp_path / "account.json"
    data.write_text((EXAMPLES / "activity_monitor" / "data" / "account.json").read_text())
    monkeypatch.setenv("ACTIVITY_MONITOR_DATA", str(data))


def replay(name: str, events: list[Any] | None = None) -> tuple[AgentResult, ReplayModel]:
    folder = EXAMPLES / name
    model = ReplayModel(folder / "recipe.recording.json")
    recipe = load_recipe(folder / "recipe.yaml")
    listeners = [events.append] if events is not None else []
    result = AgentExecutor(model=model).execute_sync(recipe, listeners=listeners)
    return result, model


def test_every_example_recipe_is_covered() -> None:
    assert RECIPES == ["activity_monitor", "research_assistant"]


@pytest.mark.parametrize("name", RECIPES)
def test_example_replays_offline_and_its_recording_is_current(name: str) -> None:
    result, model = replay(name)
    assert result.status is StepStatus.COMPLETED, result.error
    assert model.changed_prompts == []  # the recipe still asks what was recorded
    assert len(model.recording) == sum(len(e.model_calls) for e in result.executions)


@pytest.mark.parametrize("name", RECIPES)
def test_the_stand_in_reproduces_the_recording(name: str) -> None:
    """examples/record.py with the stand-in model makes exactly the committed recording, so
    after a change to a recipe, `python examples/record.py examples/NAME` is all it takes."""
    spec = importlib.util.spec_from_file_location("_record", EXAMPLES / "record.py")
    assert spec is not None
    assert spec.loader is not None
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("ACTIVITY_MONITOR_DATA")
        result, made = record.record(EXAMPLES / name, save=False)
    assert result.ok
    committed = Recording.load(EXAMPLES / name / "recipe.recording.json")
    assert made.entries == committed.entries


def test_activity_monitor_applies_the_rules() -> None:
    result, _ = replay("activity_monitor")
    decided = result.step("decide").result()
    assert decided["activities_to_update"] == [
        {"id": 101, "visibility": "only_me"},
        {"id": 102, "visibility": "only_me"},
        {"id": 103, "visibility": "everyone"},
        {"id": 105, "visibility": "only_me"},
        {"id": 106, "visibility": "only_me"},
    ]
    updated = result.step("update").result()
    assert [u["to"] for u in updated] == ["only_me", "only_me", "everyone", "only_me", "only_me"]
    assert len(result.step("update").items) == 5
    assert len(result.step("kudos").result()) == 3
    assert result.step("save").result()["updated"] == 5
    assert "kudos" in result.output


def test_activity_monitor_model_steps_are_small() -> None:
    """Each model call fits a 3B model's comfort zone: one short prompt, one reply."""
    result, _ = replay("activity_monitor")
    calls = [c for e in result.executions for c in e.model_calls]
    assert len(calls) == 2
    assert all(c.usage.prompt_tokens < 1500 for c in calls)


def test_research_assistant_runs_side_by_side_and_caches_in_the_background() -> None:
    events: list[Any] = []
    result, _ = replay("research_assistant", events)
    assert result.ok
    running = peak = 0
    for event in events:
        if isinstance(event, StepStarted):
            running += 1
            peak = max(peak, running)
        elif isinstance(event, StepCompleted):
            running -= 1
    assert peak >= 3
    started = [e.step_id for e in events if isinstance(e, StepStarted)]
    assert set(started[:3]) == {"read_pollination", "read_decline", "read_solutions"}
    assert result.step("cache").status is StepStatus.COMPLETED
    report = result.step("synthesis").result()
    assert set(report) == {"title", "summary", "key_points", "sources"}
    assert result.step("citations").result()["all_cited"] is True
    cached = EXAMPLES / "research_assistant" / "documents" / "cache" / "report.json"
    assert json.loads(cached.read_text())["title"] == report["title"]


def test_step_with_tools_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "step_with_tools.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_custom_step_example_reasks_until_cited_and_leaves_no_trace() -> None:
    spec = importlib.util.spec_from_file_location("_custom_step", EXAMPLES / "custom_step.py")
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from minions.testing import ScriptedModel

    model = ScriptedModel(["No citation here.", "Bad [9].", "Good [1]."])
    result = AgentExecutor().execute_sync(example.build(model))
    assert result.ok
    assert result.output == "Good [1]."
    kinds = [(d.link, d.kind) for d in result.step("answer").decisions]
    assert kinds == [
        ("require_citations", "reask"),
        ("require_citations", "reask"),
        ("text_answer", "complete"),
    ]
    last = str(model.requests[-1])
    assert "Sources:\n[1] Bees pollinate" in last
    assert "No citation here." not in last  # the failed attempts left no trace
    assert "Bad [9]." not in last
    assert last.count("Cite the sources you used") == 1
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_step.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "MINIONS_MODEL"},
    )
    assert done.returncode == 0, done.stderr
    assert "[1]" in done.stdout


def test_the_demo_leaves_no_temporary_files_behind(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    recipe = EXAMPLES / "activity_monitor" / "recipe.yaml"
    unset = ("MINIONS_MODEL", "TMPDIR", "ACTIVITY_MONITOR_DATA")  # the demo as a user runs it
    env = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run(
        [sys.executable, "-m", "minions", "run", str(recipe), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "TMPDIR": str(tmp_path / "tmp")},
    )
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


def test_mcp_notes_example_uses_its_own_mcp_server_offline() -> None:
    """examples/mcp_notes: the recipe starts its tiny stdio MCP server, the stand-in model
    lists and reads the notes through it, and the dry run lists its tools."""
    env = {k: v for k, v in os.environ.items() if k != "MINIONS_MODEL"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "mcp_notes" / "run.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'notes_list_notes -> \'["bees.md","decline.md"]\'' in done.stdout
    assert "summary: Bees pollinate about a third" in done.stdout
    assert "loss of wild flowers" in done.stdout
    path = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    recipe = str(EXAMPLES / "mcp_notes" / "notes.yaml")
    planned = subprocess.run(
        [sys.executable, "-m", "minions", "run", recipe, "--dry-run", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**env, "PATH": path},
    )
    assert planned.returncode == 0, planned.stderr
    tools = json.loads(planned.stdout)["mcp_servers"]["notes"]["tools"]
    assert [t["name"] for t in tools] == ["notes_list_notes", "notes_read_note"]
