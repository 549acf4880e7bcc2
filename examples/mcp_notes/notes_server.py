"""A tiny MCP server: the Markdown notes of one folder, over stdio.

Its tools: ``list_notes`` and ``read_note``. The folder is ``NOTES_DIR`` (the recipe gives it:
a stdio server sees only the environment its recipe gives it). Started by
``examples/mcp_notes/notes.yaml``; to try it alone::

    python examples/mcp_notes/notes_server.py   # then speak MCP on stdin
"""

from __future__ import annotations

import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes", log_level="ERROR")


def folder() -> Path:
    return Path(os.environ.get("NOTES_DIR", "notes")).resolve()


@server.tool()
def list_notes() -> list[str]:
    """The names of the notes, e.g. "bees.md"."""
    return sorted(p.name for p in folder().glob("*.md"))


@server.tool()
def read_note(name: str) -> str:
    """The text of one note.

    Args:
        name: the note's name, as `list_notes` gives it.
    """
    path = (folder() / name).resolve()
    if path.parent != folder() or not path.is_file():
        raise ToolError(f"no note {name!r}; call list_notes for their names")
    return path.read_text(encoding="utf-8")


if __name__ == "__main__":
    server.run("stdio")
