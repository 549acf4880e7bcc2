"""`minions schedules ...`: recipes that run by themselves, at each slot of a cron expression
or an interval, fired by the workers of the store (see docs/schedules.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import typer
from rich.table import Table

from minions._text import jsonable
from minions.cli._common import (
    DatabaseOption,
    InputsOption,
    JsonOption,
    ProjectOption,
    cli_who,
    local_time,
    open_store,
    parse_inputs,
    plain,
    record_data,
    stdout,
)
from minions.cli._errors import UsageError

__all__: list[str] = []

NameArgument = Annotated[
    str, typer.Argument(metavar="NAME", help="The schedule's name.", show_default=False)
]


def _schedule_data(record: Any) -> dict[str, Any]:
    data: dict[str, Any] = jsonable(dataclasses.asdict(record))
    return data


def _print_schedule(record: Any, json_output: bool = False) -> None:
    if json_output:
        typer.echo(json.dumps(_schedule_data(record), indent=2, ensure_ascii=False))
        return
    out = stdout()
    state = "paused" if record.paused else f"next {local_time(record.next_at)}"
    out.print(
        f"schedule {record.name}: {record.recipe_id}, {record.timing}, catch-up "
        f"{record.catch_up}, overlap {record.overlap}; {state}",
        markup=False,
    )
    if record.last_slot is not None:
        out.print(
            f"last fired for {local_time(record.last_slot)}: run {record.last_run_id} "
            f"({record.fired} run(s) in all)",
            markup=False,
        )
    if record.late:
        out.print(f"late: {_late(record)}", markup=False)


def _late(record: Any) -> str:
    """Why the schedule is late, when, and how many of its slots were late or skipped."""
    why = {
        "late": "a slot fired over a minute after its time",
        "overlap": "slots skipped while a run of it was active",
        "catch-up": "slots missed while no worker ran, skipped by its catch-up policy",
        "backlog": "missed slots beyond the catch-up backlog skipped",
    }.get(record.late_reason or "", record.late_reason or "")
    return f"{why} ({local_time(record.late_at)}; {record.late_slots} slot(s) late in all)"


def add(
    recipe: Annotated[
        Path, typer.Argument(metavar="RECIPE", help="The recipe file (YAML).", show_default=False)
    ],
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            metavar="EXPR",
            help='A cron expression: "minute hour day month weekday", e.g. "0 7 * * 1-5".',
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            metavar="DURATION",
            help="Or an interval: 30s, 5m, 1h, 1d (slots are multiples of it since "
            "1970-01-01 UTC).",
            show_default=False,
        ),
    ] = None,
    inputs: InputsOption = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="NAME",
            help="The schedule's name (default: the recipe's id).",
            show_default=False,
        ),
    ] = None,
    timezone: Annotated[
        str | None,
        typer.Option(
            "--timezone",
            metavar="TZ",
            help="The cron expression's time zone, an IANA name (default: UTC).",
            show_default=False,
        ),
    ] = None,
    catch_up: Annotated[
        str | None,
        typer.Option(
            "--catch-up",
            metavar="none|one|all",
            help="Slots missed while no worker ran: skip them (none), fire the latest (one, "
            "the default) or fire each (all: the latest 100 at most, 10 a tick).",
            show_default=False,
        ),
    ] = None,
    overlap: Annotated[
        str | None,
        typer.Option(
            "--overlap",
            metavar="skip|buffer_one|allow",
            help="A slot due while a run of the schedule is still active: skip it (skip, "
            "the default), let one wait in the queue (buffer_one) or fire it (allow).",
            show_default=False,
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Replace the schedule of that name (its recipe snapshot and timing).",
        ),
    ] = False,
    project: ProjectOption = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Run a recipe at each slot of --cron or --every (without either: the recipe's own
    `schedule:`). The recipe is snapshotted now: after editing it, add it again with
    --replace."""
    if cron is not None and every is not None:
        raise UsageError("give either --cron or --every, not both")
    if catch_up is not None and catch_up not in ("none", "one", "all"):
        raise UsageError(f"--catch-up: {catch_up!r} is not one of none, one, all")
    if overlap is not None and overlap not in ("skip", "buffer_one", "allow"):
        raise UsageError(f"--overlap: {overlap!r} is not one of skip, buffer_one, allow")
    if not recipe.is_file():
        raise UsageError(f"no such recipe file: {str(recipe)!r}")
    policy = cast(Literal["none", "one", "all"] | None, catch_up)  # checked above
    overlapping = cast(Literal["skip", "buffer_one", "allow"] | None, overlap)
    store = open_store(database_url, create=True)
    try:
        record = asyncio.run(
            store.add_schedule(
                recipe,
                cron=cron,
                every=every,
                inputs=parse_inputs(inputs or ()),
                name=name,
                timezone=timezone,
                catch_up=policy,
                overlap=overlapping,
                replace=replace,
                actor=cli_who(),
                project=project or "default",
            )
        )
    finally:
        store.close()
    _print_schedule(record, json_output)


def list_schedules(json_output: JsonOption = False, database_url: DatabaseOption = None) -> None:
    """The schedules, with their next and last slots."""
    store = open_store(database_url)
    try:
        records = asyncio.run(store.schedules())
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps([_schedule_data(r) for r in records], indent=2))
        return
    if not records:
        stdout().print("no schedules", markup=False)
        return
    table = Table(show_edge=False, pad_edge=False)
    columns = ("schedule", "recipe", "when", "catch-up", "overlap", "next", "last", "runs", "late")
    for column in columns:
        table.add_column(column, justify="right" if column in ("runs", "late") else "left")
    for r in records:
        table.add_row(
            r.name,
            r.recipe_id,
            r.timing,
            r.catch_up,
            r.overlap,
            "paused" if r.paused else local_time(r.next_at),
            local_time(r.last_slot),
            str(r.fired),
            f"LATE ({r.late_reason}) {r.late_slots}" if r.late else str(r.late_slots),
        )
    stdout().print(table)


def show(
    name: NameArgument,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many runs.")] = 20,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """A schedule and its runs, newest first."""
    store = open_store(database_url)
    try:
        record = asyncio.run(store.schedule(name))
        runs = asyncio.run(store.list_runs(schedule=name, limit=limit))
    finally:
        store.close()
    if json_output:
        data = {**_schedule_data(record), "runs": [record_data(r) for r in runs]}
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _print_schedule(record)
    if not runs:
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("run", "status", "created", "error"):
        table.add_column(column)
    for r in runs:
        table.add_row(r.run_id, r.status, local_time(r.created_at), plain((r.error or "")[:60]))
    stdout().print(table)


def _change(name: str, database_url: str | None, json_output: bool, what: str) -> None:
    store = open_store(database_url)
    try:
        if what == "pause":
            record = asyncio.run(store.pause_schedule(name, actor=cli_who()))
        else:
            record = asyncio.run(store.resume_schedule(name, actor=cli_who()))
    finally:
        store.close()
    _print_schedule(record, json_output)


def pause(
    name: NameArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """Stop firing the schedule until it is resumed."""
    _change(name, database_url, json_output, "pause")


def resume(
    name: NameArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """Fire the schedule again, from its next slot (the slots of the pause do not fire)."""
    _change(name, database_url, json_output, "resume")


def remove(
    name: NameArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """Remove the schedule; the runs it fired stay."""
    store = open_store(database_url)
    try:
        asyncio.run(store.remove_schedule(name, actor=cli_who()))
    finally:
        store.close()
    typer.echo(json.dumps({"removed": name}) if json_output else f"schedule {name} removed")
