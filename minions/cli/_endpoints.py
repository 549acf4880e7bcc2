"""`minions endpoints list|forget`: what model endpoints taught the structured-output ladder of
a store's workers and why, and the endpoints paused after a 429 (see docs/limits.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from minions.cli._common import (
    DatabaseOption,
    JsonOption,
    cli_who,
    local_time,
    open_store,
    stdout,
)
from minions.cli._errors import UsageError
from minions.cli._limits import LimitsOption, load_limits

if TYPE_CHECKING:
    from minions.runs import Lesson

__all__: list[str] = []


def list_endpoints(
    limits: LimitsOption = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The endpoints (base URL and model) the workers learned about: what each refused, why
    and since when (refused by the server, or ignored by several runs), the structured-output
    mode that worked, kept until it expires (`capability_expiry` of the limits, 7 days by
    default); and the limited endpoints paused now after a 429, with the run that set the
    pause."""
    given = load_limits(limits)
    store = open_store(database_url)
    try:
        expiry = None if given is None else given.capability_expiry
        found = asyncio.run(store.endpoints(expiry=expiry))
        paused = asyncio.run(store.pauses())
    finally:
        store.close()
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "endpoints": [
                        {
                            "base_url": e.base_url,
                            "model": e.model,
                            "rejected": list(e.rejected),
                            "output_mode": e.output_mode,
                            "learned_at": e.learned_at,
                            "expires_at": e.expires_at,
                            "lessons": [dataclasses.asdict(lesson) for lesson in e.lessons],
                        }
                        for e in found
                    ],
                    "pauses": [dataclasses.asdict(pause) for pause in paused],
                },
                indent=2,
            )
        )
        return
    if not found and not paused:
        Console(stderr=True).print("no endpoint taught anything yet, none is paused", markup=False)
        return
    if found:
        table = Table(show_edge=False, pad_edge=False)
        for name in ("endpoint", "output mode", "refused", "why", "learned", "expires"):
            table.add_column(name)
        for e in found:
            table.add_row(
                f"{e.base_url}#{e.model}",
                e.output_mode or "",
                ", ".join(e.rejected),
                "; ".join(_why(lesson) for lesson in e.lessons),
                local_time(e.learned_at),
                local_time(e.expires_at) if e.expires_at > time.time() else "expired",
            )
        stdout().print(table)
    if paused:
        table = Table(show_edge=False, pad_edge=False, title="paused after a 429")
        for name in ("endpoint", "until", "set by run", "at", "asked"):
            table.add_column(name)
        for p in paused:
            table.add_row(
                p.endpoint,
                local_time(p.until),
                p.paused_by or "",
                "" if p.paused_at is None else local_time(p.paused_at),
                "" if p.asked is None else f"{p.asked:g}s",
            )
        stdout().print(table)


def _why(lesson: Lesson) -> str:
    """A lesson's evidence, in a few words."""
    since = local_time(lesson.since)
    if lesson.cause == "refused":
        return f"{lesson.feature}: refused by the server since {since}"
    if lesson.cause == "ignored":
        runs = len(lesson.runs)
        return f"{lesson.feature}: ignored by {runs} run{'s' if runs != 1 else ''} since {since}"
    return f"{lesson.feature}: since {since}"


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
    """Forget what an endpoint taught, and lift its pause after a 429: the next run through
    it finds its structured-output mode again (after the server or its model changed), and
    its calls go at once. The audit log records who did."""
    url, hash_, model = endpoint.partition("#")
    named = model if hash_ and model else None
    if not url.strip().startswith(("http://", "https://")):
        raise UsageError(
            f"{endpoint!r} is not an endpoint: give a base URL (http://... or https://...), "
            "or URL#MODEL"
        )
    store = open_store(database_url)
    try:
        who = cli_who()
        count = asyncio.run(store.forget_endpoint(url, named, actor=who))
        lifted = asyncio.run(store.lift_pauses(url, named, actor=who))
    finally:
        store.close()
    said = f"forgot {count} endpoint{'s' if count != 1 else ''} at {url.strip().rstrip('/')}"
    said += f" (model {model})" if named else ""
    if lifted:
        said += f"; lifted {lifted} pause{'s' if lifted != 1 else ''}"
    Console(stderr=True, highlight=False).print(said, markup=False)
