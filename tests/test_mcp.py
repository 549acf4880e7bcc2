"""MCP servers as tools: in-process, a real stdio child and a streamable-HTTP server on
127.0.0.1; names, selection, failures the model sees, servers that die or start slowly,
collisions, ${VAR} expansion, load errors and the dry run."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as ServerToolError
from typer.testing import CliRunner

from minions import (
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    MCPServerError,
    RecipeError,
    StepStatus,
    ToolStep,
    tool,
)
from minions.cli._app import app
from minions.events import Event, ToolCallCompleted, ToolCallFailed, ToolCallStarted
from minions.recipes import dump_recipe, load_recipe, parse_recipe
from minions.testing import ScriptedModel
from minions.tools import MCPHttpServer, MCPStdioServer
from minions.tools._mcp import MCPConnections, describe_server, exposed_name

SERVER = Path(__file__).parent / "mcp_test_server.py"


def files_server() -> MCPServer:
    server = MCPServer("files", log_level="ERROR")
    calls: list[str] = []
    server.calls = calls  # type: ignore[attr-defined]

    @server.tool()
    def read_file(path: str) -> str:
        """Read a file of the project."""
        calls.append(f"read_file {path}")
        return f"contents of {path}"

    @server.tool()
    def list_dir(folder: str = ".") -> list[str]:
        """List a folder."""
        calls.append(f"list_dir {folder}")
        return ["a.txt", "b.txt"]

    @server.tool()
    def remove(path: str) -> str:
        """Remove a file (refused)."""
        raise ServerToolError(f"removing {path} is not allowed")

    return server


def run(recipe: AgentRecipe, model: ScriptedModel, **executor: Any) -> tuple[Any, list[Event]]:
    events: list[Event] = []
    result = AgentExecutor(model=model, **executor).execute_sync(recipe, listeners=[events.append])
    return result, events


def stdio(*args: str, timeout: float = 30, env: dict[str, str] | None = None) -> MCPStdioServer:
    return MCPStdioServer(
        command=sys.executable, args=[str(SERVER), *args], env=env or {}, timeout=timeout
    )


# -- in process ----------------------------------------------------------------------------------


def test_a_servers_tools_are_offered_under_server_names_and_called_with_their_own() -> None:
    server = files_server()
    model = ScriptedModel([[("files_read_file", {"path": "setup.cfg"})], "It is a config."])
    recipe = AgentRecipe(
        id="find",
        steps=[DefaultStep("find", "Find the config file.", tools=["files.read_file"])],
        mcp_servers={"files": server},
    )
    result, events = run(recipe, model)
    assert result.status is StepStatus.COMPLETED, result.error
    offered = model.requests[0].tools
    assert [t.name for t in offered] == ["files_read_file"]  # only what the step asked for
    assert offered[0].description == "Read a file of the project."
    assert offered[0].parameters["properties"]["path"]["type"] == "string"
    assert offered[0].parameters["required"] == ["path"]
    assert server.calls == ["read_file setup.cfg"]  # type: ignore[attr-defined]
    call = result.step("find").tool_calls[0]
    assert call.response is not None
    assert call.response.result == "contents of setup.cfg"
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.name, e.arguments) for e in started] == [("files_read_file", {"path": "setup.cfg"})]
    assert [e.content for e in completed] == ["contents of setup.cfg"]


def test_a_star_selects_every_tool_of_the_server_and_nothing_else() -> None:
    model = ScriptedModel(["done", "done"])

    @tool
    def local(x: int) -> int:
        """A Python tool."""
        return x

    recipe = AgentRecipe(
        id="all",
        steps=[
            DefaultStep("everything", "Look around.", tools=["files.*"]),
            DefaultStep("mixed", "Look again.", tools=["files.list_dir", "local"]),
        ],
        mcp_servers={"files": files_server()},
    )
    result, _ = run(recipe, model, tools=[local])
    assert result.ok, result.error
    first, second = model.requests
    assert sorted(t.name for t in first.tools) == [
        "files_list_dir",
        "files_read_file",
        "files_remove",
    ]
    assert sorted(t.name for t in second.tools) == ["files_list_dir", "local"]


def test_an_error_result_is_a_failed_tool_call_the_model_sees() -> None:
    model = ScriptedModel([[("files_remove", {"path": "a.txt"})], "I may not remove it."])
    recipe = AgentRecipe(
        id="rm",
        steps=[DefaultStep("rm", "Remove a.txt.", tools=["files.*"])],
        mcp_servers={"files": files_server()},
    )
    result, events = run(recipe, model)
    assert result.ok
    failed = [e for e in events if isinstance(e, ToolCallFailed)]
    assert len(failed) == 1
    assert "removing a.txt is not allowed" in failed[0].error
    assert failed[0].attempt == 1  # the server's answer: not retried
    seen = model.requests[1].messages[-1]
    assert seen.role == "tool"
    assert "removing a.txt is not allowed" in seen.content


def test_arguments_are_checked_against_the_servers_schema_before_the_call() -> None:
    server = files_server()
    model = ScriptedModel([[("files_read_file", {"path": 3})], "ok"])
    recipe = AgentRecipe(
        id="bad",
        steps=[DefaultStep("bad", "Read.", tools=["files.read_file"])],
        mcp_servers={"files": server},
    )
    result, _ = run(recipe, model)
    assert result.ok
    assert server.calls == []  # type: ignore[attr-defined]
    assert "path: 3 is not of type 'string'" in model.requests[1].messages[-1].content


def test_a_tool_step_may_call_an_mcp_tool() -> None:
    recipe = AgentRecipe(
        id="direct",
        steps=[ToolStep("read", "files.read_file", {"path": "notes.md"})],
        mcp_servers={"files": files_server()},
    )
    result, _ = run(recipe, ScriptedModel([]))
    assert result.ok, result.error
    assert result.output == "contents of notes.md"


def test_a_tool_the_server_does_not_offer_fails_the_run_naming_the_step() -> None:
    recipe = AgentRecipe(
        id="typo",
        steps=[DefaultStep("find", "Find.", tools=["files.read_fil"])],
        mcp_servers={"files": files_server()},
    )
    result, _ = run(recipe, ScriptedModel(["never"]))
    assert result.status is StepStatus.FAILED
    assert result.error is not None
    assert "step 'find' asks for 'files.read_fil'" in result.error
    assert "did you mean 'read_file'?" in result.error
    assert result.step("find").status is StepStatus.SKIPPED


def test_a_name_taken_by_another_tool_is_an_error() -> None:
    @tool
    def files_read_file(path: str) -> str:
        """A Python tool that happens to have the name."""
        return path

    recipe = AgentRecipe(
        id="clash",
        steps=[DefaultStep("find", "Find.", tools=["files.*"])],
        mcp_servers={"files": files_server()},
    )
    result, _ = run(recipe, ScriptedModel(["never"]), tools=[files_read_file])
    assert result.status is StepStatus.FAILED
    assert result.error is not None
    assert (
        "tool 'files_read_file' and tool 'read_file' of MCP server 'files' would both be "
        "offered to the model as 'files_read_file'"
    ) in result.error


def test_two_server_tools_that_sanitize_alike_collide() -> None:
    server = MCPServer("odd", log_level="ERROR")
    server.add_tool(lambda: "dot", name="read.file", description="With a dot.")
    server.add_tool(lambda: "underscore", name="read_file", description="With an underscore.")
    recipe = AgentRecipe(
        id="clash",
        steps=[DefaultStep("find", "Find.", tools=["odd.*"])],
        mcp_servers={"odd": server},
    )
    result, _ = run(recipe, ScriptedModel(["never"]))
    assert result.status is StepStatus.FAILED
    assert "would both be offered to the model as 'odd_read_file'" in (result.error or "")


def test_names_are_sanitized_and_long_ones_cut_with_a_hash() -> None:
    assert exposed_name("files", "read_file") == "files_read_file"
    assert exposed_name("web", "search.v2/query") == "web_search_v2_query"
    long_a = exposed_name("server", "x" * 80 + "a")
    long_b = exposed_name("server", "x" * 80 + "b")
    assert len(long_a) == len(long_b) == 64
    assert long_a != long_b
    assert long_a.startswith("server_xxx")
    assert exposed_name("server", "x" * 80 + "a") == long_a  # stable


async def test_the_tool_list_is_refreshed_when_the_server_says_it_changed() -> None:
    server = MCPServer("growing", log_level="ERROR")

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool."""
        server.add_tool(lambda: "new", name="fresh", description="Just added.")
        await ctx.notify_tools_changed()
        return "grown"

    changed = asyncio.Event()
    seen: list[list[str]] = []

    def on_change(registry: Any) -> None:
        seen.append(registry.names)
        changed.set()

    connections = MCPConnections({"g": server}, on_change=on_change)
    registry = await connections.open()
    try:
        assert registry.names == ["g_grow"]
        assert await registry.require("g_grow").fn() == "grown"
        async with asyncio.timeout(30):
            await changed.wait()
    finally:
        await connections.close()
    assert seen == [["g_fresh", "g_grow"]]


