"""`minions runs rerun` and `minions runs diff`: a new run from a step of an ended one, reusing
what does not depend on that step, and two runs compared step by step (see docs/runs.md,
"Rerun from a step")."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from minions._text import jsonable
from minions.cli._common import (
    DatabaseOption,
    InputsOption,
    JsonOption,
    RunArgument,
    cli_who,
    open_store,
    parse_inputs,
    plain,
    stdout,
)
from minions.cli._errors import UsageError
from minions.errors import DiffTooLargeError

if TYPE_CHECKING:
    from minions.runs import RerunPlan

__all__: list[str] = []


def rerun(
    run: RunArgument,
    from_step: Annotated[
        str,
        typer.Option(
            "--from", metavar="STEP", help="The step to run again (with what follows it)."
        ),
    ],
    inputs: InputsOption = None,
    outputs: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="STEP=JSON",
            help="Replace a reused step's output (checked against its output schema); what "
            "follows it runs again. Repeat for more.",
            show_default=False,
        ),
    ] = None,
    recipe: Annotated[
        Path | None,
        typer.Option(
            "--recipe",
            metavar="FILE",
            help="A new version of the recipe (steps whose definition changed run again).",
            show_default=False,
        ),
    ] = None,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache",
            help="Let the steps that run again answer from the step cache (by default none "
            "does: each runs, and refreshes its entry).",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Plan the rerun, checked as the rerun is, and queue nothing: print what it "
            "would reuse and run again, and why.",
        ),
    ] = False,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Queue a new run of an ended run from step STEP: the steps that do not depend on it are
    reused as recorded (no model or tool calls); print the new run's id (with --dry-run, the
    plan alone: nothing is queued)."""
    given = parse_inputs(inputs or ())
    edited = _parse_outputs(outputs or ())
    if recipe is not None and not recipe.is_file():
        raise UsageError(f"no such recipe file: {str(recipe)!r}")
    store = open_store(database_url)

    async def planned() -> RerunPlan:
        return await store.rerun(
            run,
            from_step=from_step,
            inputs=given,
            outputs=edited,
            recipe=recipe,
            cache=cache,
            actor=cli_who(),
            dry_run=dry_run,
        )

    try:
        plan = asyncio.run(planned())
    finally:
        store.close()
    if dry_run:
        _preview(plan, json_output=json_output)
        return
    if json_output:
        typer.echo(json.dumps(jsonable(dataclasses.asdict(plan)), ensure_ascii=False))
        return
    typer.echo(plan.run_id)
    said = Console(stderr=True, highlight=False, soft_wrap=True)
    for line in _plan_lines(plan):
        said.print(line, markup=False)


def _plan_lines(plan: RerunPlan) -> list[str]:
    """What a rerun reuses and runs again, and why a step runs again for a reason of its
    own."""
    lines = [
        f"reuses {', '.join(plan.reused) or 'no step'}; runs {', '.join(plan.rerun)}"
        + (" (answered from the step cache where it can)" if plan.cache else "")
    ]
    for step, why in plan.changed.items():
        reason = "its inputs changed" if why == "inputs" else "its definition changed"
        lines.append(f"step {step} runs again: {reason}")
    return lines


def _preview(plan: RerunPlan, *, json_output: bool) -> None:
    """A dry run's plan, as ``POST /runs/{id}/rerun/preview`` answers it."""
    editable = list(plan.editable)
    if json_output:
        data = {
            "parent_run_id": plan.parent_run_id,
            "from_step": plan.from_step,
            "reused": list(plan.reused),
            "rerun": list(plan.rerun),
            "changed": dict(plan.changed),
            "cache": plan.cache,
            "editable": editable,
        }
        typer.echo(json.dumps(data, ensure_ascii=False))
        return
    out = stdout()
    out.print(
        f"a rerun of {plan.parent_run_id} from {plan.from_step} (dry run: nothing queued)",
        markup=False,
    )
    for line in _plan_lines(plan):
        out.print(line, markup=False)
    if editable:
        out.print(f"--set may replace the output of {', '.join(editable)}", markup=False)


def _parse_outputs(pairs: Sequence[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        step, sep, text = pair.partition("=")
        if not sep or not step:
            raise UsageError(f"--set {pair!r}: expected STEP=JSON")
        try:
            found[step] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--set {step}=...: the value is not JSON ({exc.msg}); quote a string as "
                f"'{step}=\"text\"'"
            ) from None
    return found


def diff(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", show_default=False)],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", show_default=False)],
    json_output: JsonOption = False,
    max_values: Annotated[
        int | None,
        typer.Option(
            "--max-values",
            min=1,
            metavar="N",
            help="The most JSON values of step outputs (both runs together) to compare "
            "[default: 500,000].",
            show_default=False,
        ),
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Compare two runs step by step (status, output, tokens, calls, duration) and name the
    first step where they diverge."""
    store = open_store(database_url)
    try:
        result = asyncio.run(store.diff(run_a, run_b, max_values=max_values))
    except DiffTooLargeError as exc:
        raise UsageError(f"{exc}; compare more with --max-values N") from None
    finally:
        store.close()
    if json_output:
        data = jsonable(dataclasses.asdict(result))
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    out = stdout()
    out.print(
        f"{result.run_a} ({result.status[0]}) vs {result.run_b} ({result.status[1]})",
        markup=False,
    )
    table = Table(show_edge=False, pad_edge=False)
    for name in ("", "step", "status", "tokens", "calls", "time", "output"):
        table.add_column(name)
    for s in result.steps:
        table.add_row(
            "≠" if s.diverges else "",
            s.key,
            " / ".join(x or "-" for x in s.status),
            f"{s.tokens[0]} / {s.tokens[1]}",
            f"{s.calls[0]} / {s.calls[1]}",
            " / ".join("-" if d is None else f"{d:.2f}s" for d in s.duration),
            plain(
                "; ".join(
                    f"{c.path}: {json.dumps(c.a, ensure_ascii=False)[:30]} -> "
                    f"{json.dumps(c.b, ensure_ascii=False)[:30]}"
                    for c in s.changes[:3]
                )
            ),
        )
    out.print(table)
    out.print(
        f"first divergence: {result.first_divergence}"
        if result.first_divergence
        else "no divergence: every step has the same outcome and output",
        markup=False,
    )
