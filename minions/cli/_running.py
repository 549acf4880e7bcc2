"""`minions run`: load, check, choose the model, run with a live view, report.

Ctrl-C cancels the run the way any cancellation does (every running step is cancelled and the
run ends with `RunFailed`), then the command writes what it has: the events so far, the
recording so far, and a table of what finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import typer
from rich.console import Console

from minions._agent.executor import AgentExecutor
from minions._agent.graph import StepGraph
from minions._step.context import AgentContext
from minions._step.result import AgentResult
from minions._text import jsonable
from minions.cli._common import cli_actor, parse_inputs
from minions.cli._dry_run import DryRunServer, DryRunTool, make_dry_run
from minions.cli._errors import UsageError
from minions.cli._live import LiveView
from minions.cli._loop import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    event_loop,
)
from minions.cli._model_choice import (
    ModelSource,
    choose_model,
    model_source,
    needs_model,
)
from minions.cli._report import (
    dry_run_view,
    plural,
    printed_output,
    result_data,
    routing_notes,
    run_line,
    summarize,
    summarize_rows,
    summary_table,
)
from minions.errors import MCPServerError, ModelError
from minions.events import EventListener, event_to_json
from minions.models import Model, Recording
from minions.recipes import AgentRecipe, RecipeFile, load_recipe_file
from minions.tools import ApprovalDecision, ApprovalRequest, Approver, ToolRegistry
from minions.tools._internal import describe_server, list_mcp_tools

__all__ = []


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The options of `minions run` (see docs/cli.md)."""

    recipe: Path
    inputs: Sequence[str] = ()
    model: str | None = None
    dry_run: bool = False
    json: bool = False
    events: Path | None = None
    record: Path | None = None
    replay: Path | None = None
    quiet: bool = False
    preflight: bool = True
    workspace: Path | None = None
    approve_all: bool = False
    otel: bool = False
    limits: Path | None = None


