"""The CLI during an incident: a model server that is down is said whole (its address, and
text that looks like Rich markup, as it is), in `runs list` and `runs show`; `runs list`
filtered by age, recipe and schedule, with whole errors in a pipe; `runs step` showing one
step (or one loop item) with its every call; `runs cancel` asking first on a terminal and
never in a script; every bad input exit 2 with what is wrong."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from cli_helpers import SETTINGS, write_recipe
from runs_helpers import run_here, shouting_recipes
from typer.testing import CliRunner, Result

from minions.cli._app import Settings, app
from minions.cli._common import since_time
from minions.cli._errors import UsageError
from minions.cli._runs_step import took
from minions.errors import ModelError
from minions.runs import RunStore
from minions.runs._runner import RunFailedError
from minions.testing import ScriptedModel

DOWN = (
    "openai-compatible:qwen at http://127.0.0.1:8080/v1/chat/completions: connection failed "
    "(Connection error.) [/x] [bold]not bold[/bold]; is the server up?"
)
"""What a model server that is down answers, with text Rich would read as markup."""


class Store:
    """A store with a completed run of `alpha` and a failed one of `beta` (its model is down)."""

    def __init__(self, folder: Path) -> None:
        alpha, beta = shouting_recipes(folder)
        self.day = datetime.now().strftime("%Y-%m-%d")  # the runs' (local) day, or the next
        self.url = f"sqlite:///{folder / 'minions.db'}"
        store = RunStore(self.url, create=True)
        try:
            self.done, _ = asyncio.run(store.submit(alpha, {"words": ["x", "y"]}))
            self.down, _ = asyncio.run(store.submit(beta, {"words": ["z"]}))
            self.queued, _ = asyncio.run(store.submit(alpha, {"words": []}))
        finally:
            store.close()
        answers = ScriptedModel([[("shout", {"text": "x"})], "X"])
        asyncio.run(run_here(self.url, self.done, model=answers))
        with pytest.raises(RunFailedError):
            asyncio.run(run_here(self.url, self.down, model=ScriptedModel([ModelError(DOWN)])))

    def cli(self, *args: str, ask: Callable[[str], str] | None = None) -> Result:
        return CliRunner().invoke(app, [*args, "--database-url", self.url], obj=Settings(ask=ask))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return Store(tmp_path_factory.mktemp("incidents"))


def test_a_model_server_down_is_said_whole_in_runs_list_and_show(store: Store) -> None:
    listed = store.cli("runs", "list", "--status", "failed")
    assert listed.exit_code == 0, listed.stderr
    # In a pipe, whole: not cut at 60 characters, the address and the brackets as they are.
    assert DOWN in " ".join(listed.stdout.split())
    shown = store.cli("runs", "show", store.down)
    assert shown.exit_code == 0, shown.stderr
    # On the failed step's row (folded to the width), then the run's error names the step
    # once and the error "as above".
    assert "http://127.0.0.1:8080/v1/chat/completions" in shown.stdout
    assert "[/x] [bold]not bold[/bold]" in shown.stdout
    assert shown.stdout.endswith("error: step 'ask' failed: (as above)\n")


def test_runs_list_with_json_gives_whole_errors(store: Store) -> None:
    listed = store.cli("runs", "list", "--json", "--recipe", "beta")
    assert listed.exit_code == 0, listed.stderr
    [run] = json.loads(listed.stdout)
    assert run["run_id"] == store.down
    assert DOWN in run["error"]


def ids(result: Result) -> set[str]:
    assert result.exit_code == 0, result.stderr
    return {run["run_id"] for run in json.loads(result.stdout)}


def test_runs_list_by_recipe_age_and_schedule(store: Store) -> None:
    everything = {store.done, store.down, store.queued}
    assert ids(store.cli("runs", "list", "--json", "--recipe", "alpha")) == {
        store.done,
        store.queued,
    }
    assert ids(store.cli("runs", "list", "--json", "--since", "1h")) == everything
    assert ids(store.cli("runs", "list", "--json", "--since", store.day)) == everything
    assert ids(store.cli("runs", "list", "--json", "--since", "2999-01-01")) == set()
    assert ids(store.cli("runs", "list", "--json", "--schedule", "nightly")) == set()
    table = store.cli("runs", "list", "--recipe", "alpha", "--status", "failed")
    assert table.exit_code == 0
    assert "no runs failed" in table.stderr


def test_since_is_an_age_or_a_local_time() -> None:
    now = 1_800_000_000.0
    assert since_time("90m", now=now) == now - 5400
    assert since_time("1h30m", now=now) == now - 5400
    assert since_time("2026-11-28T06:00", now=now) == datetime(2026, 11, 28, 6).timestamp()
    assert since_time(None) is None
    with pytest.raises(UsageError, match=r"--since 'soon': give an age \(30m, 12h, 7d\)"):
        since_time("soon")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.5, "0.50s"),
        (59.5, "59.50s"),
        (59.996, "1m00s"),
        (119.6, "2m00s"),
        (299.6, "5m00s"),
        (3599.7, "1h00m"),
        (5400.0, "1h30m"),
    ],
)
def test_a_steps_time_never_says_60_of_a_unit(seconds: float, shown: str) -> None:
    assert took(1000.0, 1000.0 + seconds) == shown


def test_runs_step_shows_one_step_with_its_every_call(store: Store) -> None:
    shown = store.cli("runs", "step", store.done, "ask")
    assert shown.exit_code == 0, shown.stderr
    text = shown.stdout
    assert text.startswith(f"step ask of run {store.done}: completed, agent, ")
    assert "output: X" in text
    assert "model calls (2):" in text
    assert "turn 1, attempt 1: scripted" in text
    assert "asked for shout" in text
    assert 'tool calls (1):\n  shout({"text": "x"}): ' in text
    assert "    result: X" in text
    assert "decision: " in text

    data = json.loads(store.cli("runs", "step", store.done, "ask", "--json").stdout)
    assert (data["step_id"], data["status"], data["kind"]) == ("ask", "completed", "agent")
    assert [c["name"] for c in data["tool_calls"]] == ["shout"]
    assert [(c["turn"], c["attempt"]) for c in data["model_calls"]] == [(1, 1), (2, 1)]
    assert data["executions"][0]["output"] == "X"


def test_runs_step_of_a_loop_and_of_one_of_its_items(store: Store) -> None:
    loop = store.cli("runs", "step", store.done, "each")
    assert loop.exit_code == 0, loop.stderr
    assert "loop items" in loop.stdout
    rows = {line.split()[0]: line for line in loop.stdout.splitlines() if "each[" in line}
    assert set(rows) == {"each[0]", "each[1]"}
    assert "Y" in rows["each[1]"]
    item = json.loads(store.cli("runs", "step", store.done, "each[1]", "--json").stdout)
    assert (item["step_id"], item["status"]) == ("each[1]", "completed")
    assert [c["arguments"] for c in item["tool_calls"]] == [{"text": "y"}]
    assert [e["output"] for e in item["executions"]] == ["Y"]


def test_runs_step_of_a_failed_step_says_its_error_whole(store: Store) -> None:
    shown = store.cli("runs", "step", store.down, "ask")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.startswith(f"step ask of run {store.down}: failed, agent")
    joined = " ".join(shown.stdout.split())
    assert f"error: {DOWN}" in joined
    assert "step 'ask'" not in joined
    # Its model call's error is the same: said once.
    assert "model calls (1):\n  turn 1, attempt 1: scripted" in shown.stdout
    assert shown.stdout.endswith("    error: (as above)\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs", "step", "nope", "ask"], "error: no run 'nope'"),
        (
            ["runs", "step", "{done}", "nope"],
            "error: run {done} has no step 'nope' (its steps: ask, each)",
        ),
        (["runs", "step", "{done}", "each[7]"], "has no step 'each[7]'"),
        (["runs", "list", "--since", "soon"], "error: --since 'soon': give an age"),
        (["runs", "cancel", "nope", "--yes"], "error: no run 'nope'"),
        (["runs", "cancel", "nope"], "error: no run 'nope'"),
    ],
)
def test_bad_input_exits_2_saying_what_is_wrong(
    store: Store, args: list[str], message: str
) -> None:
    done = store.cli(*(a.format(done=store.done) for a in args), ask=lambda _: "y")
    assert done.exit_code == 2, done.stderr
    assert message.format(done=store.done) in " ".join(done.stderr.split())
    assert done.exception is None or isinstance(done.exception, SystemExit)


def test_cancel_asks_first_on_a_terminal_and_never_in_a_script(tmp_path: Path) -> None:
    store = Store(tmp_path)
    asked: list[str] = []

    def no(question: str) -> str:
        asked.append(question)
        return "\n"

    kept = store.cli("runs", "cancel", store.queued, ask=no)
    assert kept.exit_code == 1
    assert f"run {store.queued}: not cancelled" in kept.stderr
    [question] = asked
    assert question.startswith(f"cancel run {store.queued} (alpha, queued, created ")
    assert question.endswith("? [y/N] ")
    assert status(store, store.queued) == "queued"

    # A run that ended: nothing to ask; the store says why it cannot be cancelled.
    ended = store.cli("runs", "cancel", store.done, ask=no)
    assert ended.exit_code == 2
    assert len(asked) == 1

    # --yes, or nobody to ask (a script: CliRunner's stdin is no terminal): cancelled at once.
    done = store.cli("runs", "cancel", store.queued, "--yes", ask=no)
    assert done.exit_code == 0, done.stderr
    assert done.stdout == f"run {store.queued}: cancelled\n"
    assert len(asked) == 1
    assert status(store, store.queued) == "cancelled"


def test_cancel_in_a_script_does_not_ask(tmp_path: Path) -> None:
    store = Store(tmp_path)
    # stdin is no terminal (and empty: an answer read from it would be no): nobody is asked.
    done = store.cli("runs", "cancel", store.queued)
    assert done.exit_code == 0, done.stderr
    assert done.stdout == f"run {store.queued}: cancelled\n"
    assert done.stderr == ""


def status(store: Store, run_id: str) -> str:
    found = RunStore(store.url)
    try:
        return asyncio.run(found.get(run_id)).status
    finally:
        found.close()


def test_minions_run_names_a_step_that_timed_out_once(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        """\
        id: napping
        tools: [tools]
        steps:
          - id: slow
            tool: nap
            params: {seconds: 30}
            timeout: 0.1
        """,
    )
    done = CliRunner().invoke(app, ["run", str(recipe)], obj=SETTINGS)
    assert done.exit_code == 1, done.stderr
    assert "✗ slow failed in " in done.stderr
    assert ": timed out after 0.1s\n" in done.stderr
    assert "step 'slow' timed out" not in done.stderr.split("✗ slow failed in ")[1].split("\n")[0]