async def test_older_servers_list_changed_notifications_refresh_the_tools_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server of the 2025 protocol says so with `notifications/tools/list_changed`."""
    import functools

    import mcp

    monkeypatch.setattr(mcp, "Client", functools.partial(mcp.Client, mode="legacy"))
    server = MCPServer("old", log_level="ERROR")

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool."""
        server.add_tool(lambda: "new", name="fresh", description="Just added.")
        await ctx.session.send_tool_list_changed()
        return "grown"

    changed = asyncio.Event()
    connections = MCPConnections({"o": server}, on_change=lambda _registry: changed.set())
    registry = await connections.open()
    try:
        await registry.require("o_grow").fn()
        async with asyncio.timeout(30):
            await changed.wait()
        assert connections.registry().names == ["o_fresh", "o_grow"]
    finally:
        await connections.close()


def test_without_the_mcp_package_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    recipe = AgentRecipe(
        id="none",
        steps=[DefaultStep("find", "Find.", tools=["files.*"])],
        mcp_servers={"files": MCPStdioServer(command="python")},
    )
    result, _ = run(recipe, ScriptedModel(["never"]))
    assert result.status is StepStatus.FAILED
    assert "pip install 'minions[mcp]'" in (result.error or "")


# -- a real child process over stdio -------------------------------------------------------------


