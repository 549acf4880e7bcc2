"""Whether to cancel a run: `minions runs cancel` asks the person at the terminal first (the
run, its recipe, status and age), and nobody else (a script or a pipe is never asked, so it
never waits)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from minions._fold import TERMINAL
from minions.cli._common import asker, local_time

if TYPE_CHECKING:
    from minions.runs import RunStore

__all__: list[str] = []


def confirmed(ctx: typer.Context, store: RunStore, run: str) -> bool:
    """Whether to go on and cancel `run`: yes when nobody can be asked (no terminal) or the
    run has ended (the store then says so), else the person's answer (``y`` or ``yes``).

    Raises:
        UnknownRunError: no run has this id.
    """
    # The command's `Settings` (`ctx.obj`), read by name: this module does not import the
    # app that imports it.
    ask = asker(getattr(ctx.obj, "ask", None))
    record = asyncio.run(store.get(run))
    if ask is None or record.status in TERMINAL:
        return True
    age = ""
    if record.started_at is not None:
        from minions.cli._progress import elapsed

        age = f", for {elapsed(time.time() - record.started_at)}"
    answer = ask(
        f"cancel run {record.run_id} ({record.recipe_id}, {record.status}{age}, created "
        f"{local_time(record.created_at)})? [y/N] "
    )
    if answer.strip().lower() in ("y", "yes"):
        return True
    Console(stderr=True, highlight=False).print(f"run {record.run_id}: not cancelled", markup=False)
    return False
