"""The fleet from a terminal: `minions workers`, `minions endpoints status`, `minions queue`
and `minions usage`, each a table for people and ``--json`` for scripts."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from minions._text import jsonable
from minions.cli._common import (
    DatabaseOption,
    JsonOption,
    local_time,
    open_store,
    plain,
    project_name,
    since_time,
    stdout,
)
from minions.cli._errors import UsageError
from minions.cli._limits import LimitsOption, load_limits
from minions.cli._progress import elapsed

__all__: list[str] = []

T = TypeVar("T")


def _read(database_url: str | None, read: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
    store = open_store(database_url)
    try:
        return asyncio.run(read(store))
    finally:
        store.close()


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(jsonable(data), indent=2))


def _table(*columns: str) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in _NUMBERS else "left")
    return table


_NUMBERS = {
    "places",
    "in flight",
    "waiting",
    "requests/min",
    "tokens/min",
    "queued",
    "prompt",
    "answer",
    "calls",
    "cost ($)",
    "unpriced",
}


def workers(
    all_workers: Annotated[
        bool,
        typer.Option("--all", help="Also the workers that stopped (kept a day, as dead ones)."),
    ] = False,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The store's workers: alive or dead, places used of their own concurrency, the runs
    each holds now, version and last heartbeat. A dead worker (killed, frozen, cut off) is
    kept a day after its last heartbeat (MINIONS_WORKER_EXPIRY), and lists no run another
    worker took over."""
    found = _read(database_url, lambda store: store.workers())
    now = time.time()
    shown = [w for w in found if all_workers or w.stopped_at is None]
    if json_output:
        _print_json(
            [
                {
                    "executor_id": w.executor_id,
                    "state": _state(w),
                    "alive": w.alive,
                    "places": w.places,
                    "places_used": len(w.runs),
                    "runs": w.runs,
                    "version": w.version,
                    "host": w.host,
                    "pid": w.pid,
                    "started_at": w.started_at,
                    "heartbeat_at": w.heartbeat_at,
                    "stopped_at": w.stopped_at,
                }
                for w in shown
            ]
        )
        return
    if not shown:
        typer.echo("no worker has run on this store" if not found else "no worker runs now")
        return
    table = _table("worker", "state", "places", "runs", "version", "host", "last heartbeat")
    for w in shown:
        table.add_row(
            plain(w.executor_id),
            _state(w),
            f"{len(w.runs)}/{w.places if w.places is not None else '?'}",
            plain(", ".join(w.runs)),
            plain(w.version),
            plain(f"{w.host or '?'}:{w.pid or '?'}"),
            f"{elapsed(max(0.0, now - w.heartbeat_at))} ago",
        )
    stdout().print(table)


def _state(worker: Any) -> str:
    if worker.stopped_at is not None:
        return "stopped"
    return "alive" if worker.alive else "dead"