def test_a_stdio_server_gets_only_the_environment_the_recipe_gives_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MINIONS_TEST_SECRET", "do-not-leak")
    monkeypatch.setenv("GIVEN_VALUE", "for-the-server")
    model = ScriptedModel([[("t_environment", {})], "done"])
    recipe = AgentRecipe(
        id="env",
        steps=[DefaultStep("look", "Look.", tools=["t.environment"])],
        mcp_servers={
            "t": {
                "command": sys.executable,
                "args": [str(SERVER)],
                "env": {"GIVEN": "${GIVEN_VALUE}"},
            }
        },
    )
    result, _ = run(recipe, model)
    assert result.ok, result.error
    environment = result.step("look").tool_calls[0].response.result
    assert environment["GIVEN"] == "for-the-server"
    assert "MINIONS_TEST_SECRET" not in environment
    started_with = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "GIVEN"}
    # Python itself may set LC_CTYPE in a child whose locale is C (PEP 538).
    assert set(environment) - started_with <= {"LC_CTYPE"}


def test_parallel_steps_share_one_connection_per_server_per_run() -> None:
    model = ScriptedModel(
        [[("t_pid", {})], [("t_pid", {})], "one", "two"],
    )
    recipe = AgentRecipe(
        id="pids",
        steps=[
            DefaultStep("a", "Ask.", tools=["t.pid"]),
            DefaultStep("b", "Ask too.", tools=["t.pid"]),
        ],
        mcp_servers={"t": stdio()},
    )
    result, _ = run(recipe, model)
    assert result.ok, result.error
    pids = {e.tool_calls[0].response.result for e in result.executions}
    assert len(pids) == 1
    assert pids != {os.getpid()}