class EventsFile:
    """An event listener writing each event as one JSON line, flushed as it happens.

    A write that fails (a full disk) is said once on `err`; the run and its output go on, and
    the file keeps the events written before.
    """

    def __init__(self, path: Path, err: Console) -> None:
        self.path = path
        self._err = err
        self.failed = False
        try:
            self._file: IO[str] = path.open("w", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write events to {str(path)!r}: {exc.strerror}") from None

    def __call__(self, event: Any) -> None:
        if self.failed:
            return
        try:
            self._file.write(event_to_json(event) + "\n")
            self._file.flush()
        except OSError as exc:
            self.failed = True
            self._err.print(
                f"warning: cannot write events to {str(self.path)!r} ({exc.strerror or exc}); "
                "the run goes on without them",
                markup=False,
                highlight=False,
                style="yellow",
            )

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass  # said already, or the last flush failed: the run's result matters more


def approvals_needed(recipe: AgentRecipe, tools: Any) -> list[tuple[str, str]]:
    """(step, tool) pairs whose calls need a person's approval."""
    found = []
    for step in recipe.steps:
        body = getattr(step, "body", step)  # a loop's body makes the calls
        every = bool(getattr(body, "requires_approval", False))
        for name in sorted(body.tool_names()):
            tool = tools.get(name) if tools is not None else None
            if every or (tool is not None and tool.requires_approval):
                found.append((step.id, name))
    return found


def terminal_approver(ask: Callable[[str], str], err: Console, view: LiveView) -> Approver:
    """Asks on the terminal, one call at a time (the live view pauses meanwhile)."""
    lock = asyncio.Lock()

    async def approve(request: ApprovalRequest) -> ApprovalDecision:
        async with lock:
            view.stop()
            try:
                arguments = json.dumps(request.arguments, ensure_ascii=False)
                err.print(
                    f"step {request.step_id!r} wants to call {request.tool}({arguments})",
                    markup=False,
                    highlight=False,
                )
                answer = await asyncio.to_thread(ask, "approve? [y/N] ")
                if answer.strip().lower() in ("y", "yes"):
                    return ApprovalDecision(approved=True, decided_by=cli_actor())
                reason = await asyncio.to_thread(ask, "why not (told to the model)? ")
                return ApprovalDecision(
                    approved=False, reason=reason.strip() or None, decided_by=cli_actor()
                )
            finally:
                view.start()

    return approve


async def _approve_everything(request: ApprovalRequest) -> ApprovalDecision:
    return ApprovalDecision(approved=True, reason="--approve-all", decided_by=cli_actor())


def run_in_foreground(
    options: RunOptions,
    *,
    resolve: Callable[[str], Model],
    err: Console,
    ask: Callable[[str], str] | None = None,
) -> int:
    """Do what `minions run` was asked, in this process (`minions submit` queues a run for a
    worker instead); return the exit code.

    The output (or with `json`, the JSON result and nothing else) goes to stdout; the live
    view, notes, the summary and errors go to `err`.

    `ask` prompts a person (on a terminal) for approvals; without it, a recipe whose tools
    need approval runs only with `approve_all`.

    Raises:
        UsageError: bad options (exit code 2).
        RecipeError: the recipe or the inputs are invalid (exit code 2).
    """
    if options.record is not None and not options.record.parent.is_dir():
        raise UsageError(f"cannot record to {str(options.record)!r}: no such directory")
    from minions.cli._limits import load_limits

    limits = load_limits(options.limits)
    given = parse_inputs(options.inputs)
    workspace = options.workspace
    if workspace is not None and workspace.exists() and not workspace.is_dir():
        raise UsageError(f"--workspace {str(options.workspace)!r} is not a folder")
    loaded = load_recipe_file(options.recipe, workspace=options.workspace)
    recipe = loaded.recipe
    if options.events is not None:
        _refuse_overwriting(options.events, loaded, options)
    inputs = recipe.check_inputs(given)
    needing = approvals_needed(recipe, ToolRegistry(recipe.tools))
    if needing and ask is None and not options.approve_all and not options.dry_run:
        step_id, tool_name = needing[0]
        raise UsageError(
            f"step {step_id!r} calls {tool_name!r}, which needs a person's approval, and "
            "nobody can be asked here (no terminal): run it on a terminal, or pass "
            "--approve-all to approve every call"
        )
    source = model_source(recipe, options.recipe, model=options.model, replay=options.replay)
    if options.dry_run:
        return _dry_run(recipe, inputs, source, as_json=options.json)
    meta = {"recipe": recipe.id, "inputs": jsonable(inputs)}
    choice = choose_model(source, recipe, record=options.record, resolve=resolve, meta=meta)
    if choice.note is not None and not options.quiet:
        err.print(choice.note, markup=False, highlight=False)
    recipe = choice.prepare(recipe)
    view = LiveView(
        err, [s.id for s in recipe.steps], title=recipe.id, mode="off" if options.quiet else None
    )
    approver: Approver | None = None
    if options.approve_all:
        approver = _approve_everything
    elif ask is not None:
        approver = terminal_approver(ask, err, view)
    tracer_provider = None
    if options.otel:
        from minions.cli._otel import otlp_tracer_provider

        tracer_provider = otlp_tracer_provider()
    executor = AgentExecutor(
        model_resolver=choice.resolver,
        model_wrapper=choice.wrapper,
        approver=approver,
        tracer_provider=tracer_provider,
        limits=limits,
    )
    graph = executor.graph(recipe)
    events = EventsFile(options.events, err) if options.events is not None else None
    listeners: list[EventListener] = [view] if events is None else [view, events]
    context = executor.create_context(recipe, inputs, listeners=listeners)
    if view.mode == "lines":
        # An implicit replay has said so already, in its one line.
        model = "" if choice.note is not None else f", model {choice.label}"
        err.print(f"run {recipe.id}: {plural(len(graph.steps), 'step')}{model}", markup=False)
    result: AgentResult | None = None
    started = time.monotonic()
    with event_loop(err) as loop:
        if options.preflight and choice.replay is None:
            problem = loop.run(_preflight(graph, context))
            if problem:
                err.print(f"error: {problem}", markup=False, highlight=False)
                return EXIT_FAILED
        try:
            view.start()
            # stdout is for the run's output: whatever tools print goes to stderr.
            with contextlib.redirect_stdout(sys.stderr):
                result = loop.run(executor.run(graph, context))
        finally:
            view.stop()
            if events is not None:
                events.close()
            if choice.recording is not None and options.record is not None:
                _save_recording(choice.recording, options.record, err, quiet=options.quiet)
            if tracer_provider is not None:
                tracer_provider.shutdown()  # sends the spans still in the batch
        if result is None:
            elapsed = time.monotonic() - started
            return _report_interrupted(
                view, options, err, elapsed, run_id=context.run_id, terminated=loop.terminated
            )
        if choice.replay is not None and choice.replay.changed_prompts and not options.quiet:
            changed = choice.replay.changed_prompts
            err.print(
                f"note: {plural(len(changed), 'prompt')} "
                f"{'differs' if len(changed) == 1 else 'differ'} from the recording "
                f"({', '.join(changed[:5])}"
                f"{', ...' if len(changed) > 5 else ''}): the recipe or the inputs changed since "
                "it was recorded",
                markup=False,
            )
        return _report(result, options, err)


async def _preflight(graph: StepGraph, context: AgentContext) -> str:
    """Check that the servers of the models the run will call answer, before any step runs
    (a tool step's side effects would otherwise happen before the first model step fails).
    Returns what is wrong, or ``""``."""
    steps = [step for step in graph.steps.values() if step.uses_model()]
    try:
        models = {id(m): m for m in (context.resolve_model(s.model) for s in steps)}
        for model in models.values():
            await model.check()
    except ModelError as exc:
        return str(exc)
    return ""


def _dry_run(
    recipe: AgentRecipe, inputs: dict[str, Any], source: ModelSource, *, as_json: bool
) -> int:
    """Print what a run would do (`--dry-run`): nothing is resolved, called or written."""
    model = source.label
    named = source.spec is not None or source.replay is not None or source.fallback is not None
    if not named and needs_model(recipe.steps):
        model = "none configured (a real run would stop here: give --model)"
    try:
        servers = _listed_mcp_servers(recipe)
    except MCPServerError as exc:
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"error: {exc}", markup=False)
        return EXIT_FAILED
    shown = make_dry_run(AgentExecutor().graph(recipe), inputs, model=model, mcp_servers=servers)
    if as_json:
        typer.echo(json.dumps(shown.to_data(), indent=2, ensure_ascii=False))
    else:
        Console(highlight=False, soft_wrap=True).print(dry_run_view(shown))
    return EXIT_OK


