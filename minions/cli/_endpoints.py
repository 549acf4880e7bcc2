"""`minions endpoints list|forget`: what model endpoints taught the structured-output ladder of
a store's workers (see docs/limits.md)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from minions.cli._common import DatabaseOption, JsonOption, local_time, open_store, stdout
from minions.cli._limits import LimitsOption, load_limits

__all__: list[str] = []


def list_endpoints(
    limits: LimitsOption = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The endpoints (base URL and model) the workers learned about: what each refused and
    the structured-output mode that worked, kept until it expires (`capability_expiry` of
    the limits, 7 days by default)."""
    given = load_limits(limits)
    store = open_store(database_url)
    try:
        expiry = None if given is None else given.capability_expiry
        found = asyncio.run(store.endpoints(expiry=expiry))
    finally:
        store.close()
    if json_output:
        typer.echo(
            json.dumps(
                [
                    {
                        "base_url": e.base_url,
                        "model": e.model,
                        "rejected": list(e.rejected),
                        "output_mode": e.output_mode,
                        "learned_at": e.learned_at,
                        "expires_at": e.expires_at,
                    }
                    for e in found
                ],
                indent=2,
            )
        )
        return
    if not found:
        Console(stderr=True).print("no endpoint taught anything yet", markup=False)
        return
    table = Table(show_edge=False, pad_edge=False)
    for name in ("endpoint", "output mode", "refused", "learned", "expires"):
        table.add_column(name)
    for e in found:
        table.add_row(
            f"{e.base_url}#{e.model}",
            e.output_mode or "",
            ", ".join(e.rejected),
            local_time(e.learned_at),
            local_time(e.expires_at) if e.expires_at > time.time() else "expired",
        )
    stdout().print(table)


def forget(
    endpoint: Annotated[
        str,
        typer.Argument(
            metavar="URL",
            help="The base URL (every model it serves), or URL#MODEL.",
            show_default=False,
        ),
    ],
    database_url: DatabaseOption = None,
) -> None:
    """Forget what an endpoint taught: the next run through it finds its structured-output
    mode again (after the server or its model changed)."""
    url, hash_, model = endpoint.partition("#")
    store = open_store(database_url)
    try:
        count = asyncio.run(store.forget_endpoint(url, model if hash_ and model else None))
    finally:
        store.close()
    Console(stderr=True, highlight=False).print(
        f"forgot {count} endpoint{'s' if count != 1 else ''} at {url.rstrip('/')}"
        + (f" (model {model})" if hash_ and model else ""),
        markup=False,
    )
