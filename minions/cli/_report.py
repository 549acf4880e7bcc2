"""What `minions run` prints after a run: the output, a summary table, the result as JSON,
and what `--dry-run` shows."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minions._fold import IN_FLIGHT
from minions._messages import Usage
from minions._step.execution import StepExecution
from minions._step.result import AgentResult
from minions._text import as_text, jsonable, token_count
from minions.cli._dry_run import DryRun, RenderedField
from minions.cli._live import StepRow

__all__ = []


def plural(count: int, word: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _usage(usage: Usage) -> dict[str, int]:
    return {**dataclasses.asdict(usage), "total_tokens": usage.total_tokens}


def _duration(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


def _execution(execution: StepExecution) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": execution.step_id,
        "visit": execution.visit,
        "status": execution.status.value,
        "error": execution.error,
        "output": jsonable(execution.output),
        "usage": _usage(execution.usage),
        "model_calls": len(execution.model_calls),
        "tool_calls": len(execution.tool_calls),
        "retries": execution.retries,
        "duration": _duration(execution.duration),
    }
    if execution.items:
        data["items"] = [_execution(item) for item in execution.items]
    return data


def result_data(result: AgentResult) -> dict[str, Any]:
    """An `AgentResult` as JSON-ready data (what `--json` prints)."""
    return {
        "run_id": result.run_id,
        "recipe_id": result.recipe_id,
        "status": result.status.value,
        "output": jsonable(result.output),
        "error": result.error,
        "usage": _usage(result.usage),
        "duration": _duration(result.duration),
        "inputs": jsonable(dict(result.inputs)),
        "steps": [_execution(e) for e in result.executions],
    }


def printed_output(output: Any) -> str:
    """A run's output as printed: text as it is, anything else as indented JSON."""
    return as_text(output, indent=2)


# -- the summary table -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepSummary:
    """One line of the summary table: a step over all its visits."""

    id: str
    status: str
    visits: int = 1
    items: int = 0
    duration: float | None = None
    model_calls: int = 0
    tool_calls: int = 0
    retries: int = 0
    usage: Usage = field(default_factory=Usage)
    error: str | None = None


def summarize(result: AgentResult) -> list[StepSummary]:
    """One `StepSummary` per step that ran or was skipped, in the order they first ended."""
    visits: dict[str, list[StepExecution]] = {}
    for execution in result.executions:
        visits.setdefault(execution.step_id, []).append(execution)
    return [
        StepSummary(
            id=step_id,
            status=runs[-1].status.value,
            visits=len(runs),
            items=sum(len(e.items) for e in runs),
            duration=sum(e.duration or 0.0 for e in runs) if runs[-1].started_at else None,
            model_calls=sum(len(e.model_calls) for e in runs),
            tool_calls=sum(len(e.tool_calls) for e in runs),
            retries=sum(e.retries for e in runs),
            usage=sum((e.usage for e in runs), Usage()),
            error=runs[-1].error,
        )
        for step_id, runs in visits.items()
    ]


def summarize_rows(rows: Iterable[StepRow], now: float) -> list[StepSummary]:
    """Summaries from what the live view saw (a run cut short has no `AgentResult`)."""
    return [
        StepSummary(
            id=row.id,
            status="cancelled" if row.status in IN_FLIGHT else row.status,
            items=row.items_started,
            duration=row.elapsed(now),
            model_calls=row.model_calls,
            tool_calls=row.tool_calls,
            retries=row.retries,
            usage=Usage(
                prompt_tokens=row.prompt_tokens,
                completion_tokens=row.completion_tokens,
                calls=row.model_calls,
                unknown_calls=1 if row.unknown_usage else 0,
            ),
            error=row.note or None,
        )
        for row in rows
    ]


_STATUS_STYLE = {
    "completed": "green",
    "failed": "bold red",
    "skipped": "yellow",
    "cancelled": "yellow",
    "pending": "dim",
}


def _tokens(usage: Usage) -> str:
    if not usage.calls:
        return ""
    return token_count(usage.total_tokens, unreported=usage.unknown_calls > 0)


def summary_table(steps: Iterable[StepSummary]) -> Table:
    """Steps with their status, time, model calls, tool calls and tokens (loop items and
    retries when there are any), and a total line."""
    table = Table(show_edge=False, pad_edge=False, show_footer=True)
    steps = list(steps)
    total = sum((s.usage for s in steps), Usage())
    items = any(s.items for s in steps)
    retries = any(s.retries for s in steps)
    table.add_column("step", footer="total", no_wrap=True)
    table.add_column("status")
    if items:
        table.add_column("items", justify="right", footer=str(sum(s.items for s in steps)))
    table.add_column("time", justify="right")
    table.add_column("model calls", justify="right", footer=str(sum(s.model_calls for s in steps)))
    table.add_column("tool calls", justify="right", footer=str(sum(s.tool_calls for s in steps)))
    if retries:
        table.add_column("retries", justify="right", footer=str(sum(s.retries for s in steps)))
    table.add_column("tokens", justify="right", footer=_tokens(total) or "0")
    for step in steps:
        status = step.status + (f" x{step.visits}" if step.visits > 1 else "")
        cells: list[RenderableType] = [
            step.id,
            Text(status, style=_STATUS_STYLE.get(step.status, "")),
        ]
        if items:
            cells.append(str(step.items or ""))
        cells += [
            f"{step.duration:.2f}s" if step.duration is not None else "",
            str(step.model_calls or ""),
            str(step.tool_calls or ""),
        ]
        if retries:
            cells.append(str(step.retries or ""))
        cells.append(_tokens(step.usage))
        table.add_row(*cells)
    return table


