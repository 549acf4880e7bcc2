"""The `minions` command line: run, check and draw YAML recipes, plan, and operate durable
runs (a worker, the service, runs, schedules, endpoints); see docs/cli.md and docs/runs.md.

typer and rich are imported only when the command runs, so `import minions` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typer import Typer

    app: Typer
    """The typer application (``typer.testing.CliRunner().invoke(app, [...])`` in tests)."""

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    # The typer application loads on first use: `import minions.cli` stays light.
    if name == "app":
        from minions.cli._app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The `minions` command (the ``[project.scripts]`` entry point)."""
    import warnings

    from minions.cli._app import app
    from minions.errors import StreamingWarning

    # The command shows progress, not the models' text: whether they stream is its own call.
    warnings.filterwarnings("ignore", category=StreamingWarning)

    app(prog_name="minions")
