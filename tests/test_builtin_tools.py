"""Built-in tools: the time, workspace files (confined), and opt-in HTTP GET."""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    ("path", "expected"),
    [
        ("../outside.txt", "Path '../outside.txt' is outside the workspace"),
        ("/etc/passwd", "Path '/etc/passwd' is outside the workspace"),
        ("notes/../../x", "Path 'notes/../../x' is outside the workspace"),
        ("..\\..\\outside.txt", "Path '..\\\\..\\\\outside.txt' is outside the workspace"),
        ("link/secret.txt", "'link' is a symbolic link; file tools never follow links"),
        ("escape.txt", "'escape.txt' is a symbolic link; file tools never follow links"),
    ],
)
def test_paths_outside_the_workspace_are_refused(tmp_path: Path, path: str, expected: str) -> None:
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
        assert error.startswith(expected)
        assert str(tmp_path) not in error
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
            if self.path.startswith("/inside?to="):
                self.send_response(302)
                self.send_header("Location", self.path.split("=", 1)[1])
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


PUBLIC_IP = "93.184.216.34"


@pytest.fixture
def public(web: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """`web` under the name ``public.test``, which resolves to a public address; connections
    to that address reach the local test server."""
    import socket

    from minions.tools import _builtin

    port = int(web.rsplit(":", 1)[1])
    real_getaddrinfo = socket.getaddrinfo
    real_connect = _builtin._connect

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "public.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC_IP, args[0]))]
        if host == "sneaky.test":  # a public-looking name pointing at the metadata service
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", args[0]))]
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(address: Any, timeout: Any, family: int) -> Any:
        if address[0] == PUBLIC_IP:
            address = ("127.0.0.1", port)
        return real_connect(address, timeout, family)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(_builtin, "_connect", connect)
    return f"http://public.test:{port}"


def test_http_get_is_off_unless_enabled(tmp_path: Path, public: str) -> None:
    assert "http_get" not in {t.name for t in builtin_tools(tmp_path)}
    registry = ToolRegistry(builtin_tools(tmp_path, http=True))
    result, error = call(registry, "http_get", url=f"{public}/page", max_chars=10)
    assert error is None
    assert result == {"status": 200, "url": f"{public}/page", "text": "hello from"}
    assert (
        call(registry, "http_get", url="file:///etc/passwd")[1]
        == "Not an http(s) URL: 'file:///etc/passwd'."
    )


def test_http_get_allowed_hosts(web: str) -> None:
    registry = ToolRegistry([http_get_tool(allowed_hosts=["example.org"])])
    _, error = call(registry, "http_get", url=web)
    port = web.rsplit(":", 1)[1]
    assert error == f"Host '127.0.0.1:{port}' is not allowed; allowed: ['example.org']."


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
    assert result == "\x00" * 1_000_000 + (
        "\n[cut: 2,000,000,000 bytes, showing the first 1,000,000]"
    )
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


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:{port}/page", "a loopback address"),
        ("http://localhost:{port}/page", "a loopback address"),
        ("http://[::1]:{port}/page", "a loopback address"),
        ("http://[::ffff:127.0.0.1]:{port}/page", "a loopback address"),
        ("http://10.0.0.1:{port}/", "a private address"),
        ("http://169.254.169.254/latest/meta-data/", "a link-local address"),
        ("http://sneaky.test/", "a link-local address"),
        ("http://0.0.0.0:{port}/", "an unspecified address"),
    ],
)
def test_http_get_never_goes_to_private_addresses_by_default(
    public: str, url: str, reason: str
) -> None:
    port = public.rsplit(":", 1)[1]
    executor = ToolCallExecutor(ToolRegistry([http_get_tool()]))
    call_ = ToolCall(id="1", name="http_get", arguments={"url": url.format(port=port)})
    done = asyncio.run(executor.execute(call_))
    assert done.response is not None
    assert reason in (done.response.error or "")
    assert "http_get does not go there unless the recipe allows it" in (done.response.error or "")
    assert done.response.attempts == 1  # refused at once, not retried


def test_http_get_allows_a_private_host_named_with_its_port(web: str) -> None:
    port = int(web.rsplit(":", 1)[1])
    allowed = ToolRegistry([http_get_tool(allowed_hosts=[f"127.0.0.1:{port}"])])
    result, error = call(allowed, "http_get", url=f"{web}/page")
    assert error is None
    assert isinstance(result, dict)
    assert result["status"] == 200
    other = ToolRegistry([http_get_tool(allowed_hosts=[f"127.0.0.1:{port + 1}"])])
    _, error = call(other, "http_get", url=f"{web}/page")
    assert error == f"Host '127.0.0.1:{port}' is not allowed; allowed: ['127.0.0.1:{port + 1}']."


def test_http_get_checks_every_redirect_after_resolving_it(public: str) -> None:
    # A public page that redirects to the local network is refused at the redirect.
    registry = ToolRegistry([http_get_tool()])
    port = public.rsplit(":", 1)[1]
    result, error = call(
        registry, "http_get", url=f"{public}/inside?to=http://127.0.0.1:{port}/page"
    )
    assert result is None
    assert error is not None
    assert "resolves to 127.0.0.1, a loopback address" in error


def test_http_get_ignores_proxies_from_the_environment(
    public: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", "http://10.9.9.9:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://10.9.9.9:3128")
    result, error = call(ToolRegistry([http_get_tool()]), "http_get", url=f"{public}/page")
    assert error is None
    assert isinstance(result, dict)
    assert result["text"] == "hello from the test server"