def test_a_server_that_dies_mid_run_fails_its_calls_and_the_run_goes_on() -> None:
    model = ScriptedModel(
        [
            [("t_exit_now", {})],
            [("t_echo", {"text": "still there?"})],
            "The server is gone.",
        ]
    )
    recipe = AgentRecipe(
        id="dies",
        steps=[DefaultStep("use", "Use the server.", tools=["t.*"])],
        mcp_servers={"t": stdio()},
    )
    result, events = run(recipe, model)
    assert result.ok, result.error
    assert result.output == "The server is gone."
    failed = [e for e in events if isinstance(e, ToolCallFailed)]
    assert [e.name for e in failed] == ["t_exit_now", "t_echo"]
    assert "MCP server 't'" in failed[0].error
    assert "MCP server 't'" in failed[1].error


def appears(path: Path) -> None:
    """Wait (up to a minute) for a file to exist."""
    pause = threading.Event()
    for _ in range(6000):
        if path.exists():
            return
        pause.wait(0.01)
    raise AssertionError(f"{path} never appeared")


def test_a_server_slow_to_start_is_waited_for(tmp_path: Path) -> None:
    started, gate = tmp_path / "started", tmp_path / "gate"
    model = ScriptedModel([[("t_echo", {"text": "hi"})], "done"])
    recipe = AgentRecipe(
        id="slow",
        steps=[DefaultStep("use", "Use it.", tools=["t.echo"])],
        mcp_servers={"t": stdio("--started", str(started), "--gate", str(gate))},
    )

    async def main() -> Any:
        running = asyncio.create_task(AgentExecutor(model=model).execute(recipe))
        await asyncio.to_thread(appears, started)  # the process runs, and does not serve yet
        assert not running.done()
        gate.touch()
        return await running

    result = asyncio.run(main())
    assert result.ok, result.error
    assert result.step("use").tool_calls[0].response.result == "hi"


def test_a_server_that_does_not_start_in_time_fails_the_run_before_any_step() -> None:
    model = ScriptedModel(["never"])
    recipe = AgentRecipe(
        id="stuck",
        steps=[DefaultStep("use", "Use it.", tools=["t.*"])],
        mcp_servers={"t": stdio("--never-serve", timeout=0.5)},
    )
    result, _ = run(recipe, model)
    assert result.status is StepStatus.FAILED
    assert "MCP server 't'" in (result.error or "")
    assert "within 0.5s" in (result.error or "")
    assert model.requests == []
    assert result.step("use").status is StepStatus.SKIPPED


def test_a_command_that_does_not_exist_fails_the_run_naming_the_server() -> None:
    recipe = AgentRecipe(
        id="missing",
        steps=[DefaultStep("use", "Use it.", tools=["t.*"])],
        mcp_servers={"t": MCPStdioServer(command="/no/such/mcp-server")},
    )
    result, _ = run(recipe, ScriptedModel(["never"]))
    assert result.status is StepStatus.FAILED
    assert "MCP server 't' (stdio: /no/such/mcp-server) could not be started" in (
        result.error or ""
    )


# -- streamable HTTP on 127.0.0.1 ----------------------------------------------------------------


@pytest.fixture
def http_server() -> Iterator[str]:
    """The test server over streamable HTTP on a free port of 127.0.0.1, stopped after the
    test (and a daemon thread, so it never outlives the tests)."""
    from mcp_test_server import make_server, serve_http

    with serve_http(make_server("http").streamable_http_app()) as url:
        yield url


