"""An MCP server for the tests, run as a child process over stdio (``python
mcp_test_server.py``) or served over streamable HTTP by `serve_http`.

``--started FILE --gate FILE``: write FILE once the process runs, then wait for the gate
file before serving (a server slow to start); ``--never-serve``: never answer at all;
``--junk N``: print N lines that are not JSON-RPC on stdout before serving (a server that
logs to stdout); ``--stderr N``: print N lines on stderr before serving (a server that logs
there); ``--fail-start``: print an error on stderr and exit (a server that cannot start).

Its tools answer with every kind of MCP content: text, structured values, images and audio,
embedded text and binary resources, resource links (``document``, ``chart``...).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import select
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

BEES = "# Bees\n\nBees pollinate a third of our crops.\n"
CHART = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 600
"""A 150 KB "PNG" (its bytes do not matter, its size does)."""


def make_server(name: str = "test") -> MCPServer:
    server = MCPServer(name, log_level="ERROR")

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        log = os.environ.get("MCP_CALL_LOG")
        if log:
            with open(log, "a") as file:
                file.write(f"echo {text}\n")
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two whole numbers."""
        return a + b

    @server.tool()
    def refuse(reason: str) -> str:
        """Fail with the reason given."""
        raise ToolError(reason)

    @server.tool()
    def environment() -> dict[str, str]:
        """The server's environment variables."""
        return dict(os.environ)

    @server.tool()
    def where() -> str:
        """The server's working directory."""
        return os.getcwd()

    @server.tool()
    def exit_now() -> str:
        """End the server's process at once, in the middle of this call."""
        os._exit(3)

    @server.tool()
    async def hang() -> str:
        """Never answer."""
        await anyio.Event().wait()
        return "unreachable"

    @server.tool()
    def authorization(ctx: Context) -> str:
        """The Authorization header of the request (over HTTP), else "none"."""
        request = ctx.request_context.request
        headers = getattr(request, "headers", None)
        return headers.get("authorization", "none") if headers is not None else "none"

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def big(size: int) -> str:
        """A text of `size` characters."""
        return "x" * size

    @server.tool()
    def big_data(size: int) -> dict[str, str]:
        """Structured content holding a text of `size` characters."""
        return {"data": "y" * size}

    @server.tool()
    def picture() -> Image:
        """A small PNG image."""
        return Image(data=b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, format="png")

    @server.tool()
    def document() -> EmbeddedResource:
        """A text resource, embedded."""
        contents = TextResourceContents(
            uri="file:///notes/bees.md", text=BEES, mime_type="text/markdown"
        )
        return EmbeddedResource(type="resource", resource=contents)

    @server.tool()
    def scan() -> EmbeddedResource:
        """A binary resource, embedded."""
        blob = base64.b64encode(b"%PDF-1.7" + b"\x00" * 4088).decode()
        contents = BlobResourceContents(
            uri="file:///scans/a.pdf", blob=blob, mime_type="application/pdf"
        )
        return EmbeddedResource(type="resource", resource=contents)

    @server.tool()
    def link() -> ResourceLink:
        """A link to a resource, not its contents."""
        return ResourceLink(
            type="resource_link",
            uri="file:///notes/wasps.md",
            name="wasps.md",
            mime_type="text/markdown",
            size=2048,
            description="Notes about wasps",
        )

    @server.tool()
    def chart() -> CallToolResult:
        """A caption and a 150 KB image, with the image in the structured result too (as
        servers that wrap their content do)."""
        data = base64.b64encode(CHART).decode()
        return CallToolResult(
            content=[
                TextContent(type="text", text="Bees per hour, by month."),
                ImageContent(type="image", data=data, mime_type="image/png"),
            ],
            structured_content={"caption": "Bees per hour, by month.", "image": data},
        )

    @server.tool()
    def buzz() -> AudioContent:
        """A short sound."""
        data = base64.b64encode(b"RIFF" + b"\x00" * 12_284).decode()
        return AudioContent(type="audio", data=data, mime_type="audio/wav")

    @server.tool()
    def reading() -> CallToolResult:
        """A structured result whose text is a sentence, not its JSON."""
        return CallToolResult(
            content=[TextContent(type="text", text="It is 21 degrees in Paris.")],
            structured_content={"city": "Paris", "celsius": 21},
        )

    @server.tool()
    def complain(lines: int) -> str:
        """Print `lines` lines on stderr, then answer."""
        for i in range(lines):
            print(f"WARNING complaint {i} of the server", file=sys.stderr, flush=True)
        return "complained"

    @server.tool()
    def chatter(lines: int) -> str:
        """Print `lines` lines that are not JSON-RPC on stdout, then answer."""
        junk(lines)
        return "said"

    return server


@contextlib.contextmanager
def serve_http(app: Any) -> Iterator[str]:
    """Serve an MCP server's ASGI app (``server.streamable_http_app()``) with uvicorn on a free
    port of 127.0.0.1, in a daemon thread (so it never outlives the tests); yields its URL."""
    import asyncio
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    started = threading.Event()
    while not server.started and thread.is_alive():
        started.wait(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


_WIRE = [1]
"""The process's stdout, which the MCP SDK's server diverts to stderr while it serves: `main`
keeps a descriptor of it, so a server that logs to stdout reaches the client all the same."""


def junk(lines: int) -> None:
    """Lines on stdout that are not JSON-RPC, as a server logging there writes them.

    Each line is one write to the descriptor, between the transport's messages: a write to a
    pipe of at most PIPE_BUF bytes is atomic, so a message the transport writes meanwhile (a
    sync tool runs in a thread of its own) lands between two lines, never inside one (which
    made one line two, and the count one more, once in a while)."""
    for i in range(lines):
        line = f"INFO line {i} of the server's log on stdout\n".encode()
        assert len(line) <= select.PIPE_BUF
        os.write(_WIRE[0], line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--started")
    parser.add_argument("--gate")
    parser.add_argument("--never-serve", action="store_true")
    parser.add_argument("--junk", type=int, default=0)
    parser.add_argument("--stderr", type=int, default=0)
    parser.add_argument("--fail-start", action="store_true")
    options = parser.parse_args()
    for i in range(options.stderr):
        print(f"INFO starting, line {i} of the server's log", file=sys.stderr, flush=True)
    if options.fail_start:
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: no database at /nowhere/notes.db", file=sys.stderr, flush=True)
        sys.exit(2)
    if options.started:
        Path(options.started).write_text("started")
    if options.never_serve:
        threading.Event().wait()
    _WIRE[0] = os.dup(sys.stdout.fileno())
    if options.junk:
        junk(options.junk)
    if options.gate:
        gate = Path(options.gate)
        while not gate.exists():  # a server that takes its time to start
            time.sleep(0.01)
    make_server().run("stdio")


if __name__ == "__main__":
    main()
