"""The `durable` extra, checked before anything of `minions.runs` imports it: the step loop
alone needs none of it, and a missing package is named with the extra to install. Found, not
imported: DBOS is heavy to import, and only what needs it imports it."""

from __future__ import annotations

import importlib.util

from minions.errors import MissingExtraError

__all__: list[str] = []

DURABLE = ("dbos", "sqlalchemy", "psycopg")
"""The packages of the `durable` extra."""

_missing = [name for name in DURABLE if importlib.util.find_spec(name) is None]
if _missing:
    raise MissingExtraError(
        f"durable runs need the `durable` extra ({', '.join(_missing)} not installed): "
        "pip install 'minions[durable]'"
    )
