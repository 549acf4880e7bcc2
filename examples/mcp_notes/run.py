"""A recipe whose tools come from an MCP server, offline.

Run it with ``python examples/mcp_notes/run.py``. The recipe (``notes.yaml``) starts its own
tiny MCP server (``notes_server.py``, over stdio) and offers its tools to the model as
``notes_list_notes`` and ``notes_read_note``. Offline, a stand-in model calls them; set
``MINIONS_MODEL`` (for example ``ollama:llama3.2:3b``) to use a real model. Needs
``pip install 'minions[mcp]'``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from minions import AgentExecutor, Prompt, load_recipe
from minions.events import Event, ToolCallCompleted, ToolCallFailed
from minions.testing import FunctionModel, Reply

HERE = Path(__file__).parent


def stand_in(prompt: Prompt) -> Reply:
    """What a model would do: list the notes, read each, then summarise what it read."""
    results = [m for m in prompt.messages if m.role == "tool"]
    if not results:
        return [("notes_list_notes", {})]
    if len(results) == 1:
        names = json.loads(results[0].content)
        return [("notes_read_note", {"name": name}) for name in names]
    first_lines = [r.content.splitlines()[2] for r in results[1:]]
    return " ".join(first_lines)


def show(event: Event) -> None:
    if isinstance(event, ToolCallCompleted):
        print(f"  {event.name} -> {event.content[:60]!r}")
    elif isinstance(event, ToolCallFailed):
        print(f"  {event.name} failed: {event.error}")


def main() -> int:
    # `command: python` in the recipe is looked up on PATH: make it this Python.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    recipe = load_recipe(HERE / "notes.yaml")
    model = os.environ.get("MINIONS_MODEL") or FunctionModel(stand_in)
    result = AgentExecutor(model=model).execute_sync(recipe, listeners=[show])
    if not result.ok:
        print(f"failed: {result.error}")
        return 1
    print(f"summary: {result.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
