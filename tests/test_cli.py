"""The `minions` command: exit codes, output, JSON, events, dry runs, record and replay, Ctrl-C.

Most tests run the typer app in process (`CliRunner`); those about the process itself (the
installed entry point, SIGINT) run it as a subprocess. Everything is offline: models are the
stand-in of `cli_helpers` or replays of recordings made here.
"""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import numbered
from cli_helpers import (
    AGENTS,
    FAILING,
    SETTINGS,
    SIDE_EFFECT_THEN_MODEL,
    SLOW,
    TOOL_ONLY,
    write_recipe,
)
from conftest import Lookup, Offline
from rich.console import Console
from typer.testing import CliRunner, Result

from minions import AgentRecipe, StepGraph, __version__
from minions.cli._app import Settings, app
from minions.cli._dry_run import make_dry_run
from minions.cli._live import LiveView
from minions.cli._model_choice import needs_model
from minions.events import event_from_json
from minions.models._recording import Recording

HELPERS = Path(__file__).with_name("cli_helpers.py")


@pytest.fixture(autouse=True)
def no_model_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MINIONS_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def invoke(args: Sequence[str], settings: Settings | None = SETTINGS) -> Result:
    return CliRunner().invoke(app, list(args), obj=settings)


def record(recipe: Path, recording: Path, *extra: str) -> Result:
    """Run `recipe` with the stand-in model, recording its replies."""
    result = invoke(["run", str(recipe), "--model", "test", "--record", str(recording), *extra])
    assert result.exit_code == 0, result.stderr
    return result


def assert_no_traceback(result: Result) -> None:
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


# -- version, validate, graph, schema ----------------------------------------------------------