def _listed_mcp_servers(recipe: AgentRecipe) -> tuple[DryRunServer, ...]:
    """The recipe's MCP servers and their tools: each server is started (or connected to)
    to list them, and closed again; no tool is called."""
    if not recipe.mcp_servers:
        return ()
    listed = asyncio.run(list_mcp_tools(recipe.mcp_servers))
    return tuple(
        DryRunServer(
            name=name,
            server=describe_server(recipe.mcp_servers[name]),
            tools=tuple(
                DryRunTool(
                    name=t.name,
                    mcp_name=t.origin[1],
                    description=t.description,
                    input_schema=t.parameters,
                )
                for t in tools
            ),
        )
        for name, tools in listed.items()
    )


def _refuse_overwriting(events: Path, loaded: RecipeFile, options: RunOptions) -> None:
    """`--events` must not name a file the run reads or writes otherwise."""
    given = events.resolve()
    inputs = {"the recipe": loaded.path, "--replay": options.replay, "--record": options.record}
    for what, path in inputs.items():
        if path is not None and Path(path).resolve() == given:
            raise UsageError(f"--events {str(events)!r} is {what}: give another file")
    if given.suffix in {".yaml", ".yml", ".py"} and given.exists():
        raise UsageError(
            f"--events {str(events)!r} would overwrite a {given.suffix} file: event logs are "
            "JSON lines (.jsonl)"
        )


def _save_recording(recording: Recording, path: Path, err: Console, *, quiet: bool) -> None:
    try:
        recording.save(path)
    except OSError as exc:
        err.print(f"error: cannot save the recording to {str(path)!r}: {exc}", markup=False)
        return
    if not quiet:
        err.print(f"recorded {len(recording)} model replies to {path}", markup=False)


def _report(result: AgentResult, options: RunOptions, err: Console) -> int:
    if options.json:
        typer.echo(json.dumps(result_data(result), indent=2, ensure_ascii=False))
    elif result.output is not None:
        typer.echo(printed_output(result.output))
    if not options.quiet:
        summaries = summarize(result)
        status = result.status.value
        err.print(summary_table(summaries))
        err.print(run_line(summaries, status=status, duration=result.duration))
        for note in routing_notes(summaries):
            err.print(note, markup=False, highlight=False, style="yellow")
    if not result.ok:
        failed = result.failed
        if options.quiet or not failed:
            err.print(f"run failed: {result.error}", markup=False, style="red")
        else:
            # The live view showed each failure with its reason: say which, not it again.
            names = ", ".join(repr(step_id) for step_id in failed)
            plural = "s" if len(failed) > 1 else ""
            err.print(
                f"run failed: step{plural} {names} failed (the reason is above)",
                markup=False,
                style="red",
            )
        return EXIT_FAILED
    return EXIT_OK


def _report_interrupted(
    view: LiveView,
    options: RunOptions,
    err: Console,
    elapsed: float,
    *,
    run_id: str,
    terminated: bool = False,
) -> int:
    cause = "SIGTERM" if terminated else "Ctrl-C"
    summaries = [
        # A step cut short by the Ctrl-C failed "was cancelled": say so.
        dataclasses.replace(s, status="cancelled")
        if s.status == "failed" and s.error and "was cancelled" in s.error
        else s
        for s in summarize_rows(view.rows.values(), time.time())
    ]
    # Each step under what became of it: a step skipped (because one before it was
    # cancelled) never ran, and did not finish.
    ended = {
        status: [s.id for s in summaries if s.status == status]
        for status in ("completed", "failed", "cancelled", "skipped")
    }
    if options.json:
        data = {
            "run_id": run_id,
            "recipe_id": view.title,
            "status": "cancelled",
            "error": f"cancelled by {cause}",
            "steps": [
                {
                    "id": s.id,
                    "status": s.status,
                    "model_calls": s.model_calls,
                    "tool_calls": s.tool_calls,
                    "tokens": s.usage.total_tokens,
                }
                for s in summaries
            ],
        }
        typer.echo(json.dumps(data, indent=2))
    if not options.quiet:
        err.print(summary_table(summaries))
        err.print(run_line(summaries, status="cancelled", duration=elapsed))
    err.print(
        f"{'terminated' if terminated else 'interrupted'}: the run was cancelled. "
        f"Finished: {', '.join(ended['completed']) or 'nothing'}"
        + "".join(
            f"; {status}: {', '.join(ids)}"
            for status, ids in ended.items()
            if ids and status != "completed"
        ),
        markup=False,
        highlight=False,
        style="yellow",
    )
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
