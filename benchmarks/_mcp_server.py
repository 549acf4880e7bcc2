"""The MCP server of the MCP benchmark: W2's three tools, over stdio (or in process)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench", log_level="ERROR")


@server.tool()
def get_weather(city: str) -> dict[str, Any]:
    """Weather in a city."""
    return {"city": city, "temp_c": 21}


@server.tool()
def get_time(tz: str) -> dict[str, Any]:
    """Time in a time zone."""
    return {"tz": tz, "time": "12:00"}


@server.tool()
def add(a: int, b: int) -> dict[str, Any]:
    """Add two integers."""
    return {"sum": a + b}


if __name__ == "__main__":
    server.run("stdio")
