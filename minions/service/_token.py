"""The API's bearer token: ``MINIONS_API_TOKEN``, else one generated at the first start and kept
in a file beside the database that only its owner can read."""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from minions.errors import MinionsError

__all__ = ["TOKEN_ENV", "Token", "load_token"]

TOKEN_ENV = "MINIONS_API_TOKEN"


@dataclass(frozen=True, kw_only=True)
class Token:
    """The token and where it came from.

    Attributes:
        value: the token itself.
        file: the file it is kept in (None when it came from ``MINIONS_API_TOKEN``).
        new: generated just now (print it once).
    """

    value: str
    file: Path | None = None
    new: bool = False


def token_file(database_url: str) -> Path:
    """Beside a SQLite database (``api-token`` in its folder); for Postgres, which has no
    folder, ``.minions/api-token`` in the current directory."""
    if database_url.startswith("sqlite:///"):
        return Path(database_url.removeprefix("sqlite:///")).parent / "api-token"
    return Path(".minions") / "api-token"


def load_token(database_url: str) -> Token:
    """``MINIONS_API_TOKEN`` when set, else the token file's, else a new token written there
    with mode 0600.

    Raises:
        MinionsError: the token file can be read by others, or is empty.
    """
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        return Token(value=given)
    path = token_file(database_url)
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise MinionsError(
                f"the API token file {str(path)!r} can be read by others (mode {mode:o}); "
                f"make it owner-only: chmod 600 {path}"
            )
        value = path.read_text(encoding="utf-8").strip()
        if not value:
            raise MinionsError(f"the API token file {str(path)!r} is empty; delete it")
        return Token(value=value, file=path)
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(value + "\n")
    return Token(value=value, file=path, new=True)
