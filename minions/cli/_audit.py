"""``minions audit``: the audit log of a run store (who changed what, when, from where)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.table import Table

from minions.cli._common import (
    DatabaseOption,
    JsonOption,
    SinceOption,
    local_time,
    open_store,
    project_name,
    since_time,
)
from minions.cli._errors import UsageError

__all__: list[str] = []

FAMILIES = "run, approval, schedule, eval, history, audit, endpoint, cache, key"
"""The families of `minions.runs.AUDIT_ACTIONS`, written out: the run store is not imported
for ``--help`` (a test keeps the two the same)."""


def audit(
    since: SinceOption = None,
    actor: Annotated[
        str | None,
        typer.Option("--actor", metavar="NAME", help="Only changes made by this actor."),
    ] = None,
    action: Annotated[
        str | None,
        typer.Option(
            "--action",
            metavar="ACTION",
            help=f"Only this action (run.cancel) or family of actions ({FAMILIES}).",
        ),
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            metavar="PROJECT",
            help="Only changes in this project (changes of the whole store, such as keys, "
            "prunes, endpoints and the cache, are in project default).",
            callback=project_name,
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, help="At most this many, newest first.")
    ] = 50,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Who changed what, when and from where: submits, decisions, cancels, resumes, reruns,
    schedules, evals, prunes, endpoints, the step cache and keys, newest first."""
    after = since_time(since)
    store = open_store(database_url)
    try:
        entries = asyncio.run(
            store.audit(since=after, actor=actor, action=action, project=project, limit=limit)
        )
    except ValueError as exc:
        raise UsageError(f"--action: {exc}") from None
    finally:
        store.close()
    if json_output:
        rows = [
            {
                "id": e.id,
                "at": e.at,
                "actor": e.actor,
                "address": e.address,
                "action": e.action,
                "target": e.target,
                "project": e.project,
                "detail": e.detail,
            }
            for e in entries
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not entries:
        typer.echo(
            "no changes recorded"
            + (" with these filters" if since or actor or action or project else "")
        )
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("when", "actor", "from", "action", "target", "project", "detail"):
        table.add_column(column, overflow="fold")
    for e in entries:
        table.add_row(
            local_time(e.at),
            e.actor or "?",
            e.address or "",
            e.action,
            e.target,
            e.project,
            _detail(e.detail),
        )
    from minions.cli._common import stdout

    stdout().print(table)


def _detail(detail: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in detail.items())