# -- the dry run -------------------------------------------------------------------------------


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(jsonable(value), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _field_line(field: RenderedField) -> Text:
    line = Text(f"{field.name}: ", style="dim")
    if field.rendered:
        line.append(_short(field.value))
        return line
    line.append(_short(field.template), style="cyan")
    waits = []
    if field.waits_for:
        waits.append(f"after {', '.join(field.waits_for)}")
    if field.per_item:
        waits.append("per item")
    line.append(f"  ({'; '.join(waits)})", style="dim")
    return line


def dry_run_view(dry_run: DryRun) -> RenderableType:
    """The dry run as text: a header, then each wave's steps with their kind, tools and fields."""
    steps = dry_run.steps
    needing = [s.id for s in steps if s.uses_model]
    header = Text(
        f"Plan of {dry_run.recipe_id}: {plural(len(steps), 'step')} in "
        f"{plural(len(dry_run.waves), 'wave')} "
        "(a dry run: nothing is called)",
        style="bold",
    )
    lines: list[RenderableType] = [header]
    shown_inputs = ", ".join(f"{k}={_short(v, 40)}" for k, v in dry_run.inputs.items()) or "none"
    lines.append(Text(f"inputs: {shown_inputs}"))
    if needing:
        lines.append(Text(f"model: {dry_run.model} (for {', '.join(needing)})"))
    else:
        lines.append(Text("model: none needed (tool steps only)"))
    together = dry_run.max_parallel > 1
    if not together:
        lines.append(Text("one step at a time (max_parallel_steps: 1)"))
    width = max((len(s.id) for s in steps), default=0)
    for number, wave in enumerate(dry_run.waves, start=1):
        title = f"\nwave {number}" + (" (side by side)" if len(wave) > 1 and together else "")
        lines.append(Text(title, style="bold"))
        for step in wave:
            line = Text("  ")
            line.append(step.id.ljust(width), style="bold cyan")
            line.append(f"  {step.kind} step")
            if step.tools:
                shown = ", ".join(step.tools)
                line.append(f" ({shown})" if step.kind.endswith("tool") else f", tools: {shown}")
            if step.model:
                line.append(f", model: {step.model}")
            if step.depends_on:
                line.append(f", after {', '.join(step.depends_on)}", style="dim")
            if step.notes:
                line.append(f" [{', '.join(step.notes)}]", style="yellow")
            lines.append(line)
            indent = " " * (width + 4)
            if step.description:
                lines.append(Text(f"{indent}{step.description}", style="dim"))
            for rendered in step.fields:
                lines.append(Text(indent).append_text(_field_line(rendered)))
    if dry_run.transitions:
        lines.append(Text("\ntransitions", style="bold"))
        lines.extend(Text(f"  {t}") for t in dry_run.transitions)
    if dry_run.mcp_servers:
        lines.append(
            Text("\nMCP tools (listed by connecting to each server; none called)", style="bold")
        )
        for server in dry_run.mcp_servers:
            lines.append(Text(f"  {server.name} ({server.server})"))
            for tool in server.tools:
                line = Text(f"    {tool.name}")
                if tool.mcp_name != tool.name:
                    line.append(f" ({server.name}.{tool.mcp_name})", style="dim")
                if tool.description:
                    line.append(f"  {_short(tool.description, 60)}", style="dim")
                lines.append(line)
            if not server.tools:
                lines.append(Text("    (no tools)", style="dim"))
    return Group(*lines)


_CHOSE_NOTHING = re.compile(r"'(?P<source>[^']+)' chose nothing \((?P<why>.*)\)$")


def routing_notes(summaries: list[StepSummary]) -> list[str]:
    """One line per step whose transitions chose nothing, naming what did not run because
    of it: a run can complete with the real work never done, and the table alone hides it."""
    skipped: dict[tuple[str, str], list[str]] = {}
    for summary in summaries:
        if summary.status != "skipped" or not summary.error:
            continue
        for part in summary.error.removeprefix("not chosen: ").split("; '"):
            found = _CHOSE_NOTHING.search(part if part.startswith("'") else f"'{part}")
            if found:
                skipped.setdefault((found["source"], found["why"]), []).append(summary.id)
    return [
        f"note: {source!r} chose no next step ({why}), so {', '.join(ids)} did not run"
        for (source, why), ids in skipped.items()
    ]


def run_line(summaries: list[StepSummary], *, status: str, duration: float | None) -> Text:
    """One line under the table: how the run ended, how long it took, what it used."""
    usage = sum((s.usage for s in summaries), Usage())
    parts = [f"run {status}"]
    if duration is not None:
        parts[0] += f" in {duration:.2f}s"
    parts.append(plural(len(summaries), "step"))
    parts.append(plural(sum(s.model_calls for s in summaries), "model call"))
    parts.append(plural(sum(s.tool_calls for s in summaries), "tool call"))
    if usage.unknown_calls:
        unreported = plural(usage.unknown_calls, "call")
        parts.append(
            f"{usage.total_tokens} tokens + what {unreported} did not report"
            if usage.total_tokens
            else "tokens not reported"
        )
    else:
        parts.append(f"{usage.total_tokens} tokens")
    return Text(" · ".join(parts), style=_STATUS_STYLE.get(status, "bold"))
