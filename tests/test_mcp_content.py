"""What an MCP tool's result gives the model, for every kind of content (issue 25): text
resources as their text, resource links with their URI, images, audio and blobs as a short
placeholder with their type and size (never base64), structured results where the server means
them; and a stdio server's stderr, summarised instead of copied onto ours."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from mcp_test_server import make_server, serve_http

from minions import AgentExecutor, AgentRecipe, DefaultStep, MCPServerError, ToolError
from minions.events import Event, ToolCallCompleted
from minions.testing import ScriptedModel
from minions.tools import MCPStdioServer
from minions.tools._mcp import MCPConnections

SERVER = Path(__file__).parent / "mcp_test_server.py"

CALLS = ["document", "scan", "link", "chart", "buzz", "reading", "add"]

EXPECTED: dict[str, Any] = {
    # An embedded text resource: its text, under its URI.
    "document": "[resource file:///notes/bees.md (text/markdown)]\n"
    "# Bees\n\nBees pollinate a third of our crops.\n",
    # Binary content: what it is and how big, never its bytes.
    "scan": "[resource file:///scans/a.pdf: application/pdf, 4 KB]",
    "link": "[resource link: wasps.md <file:///notes/wasps.md> (text/markdown, 2 KB): "
    "Notes about wasps]",
    # Text and an image, the image also (as base64) in the structured result: the content is
    # what the model reads, the structured copy is not.
    "chart": "Bees per hour, by month.\n[image: image/png, 150 KB]",
    "buzz": "[audio: audio/wav, 12 KB]",
    # Structured results with text only: the value, as the server typed it.
    "reading": {"city": "Paris", "celsius": 21},
    "add": 5,
}


def stdio(*args: str, timeout: float = 30) -> MCPStdioServer:
    return MCPStdioServer(command=sys.executable, args=[str(SERVER), *args], timeout=timeout)


def call_each(server: Any) -> tuple[dict[str, Any], list[Event], ScriptedModel]:
    arguments = {"add": {"a": 2, "b": 3}}
    model = ScriptedModel([[(f"t_{name}", arguments.get(name, {})) for name in CALLS], "seen"])
    recipe = AgentRecipe(
        id="content",
        steps=[DefaultStep("look", "Look at everything.", tools=["t.*"])],
        mcp_servers={"t": server},
    )
    events: list[Event] = []
    result = AgentExecutor(model=model).execute_sync(recipe, listeners=[events.append])
    assert result.ok, result.error
    calls = result.step("look").tool_calls
    results = {}
    for name, call in zip(CALLS, calls, strict=True):
        assert call.response is not None
        results[name] = call.response.result
    return results, events, model


@pytest.fixture
def http_server() -> Iterator[str]:
    """The content test server over streamable HTTP on 127.0.0.1."""
    with serve_http(make_server("http").streamable_http_app()) as url:
        yield url


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_every_kind_of_content_reaches_the_model_as_what_it_is(
    transport: str, request: pytest.FixtureRequest
) -> None:
    server: Any = (
        stdio() if transport == "stdio" else {"url": request.getfixturevalue("http_server")}
    )
    results, events, model = call_each(server)

    assert results == EXPECTED
    # What the model read next holds no base64: the 150 KB image is a placeholder.
    follow_up = str(model.requests[1])
    assert len(follow_up) < 5_000
    completed = {e.name: e.content for e in events if isinstance(e, ToolCallCompleted)}
    assert completed["t_chart"] == EXPECTED["chart"]
    assert completed["t_reading"] == '{"city":"Paris","celsius":21}'


def test_a_servers_stderr_is_summarised_not_copied(
    capfd: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    # capture_logs leaves structlog "configured": put it back as it was for the other tests.
    if not structlog.is_configured():
        request.addfinalizer(structlog.reset_defaults)
    model = ScriptedModel([[("t_complain", {"lines": 40})], "heard"])
    recipe = AgentRecipe(
        id="noisy",
        steps=[DefaultStep("listen", "Listen.", tools=["t.complain"])],
        mcp_servers={"t": stdio("--stderr", "31")},
    )
    with structlog.testing.capture_logs() as logs:
        result = AgentExecutor(model=model).execute_sync(recipe)
    assert result.ok, result.error

    # Not one of the server's 71 lines reached our stderr...
    assert "of the server" not in capfd.readouterr().err
    # ...they are one summary, with the count and the last lines.
    (summary,) = [e for e in logs if e["event"] == "mcp_server_stderr"]
    assert summary["server"] == "t"
    assert summary["lines"] == 71
    assert summary["last"][-1] == "WARNING complaint 39 of the server"
    assert len(summary["last"]) == 5


async def test_a_server_that_cannot_start_is_named_with_its_last_words(
    capfd: pytest.CaptureFixture[str],
) -> None:
    connections = MCPConnections({"db": stdio("--stderr", "3", "--fail-start")})
    with pytest.raises(MCPServerError) as raised:
        await connections.open()
    message = str(raised.value)
    assert message.startswith("MCP server 'db' (stdio: ")
    assert "could not be started" in message
    assert message.endswith(
        "(its stderr ended with: INFO starting, line 2 of the server's log | Traceback (most "
        "recent call last): | RuntimeError: no database at /nowhere/notes.db)"
    )
    assert "no database" not in capfd.readouterr().err


def test_an_error_result_with_an_image_says_so_in_words() -> None:
    # An `is_error` result's blocks become its message the same way: no base64 there either.
    from minions.tools._mcp import _result

    class Block:
        def __init__(self, **fields: Any) -> None:
            self.__dict__.update(fields)

    failed = Block(
        is_error=True,
        structured_content=None,
        content=[
            Block(type="text", text="rendering failed; the partial image:"),
            Block(type="image", data="A" * 4000, mime_type="image/jpeg"),
        ],
    )
    with pytest.raises(ToolError) as raised:
        _result("t", "render", failed)
    assert str(raised.value) == (
        "MCP tool 'render' of server 't' failed: rendering failed; the partial image:\n"
        "[image: image/jpeg, 3 KB]"
    )
