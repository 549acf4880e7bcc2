"""`minions keys ...`: named API keys with roles for `minions serve` (see docs/access.md).
They work on the run store directly, as its owner: whoever can open the store's database
manages its keys."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.table import Table

from minions.cli._common import DatabaseOption, JsonOption, cli_who, local_time, open_store
from minions.cli._errors import UsageError

__all__: list[str] = []

NameArgument = Annotated[
    str, typer.Argument(metavar="NAME", help="The key's name.", show_default=False)
]


def add(
    name: NameArgument,
    role: Annotated[
        str,
        typer.Option(
            "--role",
            metavar="ROLE",
            help="What the key may do: viewer (read), approver (+ decide approvals), operator "
            "(+ submit, cancel, resume, rerun, schedules), admin (+ keys, prune, settings).",
            show_default=False,
        ),
    ],
    projects: Annotated[
        list[str] | None,
        typer.Option(
            "--project",
            metavar="P",
            help="A project of the key (repeat for more; default: default). Stored and "
            "listed; runs are not kept apart by project yet.",
            show_default=False,
        ),
    ] = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Add a key and print it, once: only its hash is stored.

    Clients send it as `Authorization: Bearer KEY`; what they do is recorded under NAME.
    """
    store = open_store(database_url, create=True)
    try:
        try:
            made = asyncio.run(
                store.add_key(name, role=role, projects=projects or (), actor=cli_who())
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    finally:
        store.close()
    record, key = made.record, made.key
    if json_output:
        data = {"name": record.name, "key": key, "role": record.role}
        typer.echo(json.dumps({**data, "projects": list(record.projects)}))
        return
    typer.echo(key)
    typer.echo(
        f"key {record.name} ({record.role}; projects: {', '.join(record.projects)}) added: "
        "it is shown this once, keep it now",
        err=True,
    )


def list_keys(
    revoked: Annotated[bool, typer.Option("--revoked", help="Also list revoked keys.")] = False,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The keys: name, role, projects, when and by whom added (never the keys)."""
    store = open_store(database_url)
    try:
        records = asyncio.run(store.keys(revoked=revoked))
    finally:
        store.close()
    if json_output:
        rows = [
            {
                "name": r.name,
                "role": r.role,
                "projects": list(r.projects),
                "created_at": r.created_at,
                "created_by": r.created_by,
                "revoked_at": r.revoked_at,
                "revoked_by": r.revoked_by,
            }
            for r in records
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not records:
        typer.echo("no keys (`minions keys add NAME --role ROLE` adds one)")
        return
    table = Table(show_edge=False, pad_edge=False)
    columns = ["name", "role", "projects", "added", "by"] + (["revoked"] if revoked else [])
    for column in columns:
        table.add_column(column)
    for r in records:
        row = [r.name, r.role, ",".join(r.projects), local_time(r.created_at), r.created_by or ""]
        table.add_row(*row, *([local_time(r.revoked_at)] if revoked else []))
    from minions.cli._common import stdout

    stdout().print(table)


def revoke(
    name: NameArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """Revoke a key: its next request fails, and so do the event streams it opened."""
    store = open_store(database_url)
    try:
        record = asyncio.run(store.revoke_key(name, actor=cli_who()))
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps({"revoked": record.name, "revoked_at": record.revoked_at}))
        return
    typer.echo(f"key {record.name} revoked")