def test_a_streamable_http_server_gets_the_headers(http_server: str) -> None:
    model = ScriptedModel([[("web_add", {"a": 2, "b": 3}), ("web_authorization", {})], "5"])
    recipe = AgentRecipe(
        id="http",
        steps=[DefaultStep("sum", "Add.", tools=["web.add", "web.authorization"])],
        mcp_servers={"web": {"url": http_server, "headers": {"Authorization": "Bearer t0ken"}}},
    )
    result, _ = run(recipe, model)
    assert result.ok, result.error
    added, authorization = result.step("sum").tool_calls
    assert added.response is not None
    assert added.response.result == 5
    assert authorization.response is not None
    assert authorization.response.result == "Bearer t0ken"


def test_a_call_that_takes_longer_than_the_timeout_is_a_failure_the_model_sees(
    http_server: str,
) -> None:
    model = ScriptedModel([[("web_hang", {})], [("web_echo", {"text": "next"})], "moved on"])
    recipe = AgentRecipe(
        id="slow-call",
        steps=[DefaultStep("wait", "Wait.", tools=["web.*"])],
        mcp_servers={"web": MCPHttpServer(url=http_server, timeout=2)},
    )
    result, events = run(recipe, model)
    assert result.ok, result.error
    failed = [e for e in events if isinstance(e, ToolCallFailed)]
    assert [e.name for e in failed] == ["web_hang"]
    assert "did not answer within 2s" in failed[0].error
    assert result.step("wait").tool_calls[1].response.result == "next"


# -- YAML: the format, ${VAR}, load errors ------------------------------------------------------


def write(folder: Path, text: str) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(textwrap.dedent(text))
    return path


STDIO_RECIPE = f"""\
id: files
mcp_servers:
  t: {{command: "{sys.executable}", args: ["{SERVER}"], env: {{GIVEN: "${{GIVEN_VALUE}}"}}, timeout: 30}}
steps:
  - id: where
    goal: Where does the server run?
    tools: [t.where, "t.*"]
"""


def test_a_yaml_recipe_runs_its_stdio_server_in_the_recipes_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIVEN_VALUE", "x")
    recipe = load_recipe(write(tmp_path, STDIO_RECIPE))
    config = recipe.mcp_servers["t"]
    assert isinstance(config, MCPStdioServer)
    assert config.env == {"GIVEN": "x"}
    model = ScriptedModel([[("t_where", {})], "there"])
    result, _ = run(recipe, model)
    assert result.ok, result.error
    where = result.step("where").tool_calls[0].response.result
    assert Path(where).resolve() == tmp_path.resolve()


def test_a_missing_variable_is_a_load_error_naming_it_and_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GIVEN_VALUE", raising=False)
    with pytest.raises(RecipeError) as caught:
        load_recipe(write(tmp_path, STDIO_RECIPE))
    (problem,) = caught.value.problems
    assert problem.message == "environment variable 'GIVEN_VALUE' is not set"
    assert problem.line == 3
    assert problem.field == "mcp_servers.t.env.GIVEN"


def test_a_missing_variable_in_python_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SEARCH_TOKEN", raising=False)
    with pytest.raises(RecipeError, match="'SEARCH_TOKEN' is not set"):
        AgentRecipe(
            id="x",
            steps=[DefaultStep("a", "A.")],
            mcp_servers={
                "search": {"url": "http://127.0.0.1:1/mcp", "headers": {"A": "${SEARCH_TOKEN}"}}
            },
        )
    with pytest.raises(RecipeError, match="'SEARCH_TOKEN' is not set"):
        AgentExecutor(mcp_servers={"search": {"url": "http://h/mcp?t=${SEARCH_TOKEN}"}})


