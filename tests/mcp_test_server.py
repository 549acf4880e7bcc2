"""An MCP server for the tests, run as a child process over stdio (``python
mcp_test_server.py``) or served over streamable HTTP by `serve_http`.

``--started FILE --gate FILE``: write FILE once the process runs, then wait for the gate
file before serving (a server slow to start); ``--never-serve``: never answer at all.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError


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

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--started")
    parser.add_argument("--gate")
    parser.add_argument("--never-serve", action="store_true")
    options = parser.parse_args()
    if options.started:
        Path(options.started).write_text("started")
    if options.never_serve:
        threading.Event().wait()
    if options.gate:
        gate = Path(options.gate)
        while not gate.exists():  # a server that takes its time to start
            time.sleep(0.01)
    make_server().run("stdio")


if __name__ == "__main__":
    main()
