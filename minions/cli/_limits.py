"""`--limits FILE` of `minions run`, `worker` and `serve`: limits per model endpoint (see
docs/limits.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from minions.models import Limits

__all__: list[str] = []

LimitsOption = Annotated[
    Path | None,
    typer.Option(
        "--limits",
        metavar="FILE",
        help="Limits per model endpoint (YAML: endpoints with match, max_concurrent, "
        "requests_per_minute, tokens_per_minute); see docs/limits.md.",
        show_default=False,
    ),
]


def load_limits(path: Path | None) -> Limits | None:
    """The limits of `--limits FILE`, when given.

    Raises:
        ConfigError: the file cannot be read or is not valid limits.
    """
    if path is None:
        return None
    from minions.models import Limits

    return Limits.load(path)