def test_an_unknown_server_in_a_steps_tools_is_a_load_error_naming_step_and_line(
    tmp_path: Path,
) -> None:
    text = """\
    id: typo
    mcp_servers:
      files: {command: python, args: [server.py]}
    steps:
      - id: find
        goal: Find it.
        tools: [file.read_file]
    """
    with pytest.raises(RecipeError) as caught:
        load_recipe(write(tmp_path, text))
    (problem,) = caught.value.problems
    assert problem.step == "find"
    assert problem.line == 7
    assert "unknown MCP server 'file' (did you mean 'files'?)" in problem.message


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ("{command: python, url: 'http://x'}", "exactly one of `command`"),
        ("{command: python, headers: {}}", "unknown field 'headers'"),
        ("{url: 'ftp://x'}", "url must start with http:// or https://"),
        ("{command: python, timeout: 0}", "timeout must be a positive number"),
        ("python server.py", "a mapping with `command`"),
    ],
)
def test_bad_server_definitions_are_load_errors(tmp_path: Path, server: str, message: str) -> None:
    text = f"""\
    id: bad
    mcp_servers:
      s: {server}
    steps:
      - id: a
        goal: A.
    """
    with pytest.raises(RecipeError) as caught:
        load_recipe(write(tmp_path, text))
    assert any(message in p.message and p.line == 3 for p in caught.value.problems), (
        caught.value.problems
    )


def test_the_recipe_schema_describes_mcp_servers() -> None:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    servers = schema["properties"]["mcp_servers"]["additionalProperties"]["anyOf"]
    names = {ref["$ref"].rsplit("/", 1)[1] for ref in servers}
    assert names == {"MCPStdioSpec", "MCPHttpSpec"}
    assert set(schema["$defs"]["MCPStdioSpec"]["properties"]) == {
        "command",
        "args",
        "env",
        "cwd",
        "timeout",
    }
    assert set(schema["$defs"]["MCPHttpSpec"]["properties"]) == {"url", "headers", "timeout"}


# -- the dry run ---------------------------------------------------------------------------------


def test_the_dry_run_lists_mcp_tools_without_calling_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("GIVEN_VALUE", str(log))
    text = STDIO_RECIPE.replace("GIVEN:", "MCP_CALL_LOG:").replace("t.where", "t.echo")
    recipe = write(tmp_path, text)
    result = CliRunner().invoke(app, ["run", str(recipe), "--dry-run", "--model", "test"])
    assert result.exit_code == 0, result.stderr
    assert "MCP tools (listed by connecting to each server; none called)" in result.stdout
    assert "t_echo" in result.stdout
    assert "Say the text back." in result.stdout
    data = json.loads(
        CliRunner()
        .invoke(app, ["run", str(recipe), "--dry-run", "--json", "--model", "test"])
        .stdout
    )
    tools = {t["name"]: t for t in data["mcp_servers"]["t"]["tools"]}
    echo = tools["t_echo"]
    assert (echo["mcp_name"], echo["description"]) == ("echo", "Say the text back.")
    # The schema the model is offered, as the server listed it.
    assert echo["input_schema"]["type"] == "object"
    assert echo["input_schema"]["required"] == ["text"]
    assert echo["input_schema"]["properties"]["text"]["type"] == "string"
    assert tools["t_add"]["input_schema"]["properties"]["b"]["type"] == "integer"
    assert data["mcp_servers"]["t"]["server"].startswith("stdio: ")
    assert not log.exists()  # listed, never called


def test_the_dry_run_says_when_a_server_cannot_start(tmp_path: Path) -> None:
    text = """\
    id: broken
    mcp_servers:
      t: {command: /no/such/mcp-server}
    steps:
      - id: a
        goal: A.
        tools: ["t.*"]
    """
    result = CliRunner().invoke(
        app, ["run", str(write(tmp_path, text)), "--dry-run", "--model", "test"]
    )
    assert result.exit_code == 1
    assert "MCP server 't' (stdio: /no/such/mcp-server) could not be started" in result.stderr
    assert "Traceback" not in result.stderr


