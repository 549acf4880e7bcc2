"""`minions schedules ...`: recipes that run by themselves, at each slot of a cron expression
or an interval, fired by the workers of the store (see docs/schedules.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import typer
from rich.table import Table

from minions._text import jsonable
from minions.cli._errors import UsageError
from minions.cli._running import InputsOption, parse_inputs
from minions.cli._runs import (
    DatabaseOption,
    JsonOption,
    _out,
    _record_data,
    _run,
    _store,
    _when,
)

__all__: list[str] = []

schedules_app = typer.Typer(
    name="schedules",
    help="Run recipes by themselves, on a cron expression or an interval: add, list, show, "
    "pause, resume and remove schedules. The workers of the store fire them.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

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
    out = _out()
    state = "paused" if record.paused else f"next {_when(record.next_at)}"
    out.print(
        f"schedule {record.name}: {record.recipe_id}, {record.timing}, catch-up "
        f"{record.catch_up}; {state}",
        markup=False,
    )
    if record.last_slot is not None:
        out.print(
            f"last fired for {_when(record.last_slot)}: run {record.last_run_id} "
            f"({record.fired} run(s) in all)",
            markup=False,
        )


@schedules_app.command("add")
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
            "the default) or fire each (all).",
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
    if not recipe.is_file():
        raise UsageError(f"no such recipe file: {str(recipe)!r}")
    policy = cast(Literal["none", "one", "all"] | None, catch_up)  # checked above
    store = _store(database_url, create=True)
    try:
        record = _run(
            store.add_schedule(
                recipe,
                cron=cron,
                every=every,
                inputs=parse_inputs(inputs or ()),
                name=name,
                timezone=timezone,
                catch_up=policy,
                replace=replace,
            )
        )
    finally:
        store.close()
    _print_schedule(record, json_output)


@schedules_app.command("list")
def list_schedules(json_output: JsonOption = False, database_url: DatabaseOption = None) -> None:
    """The schedules, with their next and last slots."""
    store = _store(database_url)
    try:
        records = _run(store.schedules())
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps([_schedule_data(r) for r in records], indent=2))
        return
    if not records:
        _out().print("no schedules", markup=False)
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("schedule", "recipe", "when", "catch-up", "next", "last", "runs"):
        table.add_column(column, justify="right" if column == "runs" else "left")
    for r in records:
        table.add_row(
            r.name,
            r.recipe_id,
            r.timing,
            r.catch_up,
            "paused" if r.paused else _when(r.next_at),
            _when(r.last_slot),
            str(r.fired),
        )
    _out().print(table)


@schedules_app.command("show")
def show(
    name: NameArgument,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many runs.")] = 20,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """A schedule and its runs, newest first."""
    store = _store(database_url)
    try:
        record = _run(store.schedule(name))
        runs = _run(store.list_runs(schedule=name, limit=limit))
    finally:
        store.close()
    if json_output:
        data = {**_schedule_data(record), "runs": [_record_data(r) for r in runs]}
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _print_schedule(record)
    if not runs:
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("run", "status", "created", "error"):
        table.add_column(column)
    for r in runs:
        table.add_row(r.run_id, r.status, _when(r.created_at), (r.error or "")[:60])
    _out().print(table)


def _change(name: str, database_url: str | None, json_output: bool, what: str) -> None:
    store = _store(database_url)
    try:
        if what == "pause":
            record = _run(store.pause_schedule(name))
        else:
            record = _run(store.resume_schedule(name))
    finally:
        store.close()
    _print_schedule(record, json_output)


@schedules_app.command("pause")
def pause(
    name: NameArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """Stop firing the schedule until it is resumed."""
    _change(name, database_url, json_output, "pause")


@schedules_app.command("resume")
def resume(
    name: NameArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """Fire the schedule again, from its next slot (the slots of the pause do not fire)."""
    _change(name, database_url, json_output, "resume")


@schedules_app.command("remove")
def remove(
    name: NameArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """Remove the schedule; the runs it fired stay."""
    store = _store(database_url)
    try:
        _run(store.remove_schedule(name))
    finally:
        store.close()
    typer.echo(json.dumps({"removed": name}) if json_output else f"schedule {name} removed")
