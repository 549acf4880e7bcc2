"""Helpers of the CLI tests: small recipes, a stand-in model, and the command with it.

Run as a script, this file is the `minions` command whose model strings all resolve to the
stand-in model (for tests that need a real process, e.g. to send it SIGINT):

    python tests/cli_helpers.py run recipe.yaml --model test --record run.recording.json
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from minions._messages import Prompt
from minions.cli._app import Settings, app
from minions.models._base import Model
from minions.testing import FunctionModel

TOOLS = '''\
import asyncio

from minions import ToolError, tool


@tool
def double(n: int) -> int:
    """Double a number."""
    return n * 2


@tool
def shout(text: str) -> str:
    """Upper-case a text, saying so on stdout (a tool that prints)."""
    print("shouting!")
    return text.upper()


@tool
def broken(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"broken: {reason}")


@tool
def touch(path: str) -> str:
    """Create a file (to tell whether a tool ran)."""
    open(path, "w").close()
    return path


@tool
async def nap(seconds: float) -> str:
    """Sleep (a slow step)."""
    await asyncio.sleep(seconds)
    return "rested"
'''


def reply(prompt: Prompt) -> str:
    """The stand-in model's answer: the step and the first line of its task."""
    task = prompt.messages[-1].content.strip().splitlines()[0]
    return f"{prompt.step_id}: {task}"


def stand_in(spec: str) -> Model:
    """Every model string resolves to a model answering with `reply`."""
    return FunctionModel(reply, name=f"stand-in {spec}")


SETTINGS = Settings(resolve_model=stand_in)
"""Pass as ``obj=`` to run the command with the stand-in model."""


def write_recipe(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    """Write a recipe (and the tools module it may use) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


TOOL_ONLY = """\
id: numbers
description: Doubles a number twice, no model.
tools: [tools]
inputs:
  n: {type: integer, description: The number.}
steps:
  - id: once
    tool: double
    params: {n: "{{ inputs.n }}"}
  - id: twice
    depends_on: [once]
    tool: double
    params: {n: "{{ once.output }}"}
"""

AGENTS = """\
id: greetings
tools: [tools]
inputs:
  name: {type: string, default: Ada}
steps:
  - id: hello
    goal: Say hello to {{ inputs.name }}.
  - id: loud
    tool: shout
    params: {text: "{{ inputs.name }}"}
  - id: bye
    depends_on: [hello, loud]
    goal: Say goodbye to {{ inputs.name }}.
"""

FAILING = """\
id: failing
tools: [tools]
steps:
  - id: fine
    tool: current_datetime
  - id: oops
    depends_on: [fine]
    tool: broken
    params: {reason: on purpose}
"""

SIDE_EFFECT_THEN_MODEL = """\
id: kudos
tools: [tools]
inputs: {path: {type: string}}
steps:
  - id: give
    tool: touch
    params: {path: "{{ inputs.path }}"}
  - id: thank
    depends_on: [give]
    goal: Say thank you.
"""

SLOW = """\
id: slow
tools: [tools]
steps:
  - id: first
    goal: Get ready.
  - id: nap
    depends_on: [first]
    tool: nap
    params: {seconds: 60}
"""


if __name__ == "__main__":
    app(prog_name="minions", obj=SETTINGS)