async def test_list_errors_bubble_as_mcp_server_errors() -> None:
    connections = MCPConnections({"t": MCPStdioServer(command="/no/such/mcp-server")})
    with pytest.raises(MCPServerError, match="could not be started"):
        await connections.open()


def test_a_python_recipe_with_mcp_servers_dumps_to_yaml_without_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = AgentRecipe(
        id="dump",
        steps=[DefaultStep("a", "A.", tools=["files.*"])],
        mcp_servers={"files": {"command": "python", "args": ["files.py"], "timeout": 5}},
    )
    again = parse_recipe(dump_recipe(plain))
    assert again.mcp_servers["files"] == MCPStdioServer(
        command="python", args=["files.py"], cwd=Path(".").resolve(), timeout=5
    )
    monkeypatch.setenv("TOKEN", "s3cret")
    secret = AgentRecipe(
        id="dump",
        steps=[DefaultStep("a", "A.", tools=["web.*"])],
        mcp_servers={"web": {"url": "http://h/mcp", "headers": {"A": "Bearer ${TOKEN}"}}},
    )
    with pytest.raises(RecipeError) as caught:
        dump_recipe(secret)
    assert "s3cret" not in str(caught.value)
    assert "not written" in str(caught.value)


def test_server_descriptions_in_errors_and_plans_hide_credentials() -> None:
    server = MCPHttpServer(url="http://user:pw@127.0.0.1:8000/mcp?token=s3cret#x")
    assert describe_server(server) == "http: http://127.0.0.1:8000/mcp"
    assert "s3cret" not in repr(MCPHttpServer(url="http://h/mcp", headers={"A": "s3cret"}))
    assert "s3cret" not in repr(MCPStdioServer(command="x", env={"TOKEN": "s3cret"}))


def test_an_http_server_that_cannot_be_reached_fails_the_run_naming_it() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    recipe = AgentRecipe(
        id="unreachable",
        steps=[DefaultStep("use", "Use it.", tools=["web.*"])],
        mcp_servers={"web": MCPHttpServer(url=f"http://127.0.0.1:{port}/mcp", timeout=10)},
    )
    result, _ = run(recipe, ScriptedModel(["never"]))
    assert result.status is StepStatus.FAILED
    assert f"MCP server 'web' (http: http://127.0.0.1:{port}/mcp) could not be reached" in (
        result.error or ""
    )


def test_cancelling_a_run_mid_call_closes_the_connection_and_stops_the_child() -> None:
    model = ScriptedModel([[("t_pid", {})], [("t_hang", {})], "never"])
    recipe = AgentRecipe(
        id="cancel",
        steps=[DefaultStep("use", "Use it.", tools=["t.*"])],
        mcp_servers={"t": stdio()},
    )

    async def main() -> int:
        hanging = asyncio.Event()
        pids: list[int] = []

        def listen(event: Event) -> None:
            if isinstance(event, ToolCallCompleted) and event.name == "t_pid":
                pids.append(int(event.content))
            if isinstance(event, ToolCallStarted) and event.name == "t_hang":
                hanging.set()

        running = asyncio.create_task(
            AgentExecutor(model=model).execute(recipe, listeners=[listen])
        )
        async with asyncio.timeout(60):
            await hanging.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return pids[0]

    pid = asyncio.run(main())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the child was stopped and reaped when the run ended


def test_a_server_without_tools_offers_none() -> None:
    server = MCPServer("resources", log_level="ERROR")

    @server.resource("note://bees")
    def bees() -> str:
        return "bees"

    recipe = AgentRecipe(
        id="no-tools",
        steps=[DefaultStep("look", "Look.", tools=["r.*"])],
        mcp_servers={"r": server},
    )
    model = ScriptedModel(["nothing to call"])
    result, _ = run(recipe, model)
    assert result.ok, result.error
    assert model.requests[0].tools == ()


