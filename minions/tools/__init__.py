"""Tools: typed Python functions a model may call, their registry, and the built-in tools.

The built-in tools are what YAML recipes get by name: `current_datetime`, the workspace file
tools (`file_tools`: ``read_file``, ``write_file``, ``list_files``, confined to one directory)
and the opt-in `http_get_tool`. `MCPStdioServer` and `MCPHttpServer` configure MCP servers whose
tools a recipe's steps may call (``mcp_servers``; needs ``pip install 'minions[mcp]'``).
"""

from minions.tools._approval import ApprovalDecision, ApprovalRequest, Approver
from minions.tools._builtin import builtin_tools, current_datetime, file_tools, http_get_tool
from minions.tools._context import ToolContext, tool_context
from minions.tools._mcp import MCPHttpServer, MCPStdioServer
from minions.tools._tool import Tool, ToolRegistry, tool

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
