"""`minions runs prune`: delete old finished runs with everything stored of them (see
docs/runs.md, Retention)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Annotated

import typer

from minions._fold import RUN_STATUSES, TERMINAL
from minions.cli._common import (
    DatabaseOption,
    JsonOption,
    cli_who,
    local_time,
    one_of,
    open_store,
    stdout,
)
from minions.cli._errors import UsageError

__all__: list[str] = []

ENDED = [s for s in RUN_STATUSES if s in TERMINAL]
"""The statuses of the runs a prune may delete, in the order runs reach them."""


def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Delete the runs that finished longer ago than this: 90s, 12h, 30d, 2w.",
            show_default=False,
        ),
    ],
    statuses: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help=f"Only runs in this status: {one_of(ENDED)} (repeat for more; default: all "
            "three).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say how many runs would go; delete nothing.")
    ] = False,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Delete finished runs with their steps, events, approvals and DBOS workflows, in
    batches (workers go on meanwhile); an SQLite file then shrinks. Queued, running and
    waiting runs are never touched."""
    from minions._duration import duration_seconds

    try:
        duration_seconds(older_than)
    except ValueError as exc:
        raise UsageError(f"--older-than: {exc}") from None
    store = open_store(database_url)
    try:
        result = asyncio.run(
            store.prune(older_than, statuses=statuses or (), dry_run=dry_run, actor=cli_who())
        )
    except ValueError as exc:
        raise UsageError(f"--status: {exc}") from None
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps(dataclasses.asdict(result), indent=2))
        return
    verb = "would delete" if result.dry_run else "deleted"
    pruned = ", ".join(result.statuses)
    line = f"{verb} {result.runs} run(s) ({pruned}) finished before {local_time(result.before)}"
    if result.evals:
        line += f" and {result.evals} kept eval(s)"
    if not result.dry_run and result.bytes_before is not None and result.bytes_after is not None:
        line += f"; the database went from {_mb(result.bytes_before)} to {_mb(result.bytes_after)}"
    stdout().print(line, markup=False)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