def test_version() -> None:
    result = invoke(["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"minions {__version__}"


def test_validate_ok(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    result = invoke(["validate", str(recipe)])
    assert result.exit_code == 0
    assert result.stdout.startswith("OK")
    assert "3 steps" in result.stdout


INVALID = {
    "schema": (
        """\
        id: broken
        steps:
          - id: a
            goal: Do it.
            colour: blue
          - id: b
            depends_on: [a]
        """,
        [":5: step 'a', field 'colour': unknown field", ":6: step 'b': a step needs exactly one"],
    ),
    "graph": (
        """\
        id: broken
        steps:
          - id: a
            goal: Do it.
          - id: b
            goal: Then this.
            depends_on: [nowhere]
        """,
        [":7: step 'b', field 'depends_on': unknown step 'nowhere'"],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_validate_lists_every_problem_with_file_and_line(tmp_path: Path, case: str) -> None:
    text, problems = INVALID[case]
    recipe = write_recipe(tmp_path, text)
    result = invoke(["validate", str(recipe)])
    assert result.exit_code == 2
    assert_no_traceback(result)
    assert result.stdout == ""
    assert f"invalid recipe: {len(problems)} problem" in result.stderr
    for problem in problems:
        assert f"{recipe}{problem}" in result.stderr


def test_graph_prints_mermaid(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    result = invoke(["graph", str(recipe)])
    assert result.exit_code == 0
    assert result.stdout.startswith("flowchart TD")
    assert "hello --> bye" in result.stdout


def test_schema_is_the_recipe_json_schema() -> None:
    result = invoke(["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert "steps" in schema["properties"]
    assert "StepSpec" in schema["$defs"]


@pytest.mark.parametrize(
    "recipe",
    sorted(
        p
        for p in Path(__file__).parent.parent.glob("examples/**/*.yaml")
        if not p.name.endswith(".eval.yaml")  # eval datasets (docs/evals.md), not recipes
    ),
    ids=str,
)
def test_the_schema_accepts_the_examples_and_the_documented_shorthands(recipe: Path) -> None:
    # An editor with the schema must not flag what the loader accepts (`loop: "{{ ... }}"`).
    import jsonschema
    import yaml

    schema = json.loads(invoke(["schema"]).stdout)
    jsonschema.validate(yaml.safe_load(recipe.read_text()), schema)
    shorthands = """\
id: short
steps:
  - {id: a, goal: list, loop: "{{ inputs.items }}", tools: read_file}
  - {id: b, goal: b, loop: [1, 2], depends_on: a, next: c}
  - {id: c, goal: c}
"""
    jsonschema.validate(yaml.safe_load(shorthands), schema)


def test_a_missing_recipe_file_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke(["run", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such recipe file" in result.stderr
    assert_no_traceback(result)


def test_typer_usage_errors_exit_2() -> None:
    assert invoke(["run", "--no-such-option", "x.yaml"]).exit_code == 2
    assert invoke(["run"]).exit_code == 2


# -- running -----------------------------------------------------------------------------------


def test_run_prints_the_output_and_a_summary(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    result = invoke(["run", str(recipe), "-i", "n=5"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "20\n"  # -i values take the declared type: 5 * 2 * 2
    assert "run completed" in result.stderr
    assert "twice" in result.stderr  # in the summary table
    assert "✓ once completed" in result.stderr  # a progress line (stderr is not a terminal)


def test_quiet_prints_the_output_only(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    result = invoke(["run", str(recipe), "-i", "n=1", "--quiet"])
    assert result.exit_code == 0
    assert result.stdout == "4\n"
    assert result.stderr == ""


def test_a_failed_run_exits_1(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, FAILING)
    result = invoke(["run", str(recipe)])
    assert result.exit_code == 1
    assert "run failed" in result.stderr
    assert "broken: on purpose" in result.stderr
    assert result.stdout == ""  # a failed run has no output (not the output of `fine`)
    assert_no_traceback(result)


def test_json_prints_the_result_and_nothing_else(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    recording = tmp_path / "run.recording.json"
    record(recipe, recording)
    result = invoke(["run", str(recipe), "--replay", str(recording), "--json", "-i", "name=Bo"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)  # the tool's print went to stderr
    assert "shouting!" in result.stderr
    assert data["status"] == "completed"
    assert data["recipe_id"] == "greetings"
    assert data["inputs"] == {"name": "Bo"}
    assert data["error"] is None
    steps = {s["id"]: s for s in data["steps"]}
    assert set(steps) == {"hello", "loud", "bye"}
    assert steps["hello"]["model_calls"] == 1
    assert steps["loud"]["tool_calls"] == 1
    assert steps["loud"]["output"] == "BO"
    assert steps["hello"]["usage"]["total_tokens"] > 0
    assert data["usage"]["calls"] == 2
    assert data["output"] == steps["bye"]["output"]
    assert all(s["duration"] is not None for s in data["steps"])


def test_json_of_a_failed_run(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, FAILING)
    result = invoke(["run", str(recipe), "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["status"] == "failed"
    assert data["output"] is None
    steps = {s["id"]: s for s in data["steps"]}
    assert "on purpose" in steps["oops"]["error"]
    assert "iso" in steps["fine"]["output"]


def test_events_are_written_as_json_lines_in_sequence(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    events = tmp_path / "events.jsonl"
    result = invoke(["run", str(recipe), "--model", "test", "--events", str(events)])
    assert result.exit_code == 0, result.stderr
    parsed = [event_from_json(line) for line in events.read_text().splitlines()]
    assert numbered(parsed)
    assert parsed[0].kind == "run_started"
    assert parsed[-1].kind == "run_completed"
    kinds = {e.kind for e in parsed}
    assert {
        "step_started",
        "step_completed",
        "model_call_completed",
        "tool_call_completed",
    } <= kinds


def test_an_unwritable_events_file_is_a_usage_error(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    result = invoke(["run", str(recipe), "-i", "n=1", "--events", str(tmp_path / "no" / "e")])
    assert result.exit_code == 2
    assert "cannot write events" in result.stderr


def test_a_full_disk_for_events_is_said_once_and_the_run_goes_on(tmp_path: Path) -> None:
    assert Path("/dev/full").exists(), "a Linux /dev/full plays the full disk"
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    result = invoke(["run", str(recipe), "-i", "n=3", "--json", "--events", "/dev/full"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["output"] == 12
    assert result.stderr.count("cannot write events to '/dev/full'") == 1
    assert "the run goes on without them" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("target", ["recipe.yaml", "tools.py", "run.recording.json"])
def test_events_never_overwrite_the_recipe_or_the_recording(tmp_path: Path, target: str) -> None:
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    (tmp_path / "run.recording.json").write_text("{}")
    before = (tmp_path / target).read_text()
    args = ["run", str(recipe), "-i", "n=1", "--events", str(tmp_path / target)]
    result = invoke([*args, "--record", str(tmp_path / "run.recording.json")])
    assert result.exit_code == 2
    assert f"--events {str(tmp_path / target)!r}" in " ".join(result.stderr.split())
    assert (tmp_path / target).read_text() == before


# -- inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-i", "n"], "NAME=VALUE"),
        (["-i", "=3"], "NAME=VALUE"),
        (["-i", "n=1", "-i", "n=2"], "given twice"),
        (["-i", "n=1", "-i", "m=2"], "unknown input 'm'"),
        (["-i", "n=many"], "input 'n' must be integer"),
        ([], "input 'n' is required"),
    ],
)
def test_bad_inputs_exit_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    result = invoke(["run", str(recipe), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert_no_traceback(result)


# -- dry run -----------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_calls_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    recipe = write_recipe(
        tmp_path,
        f"""\
        id: plan
        tools: [tools]
        inputs:
          name: {{type: string}}
        steps:
          - id: mark
            tool: touch
            params: {{path: "{marker}"}}
          - id: greet
            goal: Say hello to {{{{ inputs.name }}}}.
          - id: after
            depends_on: [mark, greet]
            goal: "Summarise {{{{ greet.output }}}}"
        """,
    )

    def no_model(spec: str) -> Any:
        raise AssertionError("a dry run resolved a model")

    result = invoke(
        ["run", str(recipe), "--dry-run", "-i", "name=Ada", "--model", "test"],
        Settings(resolve_model=no_model),
    )
    assert result.exit_code == 0, result.stderr
    assert not marker.exists()
    out = result.stdout
    assert "wave 1" in out
    assert "wave 2" in out
    assert "Say hello to Ada." in out  # rendered from the inputs
    assert "{{ greet.output }}" in out  # shown as written: it waits for greet
    assert "after greet" in out or "after mark, greet" in out
    assert "touch" in out

    data = json.loads(invoke(["run", str(recipe), "--dry-run", "--json", "-i", "name=Ada"]).stdout)
    assert [[s["id"] for s in wave] for wave in data["waves"]] == [["mark", "greet"], ["after"]]
    assert data["waves"][0][1]["fields"]["goal"] == {"value": "Say hello to Ada."}
    assert not marker.exists()


def test_dry_run_checks_inputs(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    assert invoke(["run", str(recipe), "--dry-run"]).exit_code == 2


def test_a_step_class_of_ones_own_says_its_kind_and_whether_it_needs_a_model() -> None:
    """The plan and the model choice ask the step (`kind`, `uses_model`), so a step class of
    one's own is not taken for an agent step needing a model."""
    offline = AgentRecipe(id="offline", steps=[Offline("look")])
    assert not needs_model(offline.steps)
    [planned] = make_dry_run(StepGraph(offline), {}, model="none").steps
    assert (planned.kind, planned.uses_model) == ("offline", False)
    assert needs_model([Offline("look"), Lookup("think")])
    assert not needs_model([Lookup("think", model="openai:gpt-4o")])


# -- models: choice, record, replay ------------------------------------------------------------


def test_without_a_model_the_message_says_how_to_set_one(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    result = invoke(["run", str(recipe)])
    assert result.exit_code == 2
    message = result.stderr
    assert "no model is configured" in message
    assert "OPENAI_API_KEY" in message
    assert "--model ollama:llama3.2:3b" in message
    assert "OPENAI_BASE_URL" in message
    assert "MINIONS_MODEL" in message
    assert_no_traceback(result)


def test_a_recipe_needing_no_model_runs_without_one(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    assert invoke(["run", str(recipe), "-i", "n=2"], settings=None).exit_code == 0


def test_an_unusable_model_string_is_a_usage_error(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    result = invoke(["run", str(recipe), "--model", "nowhere:nothing"], settings=None)
    assert result.exit_code == 2
    assert "cannot use model 'nowhere:nothing' (--model)" in result.stderr
    assert_no_traceback(result)


def test_minions_model_and_the_recipe_model_are_used_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def resolve(spec: str) -> Any:
        asked.append(spec)
        return SETTINGS.resolve_model(spec)

    settings = Settings(resolve_model=resolve)
    plain = write_recipe(tmp_path / "plain", AGENTS)
    own = write_recipe(tmp_path / "own", "model: recipe:model\n" + AGENTS)
    monkeypatch.setenv("MINIONS_MODEL", "env:model")
    assert invoke(["run", str(plain)], settings).exit_code == 0
    assert invoke(["run", str(own)], settings).exit_code == 0
    assert invoke(["run", str(own), "--model", "option:model"], settings).exit_code == 0
    assert asked == ["env:model", "recipe:model", "option:model"]


def events_by_step(path: Path) -> dict[str, list[str]]:
    """The events of an events file, in order, per step (``""`` for the run's own): parallel
    steps interleave differently from run to run, a step's own events do not.

    Each event is its kind, except that a reply's token deltas are one ``tokens: TEXT`` entry:
    a replay streams a recorded reply in one piece, not in the model's chunks.
    """
    events: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        kinds = events.setdefault(event.get("step_id") or "", [])
        if event["kind"] != "token_delta":
            kinds.append(event["kind"])
        elif kinds[-1].startswith("tokens: "):
            kinds[-1] += event["text"]
        else:
            kinds.append(f"tokens: {event['text']}")
    return events


def test_record_then_replay_gives_the_same_result_and_events(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    recording = tmp_path / "run.recording.json"
    live_events, replay_events = tmp_path / "live.jsonl", tmp_path / "replay.jsonl"
    recorded = record(recipe, recording, "--json", "--events", str(live_events))
    saved = Recording.load(recording)
    assert set(saved.entries) == {"hello#1/1", "bye#1/1"}
    assert saved.meta["recipe"] == "greetings"
    assert saved.meta["model"] == "test"

    replayed = invoke(
        ["run", str(recipe), "--replay", str(recording), "--json", "--events", str(replay_events)],
        settings=None,
    )
    assert replayed.exit_code == 0, replayed.stderr
    before, after = json.loads(recorded.stdout), json.loads(replayed.stdout)
    assert after["output"] == before["output"]
    assert after["usage"] == before["usage"]
    assert [s["output"] for s in after["steps"]] == [s["output"] for s in before["steps"]]
    assert events_by_step(replay_events) == events_by_step(live_events)
    assert events_by_step(live_events)["hello"] == [
        "step_started",
        "model_call_started",
        "tokens: hello: Say hello to Ada.",
        "model_call_completed",
        "completion_decided",
        "step_completed",
    ]


def test_a_replay_notes_prompts_that_changed_since_the_recording(tmp_path: Path) -> None:
    recording = tmp_path / "run.recording.json"
    record(write_recipe(tmp_path / "before", AGENTS), recording)
    changed = AGENTS.replace("goal: Say hello to", "goal: Warmly greet")
    recipe = write_recipe(tmp_path / "after", changed)
    result = invoke(["run", str(recipe), "--replay", str(recording)], settings=None)
    assert result.exit_code == 0, result.stderr
    assert (
        "note: 1 prompt differs from the recording (hello#1/1): the recipe or the inputs changed "
        "since it was recorded"
    ) in result.stderr
    unchanged = invoke(
        ["run", str(write_recipe(tmp_path / "before", AGENTS)), "--replay", str(recording)],
        settings=None,
    )
    assert unchanged.exit_code == 0, unchanged.stderr
    assert "differ" not in unchanged.stderr


NAMED = "model: openai:gpt-4o-mini\n" + AGENTS.replace(
    "    goal: Say goodbye", "    model: openai:gpt-4o\n    goal: Say goodbye"
)
"""`AGENTS` with a model of its own and a step naming another (neither usable: no API key)."""


def test_the_command_resolves_the_models_steps_name(tmp_path: Path) -> None:
    """`--model` replaces the recipe's model; a step's own model string goes through the same
    resolver (here the stand-in), not straight to the provider."""
    asked: list[str] = []

    def resolve(spec: str) -> Any:
        asked.append(spec)
        return SETTINGS.resolve_model(spec)

    recipe = write_recipe(tmp_path, NAMED)
    result = invoke(["run", str(recipe), "--model", "test"], Settings(resolve_model=resolve))
    assert result.exit_code == 0, result.stderr
    assert asked == ["test", "openai:gpt-4o"]
    assert result.stdout.startswith("bye: ")


def test_replay_covers_every_model_the_recipe_names(tmp_path: Path) -> None:
    """Models named by the recipe and by a step are replayed too: no key or server needed."""
    recipe = write_recipe(tmp_path, NAMED)
    recording = tmp_path / "run.recording.json"
    recorded = record(recipe, recording, "--json")
    result = invoke(["run", str(recipe), "--replay", str(recording), "--json"], settings=None)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["output"] == json.loads(recorded.stdout)["output"]
    assert "prompts differ" not in result.stderr


def test_a_replay_miss_names_the_step_and_the_call(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    recording = tmp_path / "run.recording.json"
    record(recipe, recording)
    saved = Recording.load(recording)
    del saved.entries["bye#1/1"]
    saved.save(recording)
    result = invoke(["run", str(recipe), "--replay", str(recording)], settings=None)
    assert result.exit_code == 1
    assert "model call 1 of step 'bye'" in result.stderr
    assert "run failed" in result.stderr


def test_a_recording_beside_the_recipe_is_replayed_and_said_so(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    record(recipe, tmp_path / "recipe.recording.json")
    result = invoke(["run", str(recipe)], settings=None)
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "recipe.recording.json" in line]
    assert len(lines) == 1
    assert "replaying" in lines[0]
    assert "--model" in lines[0]
    assert result.stdout.startswith("bye: ")


def test_quiet_leaves_out_notes_too(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    record(recipe, tmp_path / "recipe.recording.json")
    result = invoke(["run", str(recipe), "-q", "-i", "name=Bo"], settings=None)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("bye: ")
    # What the shout tool prints, and no note: neither the implicit replay nor changed prompts.
    assert result.stderr == "shouting!\n"


def test_record_and_replay_options_conflict(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    recording = tmp_path / "run.recording.json"
    record(recipe, recording)
    both = invoke(["run", str(recipe), "--record", "x.json", "--replay", str(recording)])
    assert both.exit_code == 2
    assert "cannot be used together" in both.stderr
    model = invoke(["run", str(recipe), "--model", "m", "--replay", str(recording)])
    assert model.exit_code == 2
    missing = invoke(["run", str(recipe), "--replay", str(tmp_path / "none.json")])
    assert missing.exit_code == 2
    assert "does not exist" in missing.stderr


def test_record_is_saved_when_the_run_fails(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        """\
        id: half
        tools: [tools]
        steps:
          - id: think
            goal: Think.
          - id: oops
            depends_on: [think]
            tool: broken
            params: {reason: late}
        """,
    )
    recording = tmp_path / "run.recording.json"
    result = invoke(["run", str(recipe), "--model", "test", "--record", str(recording)])
    assert result.exit_code == 1
    assert set(Recording.load(recording).entries) == {"think#1/1"}


# -- the live view -----------------------------------------------------------------------------


def test_progress_lines_name_the_steps_running_alongside(tmp_path: Path) -> None:
    """Off a terminal the live view prints a line per step; one starting while others run
    names them."""
    recipe = write_recipe(
        tmp_path,
        """\
        id: side
        tools: [tools]
        steps:
          - {id: slow, tool: nap, params: {seconds: 0.2}}
          - {id: quick, goal: Be quick.}
          - {id: last, depends_on: [slow, quick], goal: Sum up.}
        """,
    )
    result = invoke(["run", str(recipe), "--model", "test"])
    assert result.exit_code == 0, result.stderr
    started = [line for line in result.stderr.splitlines() if line.startswith("▶")]
    assert started == ["▶ slow", "▶ quick (alongside slow)", "▶ last"]


def test_the_live_view_tracks_steps_from_events(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, AGENTS)
    events = tmp_path / "events.jsonl"
    invoke(["run", str(recipe), "--model", "test", "--events", str(events)])
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    view = LiveView(console, ["hello", "loud", "bye"], mode="live")
    assert view.mode == "live"
    seen_running = False
    for line in events.read_text().splitlines():
        view(event_from_json(line))
        seen_running = seen_running or view.rows["bye"].status == "running"
    assert seen_running
    assert {row.status for row in view.rows.values()} == {"completed"}
    assert view.rows["hello"].model_calls == 1
    assert view.rows["loud"].tool_calls == 1
    assert view.run_status == "completed"
    console.print(view.render())
    assert "bye" in screen.getvalue()


def test_every_group_lists_its_commands_in_order_each_turning_mistakes_into_exit_2() -> None:
    groups = {
        g.typer_instance.info.name: [c.name for c in g.typer_instance.registered_commands]
        for g in app.registered_groups
        if g.typer_instance is not None
    }
    assert groups == {
        "runs": [
            "list",
            "show",
            "step",
            "events",
            "cancel",
            "resume",
            "approve",
            "prune",
            "rerun",
            "diff",
        ],
        "schedules": ["add", "list", "show", "pause", "resume", "remove"],
        "endpoints": ["status", "list", "forget"],
        "cache": ["list", "clear"],
        "keys": ["add", "list", "revoke"],
        "eval": ["run", "compare", "add-case"],
    }
    for args in (
        ["runs", "prune", "--older-than", "soon"],
        ["runs", "rerun", "r", "--from", "s", "--set", "oops"],
        ["schedules", "add", "x.yaml", "--every", "often"],
    ):
        result = invoke(args)
        assert result.exit_code == 2, (args, result.stderr)
        assert result.stderr.startswith("error: ")
        assert_no_traceback(result)


def test_the_live_view_tells_a_step_waiting_for_a_person_as_the_console_does() -> None:
    from minions import events as ev
    from minions._fold import EXECUTION_STATUSES
    from minions.cli._live import _STYLE

    assert set(_STYLE) == set(EXECUTION_STATUSES)  # a mark for every status the fold tells
    screen = io.StringIO()
    view = LiveView(Console(file=screen, width=120), ["say", "loop"], mode="lines")
    for event in (
        ev.StepStarted(step_id="loop", seq=1, timestamp=10.0),
        ev.StepStarted(step_id="loop[0]", seq=2, timestamp=10.0),
        ev.StepStarted(step_id="say", seq=3, timestamp=11.0),
        ev.ApprovalRequested(step_id="say", call_id="say#1/c", name="shout", seq=4),
    ):
        view(event)
    say, loop = view.rows["say"], view.rows["loop"]
    assert (say.status, say.note) == ("waiting", "waiting for approval of shout")
    assert (loop.status, loop.items_started, loop.items_done) == ("running", 1, 0)
    progress = view.progress_line()
    assert progress is not None
    assert "say (" in progress
    assert "waiting for approval of shout" in progress
    view(ev.ApprovalResolved(step_id="say", call_id="say#1/c", name="shout", approved=False))
    assert (view.rows["say"].status, view.rows["say"].note) == ("running", "shout rejected")
    view(ev.StepCompleted(step_id="say", seq=6, timestamp=13.5))
    assert "✓ say completed in 2.50s" in screen.getvalue()  # by the events' own times
    assert screen.getvalue().splitlines()[:3] == [
        "▶ loop",
        "▶ say (alongside loop)",
        "? say waits for approval: shout (say#1/c)",
    ]


def test_the_live_view_and_the_summary_name_their_columns_alike() -> None:
    from rich.console import Group
    from rich.table import Table

    from minions.cli._report import StepSummary, summary_table

    view = LiveView(Console(file=io.StringIO()), ["a"], mode="live")
    rendered = view.render()
    assert isinstance(rendered, Group)
    live_table = rendered.renderables[0]
    assert isinstance(live_table, Table)
    live = [str(c.header) for c in live_table.columns if c.header not in ("", "note")]
    summary = [
        str(c.header) for c in summary_table([StepSummary(id="a", status="completed")]).columns
    ]
    assert live == ["step", "status", "time", "model calls", "tool calls", "retries", "tokens"]
    assert [name for name in live if name in summary] == summary


@pytest.mark.parametrize(
    ("total", "unreported", "shown"), [(12, False, "12"), (12, True, "≥12"), (0, True, "n/a")]
)
def test_token_counts_never_read_0_plus_question_mark(
    total: int, unreported: bool, shown: str
) -> None:
    from minions._text import token_count

    assert token_count(total, unreported=unreported) == shown


# -- the process: entry point and Ctrl-C -------------------------------------------------------


def test_the_installed_entry_point(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("minions")
    assert script.exists(), "`make install` installs the `minions` script beside the interpreter"
    recipe = write_recipe(tmp_path, TOOL_ONLY)
    done = subprocess.run(
        [str(script), "run", str(recipe), "-i", "n=3", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == 12


def test_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "minions.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == f"minions {__version__}"


def interrupt_slow_run(
    tmp_path: Path, *extra: str, signum: int = signal.SIGINT
) -> tuple[int, str, str]:
    """Run the `SLOW` recipe in a process, send it `signum` once its slow step has started,
    and return its exit code, stdout and stderr. Its events go to ``events.jsonl``."""
    recipe = write_recipe(tmp_path, SLOW)
    events = tmp_path / "events.jsonl"
    command = [sys.executable, str(HELPERS), "run", str(recipe), "--model", "test"]
    command += ["--events", str(events), *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while '"step_id":"nap","seq"' not in (events.read_text() if events.exists() else ""):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the slow step never started"
            time.sleep(0.05)
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, out, err


def test_ctrl_c_cancels_cleanly_and_keeps_events_and_recording(tmp_path: Path) -> None:
    recording = tmp_path / "run.recording.json"
    code, _out, err = interrupt_slow_run(tmp_path, "--record", str(recording))
    events = tmp_path / "events.jsonl"
    assert code == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err
    assert "Finished: first" in err
    assert "cancelled: nap" in err
    kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()]
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_failed"
    assert "step_failed" in kinds
    assert set(Recording.load(recording).entries) == {"first#1/1"}


def test_sigterm_ends_the_run_like_ctrl_c(tmp_path: Path) -> None:
    # What `docker stop`, Kubernetes and CI timeouts send: a run_failed event and a summary.
    code, out, err = interrupt_slow_run(tmp_path, "--json", signum=signal.SIGTERM)
    assert code == 143, err
    assert "Traceback" not in err
    assert "terminated: the run was cancelled. Finished: first; cancelled: nap" in err
    assert json.loads(out)["error"] == "cancelled by SIGTERM"
    events = (tmp_path / "events.jsonl").read_text().splitlines()
    assert json.loads(events[-1])["kind"] == "run_failed"


def test_ctrl_c_with_json_prints_the_cancelled_run(tmp_path: Path) -> None:
    code, out, err = interrupt_slow_run(tmp_path, "--json")
    assert code == 130, err
    data = json.loads(out)
    started = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])
    assert data["run_id"] == started["run_id"]
    assert data["recipe_id"] == "slow"
    assert data["status"] == "cancelled"
    assert data["error"] == "cancelled by Ctrl-C"
    assert [(s["id"], s["status"]) for s in data["steps"]] == [
        ("first", "completed"),
        ("nap", "cancelled"),
    ]
    assert data["steps"][0]["model_calls"] == 1
    assert data["steps"][0]["tokens"] > 0
    assert data["steps"][1]["tool_calls"] == 0


def test_a_live_run_over_http_records_and_replays_offline(tmp_path: Path) -> None:
    """The real provider against FakeOpenAIServer: record a live run, then replay it with the
    server gone, and get the same output."""
    from minions.testing import FakeOpenAIServer

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "id: live\n"
        "steps:\n"
        "  - {id: facts, goal: List two facts about bees.}\n"
        "  - id: judge\n"
        "    depends_on: [facts]\n"
        "    analyze: Are these facts about bees?\n"
        '    input: "{{ facts.output }}"\n'
        "    output: {about_bees: true}\n"
    )
    recording = tmp_path / "live.recording.json"
    with FakeOpenAIServer(["Bees pollinate. Bees dance.", '{"about_bees": true}']) as server:
        model = f"openai-compatible:fake-model@{server.url}"
        live = invoke(
            ["run", str(recipe), "--model", model, "--json", "--record", str(recording)], None
        )
        assert live.exit_code == 0, live.stderr
        # The preflight asked for the models; then one chat request per step.
        assert [r.path for r in server.requests] == ["/v1/models", *["/v1/chat/completions"] * 2]
    replayed = invoke(["run", str(recipe), "--replay", str(recording), "--json"], None)
    assert replayed.exit_code == 0, replayed.stderr
    assert json.loads(replayed.stdout)["output"] == json.loads(live.stdout)["output"]
    assert json.loads(live.stdout)["output"] == {"about_bees": True}


def test_a_run_stops_before_any_step_when_its_model_server_is_down(tmp_path: Path) -> None:
    # A tool step with a side effect comes first: with the server down it must not run.
    recipe = write_recipe(tmp_path, SIDE_EFFECT_THEN_MODEL)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = f"openai-compatible:m@http://127.0.0.1:{port}/v1"
    marker = tmp_path / "kudos.txt"
    result = invoke(["run", str(recipe), "--model", model, "-i", f"path={marker}"], None)
    assert result.exit_code == 1
    assert f"http://127.0.0.1:{port}/v1: connection failed" in result.stderr
    assert "--no-preflight" in result.stderr
    assert not marker.exists()  # nothing ran
    assert_no_traceback(result)
    skipped = invoke(
        ["run", str(recipe), "--model", model, "-i", f"path={marker}", "--no-preflight"], None
    )
    assert skipped.exit_code == 1
    assert marker.exists()  # without the check, the tool step ran before the model failed


def test_a_multi_line_server_error_is_one_line_and_said_once(tmp_path: Path) -> None:
    from minions.testing import FakeOpenAIServer, FakeReply

    jinja = (
        "Unable to generate parser for this template.\n------------\n"
        "While executing CallExpression at line 1\n"
        "...raise_exception('Conversation roles must alternate user/assistant')\n"
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("id: r\nsteps:\n  - {id: a, goal: Say hi.}\n")
    with FakeOpenAIServer([FakeReply.failure(400, jinja)]) as server:
        result = invoke(["run", str(recipe), "--model", f"openai-compatible:m@{server.url}"], None)
    assert result.exit_code == 1
    one_line = (
        "HTTP 400: Unable to generate parser for this template. While executing CallExpression "
        "at line 1 ...raise_exception('Conversation roles must alternate user/assistant')"
    )
    assert result.stderr.count(one_line) == 1
    assert "run failed: step 'a' failed (the reason is above)" in result.stderr


def test_counts_read_as_english_and_python_dash_m_minions_runs(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "id: one\nsteps:\n  - {id: now, tool: current_datetime}\n")
    result = invoke(["run", str(recipe)])
    assert result.exit_code == 0, result.stderr
    assert "run one: 1 step, model none" in result.stderr
    assert "· 1 step · 0 model calls · 1 tool call ·" in result.stderr
    done = subprocess.run(
        [sys.executable, "-m", "minions", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == f"minions {__version__}"


def test_url_credentials_never_show_in_the_header_dry_run_or_recording(tmp_path: Path) -> None:
    from minions.testing import FakeOpenAIServer

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("id: r\nsteps:\n  - {id: a, goal: Say hi.}\n")
    recording = tmp_path / "r.recording.json"
    with FakeOpenAIServer(["hi"]) as server:
        url = server.url.replace("http://", "http://ada:hunter2@")
        model = f"openai-compatible:fake-model@{url}"
        live = invoke(["run", str(recipe), "--model", model, "--record", str(recording)], None)
        plan = invoke(["run", str(recipe), "--model", model, "--dry-run", "--json"], None)
    assert live.exit_code == 0, live.stderr
    for text in (live.stderr, live.stdout, plan.stdout, recording.read_text()):
        assert "hunter2" not in text
    assert "http://***@127.0.0.1" in live.stderr


FALLBACK = """\
id: fallback
config: {{retry_initial_delay: 0.01, retry_max_delay: 0.02, max_model_retries: 1}}
model:
  - openai-compatible:big@{dead}
  - openai-compatible:small@{live}
steps:
  - {{id: a, goal: Say hi.}}
"""


def test_a_recipe_s_model_list_runs_records_and_replays(tmp_path: Path) -> None:
    from minions.testing import FakeOpenAIServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    with FakeOpenAIServer(["Hi from the second model."]) as server:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(FALLBACK.format(dead=dead, live=server.url))
        planned = invoke(["run", str(recipe), "--dry-run"], None)
        record = tmp_path / "run.recording.json"
        live = invoke(["run", str(recipe), "--json", "--record", str(record)], None)
    assert planned.exit_code == 0, planned.stderr
    assert f"openai-compatible:big@{dead}, then openai-compatible:small@" in planned.stdout
    # The pre-flight check passes with one model up, and the run falls through to it.
    assert live.exit_code == 0, live.stderr
    assert json.loads(live.stdout)["output"] == "Hi from the second model."
    assert sorted(Recording.load(record).entries) == ["a#1/1", "a#1/2", "a#1/3"]
    replayed = invoke(["run", str(recipe), "--json", "--replay", str(record)], None)
    assert replayed.exit_code == 0, replayed.stderr
    assert json.loads(replayed.stdout)["output"] == "Hi from the second model."


def test_an_unusable_model_of_a_list_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "id: r\nmodel: [ollama:llama3.2, 'nowhere:nothing']\nsteps:\n  - {id: a, goal: Hi.}\n"
    )
    result = invoke(["run", str(recipe)], None)
    assert result.exit_code == 2
    assert "cannot use model 'nowhere:nothing' (the recipe's model, model 2 of 2)" in result.stderr
    assert_no_traceback(result)
