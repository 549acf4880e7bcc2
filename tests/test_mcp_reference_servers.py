"""MCP servers nobody here wrote: the reference ``mcp-server-time`` and ``mcp-server-git``
(installed from the package index with the ``dev`` extra), over stdio as their users start them,
and the time server over streamable HTTP. Their tool lists, results, errors and content reach
the model as a direct MCP client sees them, and their stderr stays off ours."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
from mcp_server_time.server import create_server
from mcp_test_server import serve_http

from minions import AgentExecutor, AgentRecipe, DefaultStep, ToolStep
from minions.events import Event, ToolCallFailed
from minions.testing import ScriptedModel
from minions.tools import MCPStdioServer
from minions.tools._mcp import list_mcp_tools

TIME = MCPStdioServer(
    command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"]
)


def run(
    server: Any, name: str, calls: list[tuple[str, dict[str, Any]]]
) -> tuple[Any, list[Event], ScriptedModel]:
    model = ScriptedModel([[(f"{name}_{tool}", args) for tool, args in calls], "done"])
    recipe = AgentRecipe(
        id=f"{name}-calls",
        steps=[DefaultStep("use", f"Use the {name} tools.", tools=[f"{name}.*"])],
        mcp_servers={name: server},
    )
    events: list[Event] = []
    result = AgentExecutor(model=model).execute_sync(recipe, listeners=[events.append])
    assert result.ok, result.error
    return result, events, model


def test_the_time_servers_tools_are_listed_with_their_schemas() -> None:
    import asyncio

    listed = asyncio.run(list_mcp_tools({"time": TIME}))["time"]
    assert sorted(t.name for t in listed) == ["time_convert_time", "time_get_current_time"]
    convert = next(t for t in listed if t.name == "time_convert_time")
    assert convert.origin == ("time", "convert_time")
    assert convert.description == "Convert time between timezones"
    assert convert.parameters["required"] == ["source_timezone", "time", "target_timezone"]
    assert "UTC" in convert.parameters["properties"]["source_timezone"]["description"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_time_server_answers_and_refuses_as_itself(
    transport: str,
    capfd: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    if not structlog.is_configured():
        request.addfinalizer(structlog.reset_defaults)
    calls = [
        (
            "convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        ),
        ("get_current_time", {"timezone": "Nowhere/Land"}),
    ]
    with structlog.testing.capture_logs() as logs:
        if transport == "stdio":
            result, events, model = run(TIME, "time", calls)
        else:
            with serve_http(create_server("UTC").streamable_http_app()) as url:
                result, events, model = run({"url": url}, "time", calls)

    converted, refused = result.step("use").tool_calls
    # A structured result (the server declares an output schema): the value itself.
    value = converted.response.result
    assert value["source"]["datetime"].endswith("T12:00:00+00:00")
    assert value["target"]["timezone"] == "Asia/Tokyo"
    assert value["target"]["datetime"].endswith("T21:00:00+09:00")
    assert value["time_difference"] == "+9.0h"
    # An `is_error` result: a failed call whose message the model reads.
    assert refused.response.error is not None
    assert "Invalid timezone" in refused.response.error
    failed = [e for e in events if isinstance(e, ToolCallFailed)]
    assert [e.name for e in failed] == ["time_get_current_time"]
    assert "Invalid timezone" in str(model.requests[1])
    if transport == "stdio":
        # The server logs each failed call on its stderr, in a box of several lines: none of
        # them is ours to print; they are counted in one summary.
        assert "Invalid timezone" not in capfd.readouterr().err
        (summary,) = [e for e in logs if e["event"] == "mcp_server_stderr"]
        assert summary["lines"] >= 1


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A throwaway git repository with one commit and one changed file."""
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=Ada", "-c", "user.email=ada@example.org", *args],
            cwd=repo,
            check=True,
            capture_output=True,
        )

    git("init", "-q", "-b", "main")
    (repo / "bees.md").write_text("Bees pollinate crops.\n")
    git("add", "bees.md")
    git("commit", "-q", "-m", "Notes about bees")
    (repo / "bees.md").write_text("Bees pollinate a third of our crops.\n")
    return repo


def test_the_git_server_reads_and_writes_a_repository(repository: Path) -> None:
    server = MCPStdioServer(
        command=sys.executable,
        args=["-m", "mcp_server_git", "--repository", str(repository)],
        env={"GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.org"},
    )
    repo = str(repository)
    result, _, _ = run(
        server,
        "git",
        [
            ("git_log", {"repo_path": repo}),
            ("git_diff_unstaged", {"repo_path": repo}),
            ("git_show", {"repo_path": repo, "revision": "no-such-revision"}),
        ],
    )
    log, diff, missing = result.step("use").tool_calls
    assert "Message: Notes about bees" in log.response.result
    assert "-Bees pollinate crops." in diff.response.result
    assert "+Bees pollinate a third of our crops." in diff.response.result
    assert missing.response.error is not None
    assert "no-such-revision" in missing.response.error

    # Tool steps call it too, with templated arguments and no model: a real commit.
    recipe = AgentRecipe(
        id="commit",
        steps=[
            ToolStep("stage", "git.git_add", {"repo_path": repo, "files": ["bees.md"]}),
            ToolStep(
                "commit",
                "git.git_commit",
                {"repo_path": repo, "message": "More about bees"},
                depends_on=["stage"],
            ),
        ],
        mcp_servers={"git": server},
    )
    committed = AgentExecutor().execute_sync(recipe)
    assert committed.ok, committed.error
    assert committed.step("commit").result().startswith("Changes committed successfully")
    history = subprocess.run(
        ["git", "log", "--format=%s"], cwd=repository, capture_output=True, text=True, check=True
    ).stdout
    assert history.splitlines() == ["More about bees", "Notes about bees"]


def test_the_dry_run_shows_the_reference_servers_schemas(repository: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from minions.cli._app import app

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        json.dumps(
            {
                "id": "both",
                "mcp_servers": {
                    "time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
                    "git": {
                        "command": sys.executable,
                        "args": ["-m", "mcp_server_git", "--repository", str(repository)],
                    },
                },
                "steps": [{"id": "a", "goal": "A.", "tools": ["time.*", "git.git_log"]}],
            }
        )
    )
    shown = CliRunner().invoke(app, ["run", str(recipe), "--dry-run", "--json", "--model", "test"])
    assert shown.exit_code == 0, shown.stderr
    servers = json.loads(shown.stdout)["mcp_servers"]
    git_log = next(t for t in servers["git"]["tools"] if t["name"] == "git_git_log")
    assert git_log["input_schema"]["required"] == ["repo_path"]
    assert {t["mcp_name"] for t in servers["time"]["tools"]} == {"get_current_time", "convert_time"}