def test_an_mcp_tool_call_is_an_execute_tool_span_naming_its_server() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedModel([[("files_read_file", {"path": "setup.cfg"})], "It is a config."])
    recipe = AgentRecipe(
        id="find",
        steps=[DefaultStep("find", "Find the config file.", tools=["files.read_file"])],
        mcp_servers={"files": files_server()},
    )
    result, _ = run(recipe, model, tracer_provider=provider)
    assert result.status is StepStatus.COMPLETED, result.error
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert span.name == "execute_tool files_read_file"
    assert span.attributes is not None
    assert span.attributes["mcp.method.name"] == "tools/call"
    assert span.attributes["minions.mcp.server"] == "files"
    assert span.attributes["minions.mcp.tool"] == "read_file"


# -- bounds --------------------------------------------------------------------------------------


def test_a_result_over_the_cap_is_cut_with_a_note_the_model_sees() -> None:
    from mcp_test_server import make_server

    model = ScriptedModel(
        [
            [
                ("t_big", {"size": 20_000_000}),
                ("t_big_data", {"size": 1_000_000}),
                ("t_big", {"size": 200_000}),
                ("t_picture", {}),
            ],
            "done",
        ]
    )
    # In process: over stdio the MCP SDK alone takes seconds to read 20 MB (it re-splits its
    # whole buffer for every chunk), which is not what this test is about.
    recipe = AgentRecipe(
        id="big",
        steps=[DefaultStep("fetch", "Fetch.", tools=["t.*"])],
        mcp_servers={"t": make_server()},
    )
    result, events = run(recipe, model)
    assert result.ok, result.error
    text, data, fits, picture = [c.response.result for c in result.step("fetch").tool_calls]
    assert text == "x" * 200_000 + "\n[cut: 20,000,000 characters, showing the first 200,000]"
    prefix = '{"data": "' + "y" * (200_000 - 10)
    assert data == prefix + "\n[cut: 1,000,012 characters, showing the first 200,000]"
    assert fits == "x" * 200_000  # at the cap: whole, no note
    assert picture == "[image: image/png, 72 bytes]"  # never base64
    follow_up = str(model.requests[1])
    assert "[cut: 20,000,000 characters, showing the first 200,000]" in follow_up
    assert len(follow_up) < 1_000_000
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert max(len(str(e.content)) for e in completed) < 201_000


def test_a_servers_stray_stdout_lines_are_counted_not_logged_line_by_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    import structlog

    caplog.set_level(logging.DEBUG)
    model = ScriptedModel([[("t_chatter", {"lines": 3000})], "done"])
    recipe = AgentRecipe(
        id="chatty",
        steps=[DefaultStep("talk", "Talk.", tools=["t.chatter"])],
        mcp_servers={"t": stdio("--junk", "2000")},
    )
    with structlog.testing.capture_logs() as logs:
        result, _ = run(recipe, model)
    assert result.ok, result.error
    assert result.step("talk").tool_calls[0].response.result == "said"
    mcp_records = [r for r in caplog.records if r.name.startswith("mcp")]
    assert [r for r in mcp_records if r.exc_info] == []
    assert len(mcp_records) < 20
    said = [e for e in logs if e["event"].startswith("mcp_server_output_not_json_rpc")]
    assert [e["event"] for e in said] == [
        "mcp_server_output_not_json_rpc",
        "mcp_server_output_not_json_rpc_total",
    ]
    assert said[0]["server"] == said[1]["server"] == "t"
    assert said[1]["count"] == 5000
    # Outside minions' connections the SDK's records are left alone.
    caplog.clear()
    logging.getLogger("mcp.client.stdio").error("Failed to parse JSONRPC message from server")
    assert [r.getMessage() for r in caplog.records] == [
        "Failed to parse JSONRPC message from server"
    ]
