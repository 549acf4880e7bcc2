"""`minions cache list|clear`: the step cache of a store (what steps that say ``cache`` keep,
shared by every worker; see docs/runs.md). An entry belongs to the run that made it and is
pruned with it; `clear` empties the cache (or one recipe's part) at once."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from minions.cli._common import (
    DatabaseOption,
    JsonOption,
    cli_who,
    local_time,
    open_store,
    plain,
    stdout,
)

__all__: list[str] = []

CACHE_HELP = "The step cache of the store: list its entries, clear them."

RecipeOption = Annotated[
    str | None,
    typer.Option(
        "--recipe", metavar="ID", help="Only the entries made by runs of this recipe.",
        show_default=False,
    ),
]  # fmt: skip


def list_entries(
    recipe: RecipeOption = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10_000, help="At most this many, newest first.")
    ] = 50,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The step cache's entries, newest first: the step, the recipe and run that made each
    (it is pruned with that run), when, and what each hit saves."""
    store = open_store(database_url)
    try:
        found = asyncio.run(store.cache_entries(recipe=recipe, limit=limit))
        total = asyncio.run(store.count_cache_entries(recipe=recipe))
    finally:
        store.close()
    if json_output:
        rows = [
            {
                "key": entry.key,
                "step_id": entry.step.step_id,
                "recipe_id": entry.step.recipe_id or None,
                "run_id": entry.step.run_id or None,
                "created_at": entry.step.created_at,
                "usage": dict(entry.step.usage),
            }
            for entry in found
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    said = Console(stderr=True, highlight=False)
    if not found:
        said.print("no cached step" + (f" of recipe {recipe}" if recipe else ""), markup=False)
        return
    table = Table(show_edge=False, pad_edge=False)
    for name in ("key", "step", "recipe", "run", "made", "tokens saved per hit"):
        table.add_column(name)
    for entry in found:
        e = entry.step
        table.add_row(
            entry.key[:12],
            plain(e.step_id),
            plain(e.recipe_id),
            e.run_id,
            local_time(e.created_at),
            str(sum(int(v) for k, v in e.usage.items() if k.endswith("_tokens"))),
        )
    stdout().print(table)
    if total > len(found):
        said.print(f"{len(found)} of {total} entries (--limit for more)", markup=False)


def clear(recipe: RecipeOption = None, database_url: DatabaseOption = None) -> None:
    """Delete the step cache's entries (those made by runs of `--recipe`): the next run of
    each cached step calls its model again. The audit log records who cleared it."""
    store = open_store(database_url)
    try:
        count = asyncio.run(store.clear_cache(recipe=recipe, actor=cli_who()))
    finally:
        store.close()
    Console(stderr=True, highlight=False).print(
        f"cleared {count} cached step{'s' if count != 1 else ''}"
        + (f" of recipe {recipe}" if recipe else ""),
        markup=False,
    )
