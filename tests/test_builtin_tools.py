"""Built-in tools: the time, workspace files (confined), and opt-in HTTP GET."""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from minions import ToolCall, ToolCallExecutor, ToolRegistry
from minions.tools import builtin_tools, current_datetime, file_tools, http_get_tool


def call(registry: ToolRegistry, name: str, **arguments: object) -> tuple[object, str | None]:
    executor = ToolCallExecutor(registry)
    done = asyncio.run(executor.execute(ToolCall(id="1", name=name, arguments=arguments)))
    assert done.response is not None
    return done.response.result, done.response.error


def test_current_datetime_now_and_ago() -> None:
    now = current_datetime()
    assert abs(now["unix"] - dt.datetime.now(dt.UTC).timestamp()) < 5
    assert now["timezone"] == "UTC"
    earlier = current_datetime(hours_ago=24)
    assert abs((now["unix"] - earlier["unix"]) - 86400) < 5
    assert dt.datetime.fromisoformat(earlier["iso"]).tzinfo is not None
    week = current_datetime(days_ago=7, timezone="Europe/Oslo")
    assert week["timezone"] == "Europe/Oslo"
    _, error = call(ToolRegistry([current_datetime]), "current_datetime", timezone="Mars/Base")
    assert error == "Unknown time zone 'Mars/Base'; use a name such as 'UTC'."


def test_files_inside_the_workspace(tmp_path: Path) -> None:
    registry = ToolRegistry(file_tools(tmp_path))
    result, error = call(registry, "write_file", path="notes/a.txt", content="héllo")
    assert error is None
    assert result == {"path": "notes/a.txt", "bytes": 6}
    assert call(registry, "read_file", path="notes/a.txt") == ("héllo", None)
    assert call(registry, "list_files", path=".", pattern="**/*") == (["notes/a.txt"], None)
    assert (
        call(registry, "read_file", path="missing.txt")[1]
        == "No file 'missing.txt' in the workspace."
    )


@pytest.mark.parametrize(
    "path", ["../outside.txt", "/etc/passwd", "notes/../../x", "link/secret.txt", "escape.txt"]
)
def test_paths_outside_the_workspace_are_refused(tmp_path: Path, path: str) -> None:
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (workspace / "link").symlink_to(outside)
    (workspace / "escape.txt").symlink_to(outside / "secret.txt")
    registry = ToolRegistry(file_tools(workspace))
    for tool_name, args in [("read_file", {}), ("write_file", {"content": "x"})]:
        result, error = call(registry, tool_name, path=path, **args)
        assert result is None
        assert error is not None
        assert "is outside the workspace" in error
    assert (outside / "secret.txt").read_text() == "secret"


def test_list_files_skips_symlinks_leading_out(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "ok.txt").write_text("ok")
    (tmp_path / "secret.txt").write_text("s")
    (workspace / "escape.txt").symlink_to(tmp_path / "secret.txt")
    assert call(ToolRegistry(file_tools(workspace)), "list_files") == (["ok.txt"], None)


@pytest.fixture
def web() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/away"):
                self.send_response(302)
                self.send_header("Location", "http://example.org/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.startswith("/here"):
                self.send_response(302)
                self.send_header("Location", "/page")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b"x" * 300_000 if self.path.startswith("/big") else b"hello from the test server"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_get_is_off_unless_enabled(tmp_path: Path, web: str) -> None:
    assert "http_get" not in {t.name for t in builtin_tools(tmp_path)}
    registry = ToolRegistry(builtin_tools(tmp_path, http=True))
    result, error = call(registry, "http_get", url=f"{web}/page", max_chars=10)
    assert error is None
    assert result == {"status": 200, "url": f"{web}/page", "text": "hello from"}
    assert (
        call(registry, "http_get", url="file:///etc/passwd")[1]
        == "Not an http(s) URL: 'file:///etc/passwd'."
    )


def test_http_get_allowed_hosts(web: str) -> None:
    registry = ToolRegistry([http_get_tool(allowed_hosts=["example.org"])])
    _, error = call(registry, "http_get", url=web)
    assert error == "Host '127.0.0.1' is not allowed; allowed: ['example.org']."


def test_http_get_follows_redirects_only_to_allowed_hosts(web: str) -> None:
    registry = ToolRegistry([http_get_tool(allowed_hosts=["127.0.0.1"])])
    result, error = call(registry, "http_get", url=f"{web}/here")
    assert error is None
    assert isinstance(result, dict)
    assert result["url"] == f"{web}/page"
    _, error = call(registry, "http_get", url=f"{web}/away")
    assert error == "Host 'example.org' is not allowed; allowed: ['127.0.0.1']."


def test_http_get_caps_and_checks_max_chars(web: str) -> None:
    registry = ToolRegistry([http_get_tool(allowed_hosts=["127.0.0.1"])])
    result, error = call(registry, "http_get", url=f"{web}/big", max_chars=100_000_000)
    assert error is None
    assert isinstance(result, dict)
    assert len(result["text"]) == 200_000  # the ceiling, whatever the model asked
    executor = ToolCallExecutor(registry)
    done = asyncio.run(
        executor.execute(ToolCall(id="1", name="http_get", arguments={"url": web, "max_chars": -1}))
    )
    assert done.response is not None
    assert done.response.error == "max_chars must be a positive number, not -1."
    assert done.response.attempts == 1  # refused at once, not retried


def test_read_file_reads_at_most_its_cap(tmp_path: Path) -> None:
    huge = tmp_path / "huge.log"
    with huge.open("wb") as file:  # a sparse 2 GB file: nothing written to disk
        file.truncate(2_000_000_000)
    registry = ToolRegistry(file_tools(tmp_path))
    tracemalloc.start()
    try:
        result, error = call(registry, "read_file", path="huge.log")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error is None
    assert isinstance(result, str)
    assert len(result) == 1_000_000
    assert peak < 50_000_000  # a few MB, not the 2 GB file


@pytest.mark.parametrize(
    ("tool_name", "arguments", "expected"),
    [
        ("read_file", {"path": ""}, "The path is empty; give a path inside the workspace."),
        ("read_file", {"path": "a\x00b"}, "The path 'a\\x00b' holds a NUL character."),
        ("write_file", {"path": " ", "content": "x"}, "The path is empty"),
        ("list_files", {"pattern": "/etc/*"}, "The pattern '/etc/*' must be relative"),
    ],
)
def test_bad_file_tool_arguments_are_refused_naming_the_argument(
    tmp_path: Path, tool_name: str, arguments: dict[str, str], expected: str
) -> None:
    registry = ToolRegistry(file_tools(tmp_path))
    _, error = call(registry, tool_name, **arguments)
    assert error is not None
    assert error.startswith(expected)
    assert str(tmp_path) not in error  # never the host's path
