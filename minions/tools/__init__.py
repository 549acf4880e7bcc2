"""Tools: typed Python functions a model may call, their registry, and the built-in tools.

The built-in tools are what YAML recipes get by name: `current_datetime`, the workspace file
tools (`file_tools`: ``read_file``, ``write_file``, ``list_files``, confined to one directory)
and the opt-in `http_get_tool`. `MCPStdioServer` and `MCPHttpServer` configure MCP servers whose
tools a recipe's steps may call (``mcp_servers``; needs ``pip install 'minions[mcp]'``).
"""

from typing import TYPE_CHECKING

from minions._lazy import lazy_names
from minions.tools._approval import ApprovalDecision, ApprovalRequest, Approver
from minions.tools._context import ToolContext, tool_context
from minions.tools._tool import Tool, ToolRegistry, tool

# The built-in tools and the MCP servers load on first use of one of their names: the step loop
# imports this package for `Tool`, and a run that uses neither need not build them.
_LAZY: dict[str, str] = {
    "MCPHttpServer": "minions.tools._mcp",
    "MCPStdioServer": "minions.tools._mcp",
    "builtin_tools": "minions.tools._builtin",
    "current_datetime": "minions.tools._builtin",
    "file_tools": "minions.tools._builtin",
    "http_get_tool": "minions.tools._builtin",
}

if TYPE_CHECKING:
    from minions.tools._builtin import builtin_tools, current_datetime, file_tools, http_get_tool
    from minions.tools._mcp import MCPHttpServer, MCPStdioServer

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "Approver",
    "MCPHttpServer",
    "MCPStdioServer",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "builtin_tools",
    "current_datetime",
    "file_tools",
    "http_get_tool",
    "tool",
    "tool_context",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