def endpoints_status(
    limits: LimitsOption = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The model endpoints now: each limited one's calls in flight, workers waiting for a
    place, requests and tokens in the last minute and a 429's pause, over every worker;
    and the structured-output mode each model taught."""
    given = load_limits(limits)
    expiry = None if given is None else given.capability_expiry
    found = _read(database_url, lambda store: store.endpoint_status(expiry=expiry))
    now = time.time()
    if json_output:
        _print_json(found)
        return
    if not found:
        typer.echo("no limited endpoint, and no endpoint taught anything yet")
        return
    table = _table(
        "endpoint",
        "in flight",
        "waiting",
        "requests/min",
        "tokens/min",
        "paused",
        "output mode",
    )
    for e in found:
        load = e.load
        modes = ", ".join(f"{r.model}: {r.output_mode or '?'}" for r in e.learned)
        if load is None:
            table.add_row(plain(e.endpoint), "", "", "", "", "", plain(modes))
            continue
        paused = load.paused_until - now
        table.add_row(
            plain(e.endpoint),
            str(load.in_flight),
            str(load.waiting),
            str(load.requests),
            str(load.tokens),
            f"{elapsed(paused)} more" if paused > 0 else "",
            plain(modes),
        )
    stdout().print(table)


def queue(
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=500, help="The oldest queued runs listed.")
    ] = 10,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The backlog: runs queued (how many, the oldest's age, per recipe, the oldest
    ones), running, and waiting for a person's approval."""
    state = _read(database_url, lambda store: store.queue(limit=limit))
    if json_output:
        data = jsonable(state)
        data["oldest_queued_seconds"] = state.oldest_queued_age
        data["by_recipe"] = [
            {"recipe": r.recipe_id, "queued": r.queued, "oldest_queued_at": r.oldest_queued_at}
            for r in state.by_recipe
        ]
        _print_json(data)
        return
    console = stdout()
    oldest = f", the oldest for {elapsed(state.oldest_queued_age)}" if state.queued else ""
    console.print(
        f"{state.queued} queued{oldest}; {state.running} running; "
        f"{state.waiting} waiting for approval",
        markup=False,
    )
    if not state.queued:
        return
    table = _table("recipe", "queued", "oldest")
    for r in state.by_recipe:
        table.add_row(
            plain(r.recipe_id), str(r.queued), f"{elapsed(state.at - r.oldest_queued_at)} ago"
        )
    console.print(table)
    runs = _table("run", "recipe", "schedule", "queued at")
    for r in state.oldest:
        runs.add_row(
            plain(r.run_id), plain(r.recipe_id), plain(r.schedule or ""), local_time(r.created_at)
        )
    console.print(runs)


def usage(
    since: Annotated[
        str,
        typer.Option(
            "--since",
            metavar="AGE|TIME",
            help="From the last AGE (24h, 7d, 2w) or since TIME (local time: 2026-11-28 or "
            "2026-11-28T06:00).",
        ),
    ] = "7d",
    group_by: Annotated[
        str,
        typer.Option(
            "--by",
            "--group-by",
            metavar="GROUPS",
            help="Comma-separated, in order: day (UTC), recipe, schedule, model, project; "
            "`total` for the total only.",
        ),
    ] = "day",
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            metavar="PROJECT",
            help="Only the runs of this project (default: every project).",
            callback=project_name,
            show_default=False,
        ),
    ] = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Tokens and cost of the model calls since a moment, by day, recipe, schedule, model
    or project (runs still going count as far as they went). Cost comes from the
    genai-prices table; a model or endpoint it does not know (a server of your own) is
    counted as unpriced, never as $0."""
    start = since_time(since)
    assert start is not None
    groups = [] if group_by.strip() == "total" else [g.strip() for g in group_by.split(",")]
    groups = [g for g in groups if g]
    projects = None if project is None else [project]

    async def read(store: Any) -> Any:
        try:
            return await store.usage(since=start, group_by=groups, projects=projects)
        except ValueError as exc:
            raise UsageError(f"--by {group_by!r}: {exc}") from None

    report = _read(database_url, read)
    if json_output:
        data = jsonable(report)
        for row in (*data["rows"], data["total"]):
            row["total_tokens"] = row["prompt_tokens"] + row["completion_tokens"]
        _print_json(data)
        return
    table = _table(*report.group_by, "prompt", "answer", "calls", "cost ($)", "unpriced")

    def add(row: Any, *keys: str) -> None:
        unknown = f" ({row.unknown_calls} unreported)" if row.unknown_calls else ""
        table.add_row(
            *(plain(k) for k in keys),
            f"{row.prompt_tokens:,}",
            f"{row.completion_tokens:,}",
            f"{row.calls:,}{unknown}",
            "unknown" if row.cost is None else f"{row.cost:,.4f}",
            str(row.unpriced_calls) if row.unpriced_calls else "",
        )

    for row in report.rows:
        add(
            row,
            *(
                getattr(row, g) or ("(by hand)" if g == "schedule" else "?")
                for g in report.group_by
            ),
        )
    if report.group_by:
        table.add_section()
    add(report.total, *(["total"] + [""] * (len(report.group_by) - 1) if report.group_by else []))
    console = stdout()
    console.print(table)
    console.print(f"since {local_time(start)}; prices: {report.prices}", markup=False, style="dim")
