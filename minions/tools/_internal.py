"""What the other layers of minions take from `minions.tools` and users do not: the one
module of this package they may import besides `minions.tools` itself.

Not public: any of it may change in any release. Who takes what, and why, is the table
"What a package takes from a neighbour's private module" of docs/architecture.md, which
``tests/test_architecture.py`` holds to the code. Each name loads its module on first use,
as a direct import of it would (a run with no MCP server never loads the MCP code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minions._lazy import lazy_names

_NAMES: dict[str, str] = {
    # The `ToolContext` a tool call runs in, which `tool_context()` returns: the step loop
    # enters it around each call.
    "enter": "minions.tools._context",
    "leave": "minions.tools._context",
    # MCP servers: their configs from a recipe or an executor, the connections of a run,
    # and a server's tools listed without calling one (`minions run --dry-run`).
    "DEFAULT_TIMEOUT": "minions.tools._mcp",
    "MCPConnections": "minions.tools._mcp",
    "describe_server": "minions.tools._mcp",
    "list_mcp_tools": "minions.tools._mcp",
    "server_config": "minions.tools._mcp",
    "server_configs": "minions.tools._mcp",
}

if TYPE_CHECKING:
    from minions.tools._context import enter as enter
    from minions.tools._context import leave as leave
    from minions.tools._mcp import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
    from minions.tools._mcp import MCPConnections as MCPConnections
    from minions.tools._mcp import describe_server as describe_server
    from minions.tools._mcp import list_mcp_tools as list_mcp_tools
    from minions.tools._mcp import server_config as server_config
    from minions.tools._mcp import server_configs as server_configs


__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
