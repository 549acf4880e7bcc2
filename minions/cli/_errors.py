"""The error every command raises for a usage mistake: `_app` prints it and exits with code 2."""

from __future__ import annotations

from minions.errors import MinionsError

__all__: list[str] = []


class UsageError(MinionsError):
    """The command cannot run as asked (exit code 2); the message says why."""
