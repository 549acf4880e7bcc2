"""The `minions` command line: run, check and draw YAML recipes (see docs/cli.md).

typer and rich are imported only when the command runs, so `import minions` stays light.
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """The `minions` command (the ``[project.scripts]`` entry point)."""
    from minions.cli.app import app

    app(prog_name="minions")
