"""`minions plan "REQUIREMENTS"`: a model writes a plan, it is checked, shown (a table and
its graph), saved as a YAML recipe to review and edit, and with ``--run`` run at once, ending
with the token report."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from minions._text import redact_url
from minions.cli._errors import UsageError
from minions.cli._live import LiveView
from minions.cli._progress import Ticker, elapsed
from minions.errors import MinionsError, PlanError, Problem
from minions.events import Event, PlanRevised, StepCompleted, StepFailed
from minions.models import MODEL_ENV, Model, infer_model

__all__: list[str] = []

NO_PLANNER = f"""\
no model is configured for the plan: a model writes it. Give one:
  --model openai:gpt-4o-mini         with OPENAI_API_KEY set
  --model ollama:llama3.2:3b         a local Ollama server (ollama pull llama3.2:3b)
or set {MODEL_ENV}."""


def plan_command(
    ctx: typer.Context,
    requirements: Annotated[
        str, typer.Argument(metavar="REQUIREMENTS", help="What to build or do.", show_default=False)
    ],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            metavar="MODEL",
            help=f"The planner's and the steps' model. Default: ${MODEL_ENV}.",
            show_default=False,
        ),
    ] = None,
    tools: Annotated[
        list[str] | None,
        typer.Option(
            "--tools",
            metavar="MODULE",
            help="Tools steps may call: 'package.module' (its @tool functions) or "
            "'package.module:function'; repeat for more. The file tools are always there.",
            show_default=False,
        ),
    ] = None,
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            metavar="DIR",
            help="The folder the plan works in (its files are listed for the planner). "
            "Default: the current directory.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="Write the plan as a YAML recipe to FILE, to review, edit and `minions run`.",
            show_default=False,
        ),
    ] = None,
    run: Annotated[bool, typer.Option("--run", help="Run the plan at once.")] = False,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the plan (with --run, the result) as JSON on stdout."),
    ] = False,
    max_replans: Annotated[
        int,
        typer.Option("--max-replans", min=0, help="With --run: how often to replan on failure."),
    ] = 2,
) -> None:
    """Turn requirements into a plan of steps, each run with only what it needs.

    Prints the plan as a table and its graph; -o saves it as a YAML recipe to review and edit
    (run it with `minions run FILE`); --run runs it now and ends with the token report.
    """
    from minions._agent.executor import AgentExecutor
    from minions._plan.generator import PlanGenerator

    if not requirements.strip():
        raise PlanError(
            [Problem(file="plan", message="the requirements are empty: say what to build or do")]
        )
    root = (workspace or Path.cwd()).resolve()
    if workspace is not None and not workspace.is_dir():
        what = "is not a folder" if workspace.exists() else "does not exist"
        raise UsageError(f"--workspace {str(workspace)!r} {what}")
    if output is not None and not output.parent.resolve().is_dir():
        raise UsageError(f"cannot write the plan to {str(output)!r}: no such directory")
    resolve = getattr(ctx.obj, "resolve_model", None) or infer_model
    spec = model or os.environ.get(MODEL_ENV)
    if not spec:
        raise UsageError(NO_PLANNER)
    chosen: Model = resolve(spec)
    objects = _imported_tools(tools or ())
    names: list[Any] = ["read_file", "write_file", "list_files", *objects]
    generator = PlanGenerator(chosen)
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    started = time.monotonic()
    label = redact_url(spec)

    def planning() -> str:
        return f"… planning with {label}: {elapsed(time.monotonic() - started)}"

    with Ticker(err, planning):
        made = asyncio.run(generator.generate(requirements, tools=names, workspace=root))
    if output is not None:
        where = os.path.relpath(root, output.parent.resolve())
        text = made.to_yaml(workspace=where, tools=objects, references=tools or ())
        output.write_text(text, encoding="utf-8")
    if not json_output:
        show = err if run else out
        show.print(plan_table(made))
        show.print(_mermaid(made, objects), markup=False)
        if output is not None:
            show.print(f"plan written to {output}: review it, then `minions run {output}`")
    elif not run:
        typer.echo(json.dumps(made.model_dump(mode="json"), indent=2))
    if not run:
        return
    executor = AgentExecutor(model=chosen)
    view = LiveView(err, [step.id for step in made.steps], title=made.id, mode="off")
    with Ticker(err, view.progress_line) as ticker:
        result = asyncio.run(
            generator.execute(
                made,
                executor=executor,
                requirements=requirements,
                workspace=root,
                tools=names,
                max_replans=max_replans,
                listeners=[view] if json_output else [view, _progress(err, ticker)],
            )
        )
    if json_output:
        typer.echo(json.dumps(result.to_data(), indent=2, default=str))
    else:
        out.print(token_table(result))
        status = "completed" if result.ok else f"failed: {result.error}"
        replans = f", {result.replans} replan(s)" if result.replans else ""
        err.print(f"plan {made.id}: {status}{replans}", markup=False)
    raise typer.Exit(0 if result.ok else 1)


def _progress(err: Console, ticker: Ticker) -> Callable[[Event], None]:
    """One line on stderr per step that ends, and per replan."""

    def show(event: Event) -> None:
        if isinstance(event, StepCompleted | StepFailed | PlanRevised):
            ticker.touch()
        if isinstance(event, StepCompleted):
            err.print(f"✓ {event.step_id}", markup=False)
        elif isinstance(event, StepFailed):
            err.print(f"✗ {event.step_id}: {event.error}", markup=False, style="red")
        elif isinstance(event, PlanRevised):
            err.print(
                f"replan {event.replan}: kept {', '.join(event.kept) or 'nothing'}; "
                f"to run: {', '.join(event.steps)}",
                markup=False,
                style="yellow",
            )

    return show


def plan_table(plan: Any) -> Table:
    """The steps of a plan: id, type, what it waits for, reads and produces, and its goal."""
    table = Table(title=f"plan {plan.id}: {plan.description}", show_edge=False, pad_edge=False)
    for name in ("step", "type", "depends on", "reads", "produces", "goal"):
        table.add_column(name, no_wrap=name == "step")  # ids whole
    for step in plan.steps:
        table.add_row(
            step.id,
            step.type,
            ", ".join(step.depends_on),
            ", ".join(step.inputs),
            ", ".join(step.artifacts),
            step.goal,
        )
    return table


def token_table(result: Any) -> Table:
    """The token report: the planner, each replan and each step, and where counts come from."""
    table = Table(
        title="tokens",
        caption=f"the same steps with full history: about {result.full_history_estimate()} "
        "prompt tokens (estimated)",
        show_edge=False,
        pad_edge=False,
        show_footer=True,
    )
    total = result.total()
    table.add_column("part", footer="total", no_wrap=True)
    table.add_column("status")
    table.add_column("prompt", justify="right", footer=str(total.prompt_tokens))
    table.add_column("completion", justify="right", footer=str(total.completion_tokens))
    table.add_column("calls", justify="right", footer=str(total.calls))
    table.add_column("counted", footer=total.source)
    for line in result.tokens:
        table.add_row(
            line.name,
            line.status,
            str(line.prompt_tokens),
            str(line.completion_tokens),
            str(line.calls),
            line.source,
        )
    return table


def _mermaid(plan: Any, tools: list[Any]) -> str:
    from minions._agent.graph import StepGraph

    return StepGraph(plan.to_recipe(tools=tools)).to_mermaid()


def _imported_tools(references: list[str] | tuple[str, ...]) -> list[Any]:
    from minions.recipes._internal import import_tools

    found: list[Any] = []
    for reference in references:
        try:
            found.extend(import_tools(reference, Path.cwd(), set()))
        except MinionsError as exc:
            raise UsageError(f"--tools {reference!r}: {exc}") from None
    return found
