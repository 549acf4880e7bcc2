"""`minions runs step RUN STEP`: one step of a durable run (``each``, or a loop item:
``each[2]``): its state, times, tokens, error or output, and every model call attempt, tool
call, retry, completion decision and approval, as the one fold of its events tells them
(`minions.runs._steps`, which the service's ``/runs/{id}/steps/{step}`` reads too)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from minions._text import token_count
from minions.cli._common import (
    DatabaseOption,
    JsonOption,
    RunArgument,
    local_time,
    once,
    open_store,
    plain,
    record_data,
    stdout,
)
from minions.cli._progress import elapsed

if TYPE_CHECKING:
    from minions.runs import StepDetail

__all__: list[str] = []

StepArgument = Annotated[
    str,
    typer.Argument(
        metavar="STEP",
        help="The step's id, or a loop item's: STEP[i], e.g. each[2].",
        show_default=False,
    ),
]


def step(
    run: RunArgument,
    step_id: StepArgument,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """One step of a run: its status, times, tokens, error or output, its loop items, and
    every model call (each attempt), tool call (arguments and result), retry, completion
    decision and approval, in order."""

    store = open_store(database_url)
    try:
        detail = asyncio.run(store.step_detail(run, step_id))
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps(record_data(detail), indent=2, ensure_ascii=False))
        return
    _print(stdout(), detail)


def took(start: float | None, end: float | None) -> str:
    """How long from `start` to `end` (or now): ``1.25s`` under a minute, else ``4m05s``,
    ``1h02m``; rounded before it is split, so never ``60.00s`` nor ``59m60s``."""
    if start is None:
        return ""
    seconds = max(0.0, (end or time.time()) - start)
    return f"{seconds:.2f}s" if round(seconds, 2) < 60 else elapsed(round(seconds))


def _tokens(usage: Any) -> str:
    if usage is None or not usage.calls:
        return ""
    total = usage.prompt_tokens + usage.completion_tokens
    return token_count(total, unreported=usage.unknown_calls > 0) + " tokens"


def _item(item: int | None) -> str:
    return "" if item is None else f"item {item} · "


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


def _print(out: Console, d: StepDetail) -> None:
    head = [d.status, d.kind or "", took(d.started_at, d.finished_at), _tokens(d.usage)]
    out.print(
        f"step {d.step_id} of run {d.run_id}: " + ", ".join(x for x in head if x), markup=False
    )
    when = [
        f"started {local_time(d.started_at)}" if d.started_at else "",
        f"ended {local_time(d.finished_at)}" if d.finished_at else "",
        f"{len(d.executions)} visits" if len(d.executions) > 1 else "",
    ]
    if any(when):
        out.print(" · ".join(x for x in when if x), markup=False)
    said: list[str] = []  # a long error, said once: the step's, then "(as above)" in its call's
    if d.error:
        out.print(f"error: {once(d.error, said)}", markup=False, style="red")
    if d.skipped:
        out.print(f"skipped: {d.skipped}", markup=False)
    last = d.executions[-1] if d.executions else None
    if last is not None and last.output is not None:
        out.print(f"output: {_value(last.output)}", markup=False)
    if last is not None and last.loop_items:
        items = Table(show_edge=False, pad_edge=False, title="loop items", title_justify="left")
        for name in ("item", "status", "time", "tokens", "error or output"):
            items.add_column(name, no_wrap=name != "error or output", overflow="fold")
        for i in last.loop_items:
            shown = (
                i.error if i.status == "failed" else "" if i.output is None else _value(i.output)
            )
            usage = sum(i.usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens"))
            items.add_row(
                i.step_id,
                i.status,
                took(i.started_at, i.finished_at),
                str(usage) if i.usage.get("calls") else "",
                plain(" ".join((shown or "").split())),
            )
        out.print(items)
    _model_calls(out, d, said)
    _tool_calls(out, d, said)
    for r in d.retries:
        waited = f", waited {r.delay:.2f}s" if r.delay else ""
        out.print(
            f"retry: {_item(r.item)}{r.target} attempt {r.attempt} failed{waited}: {r.reason}",
            markup=False,
        )
    for c in d.decisions:
        why = f": {c.reason}" if c.reason and c.reason != c.decision else ""
        out.print(f"decision: {_item(c.item)}{c.link} {c.decision}{why}", markup=False)
    for a in d.approvals:
        verdict = "waiting" if a.decided_at is None else "approved" if a.approved else "rejected"
        why = f": {a.reason}" if a.reason else ""
        out.print(
            f"approval {a.call_id}: {a.tool}({json.dumps(a.arguments, ensure_ascii=False)}) "
            f"{verdict}{why}",
            markup=False,
        )


def _model_calls(out: Console, d: StepDetail, said: list[str]) -> None:
    if not d.model_calls:
        return
    out.print(f"model calls ({len(d.model_calls)}):", markup=False)
    for c in d.model_calls:
        facts = [
            c.model,
            took(c.started_at, c.finished_at) if c.finished_at else "running",
            _tokens(c.usage),
            f"finish {c.finish_reason}" if c.finish_reason else "",
            f"mode {c.output_mode}" if c.output_mode else "",
            f"asked for {', '.join(c.tool_calls)}" if c.tool_calls else "",
        ]
        line = Text(f"  {_item(c.item)}turn {c.turn}, attempt {c.attempt}: ")
        line.append(" · ".join(x for x in facts if x))
        out.print(line)
        if c.error:
            out.print(Text(f"    error: {once(c.error, said)}", style="red"))
        if c.answer:
            out.print(Text(f"    answer: {c.answer}"))


def _tool_calls(out: Console, d: StepDetail, said: list[str]) -> None:
    if not d.tool_calls:
        return
    out.print(f"tool calls ({len(d.tool_calls)}):", markup=False)
    for t in d.tool_calls:
        facts = [
            took(t.started_at, t.finished_at) if t.finished_at else "running",
            f"{t.attempts} attempts" if t.attempts > 1 else "",
        ]
        arguments = json.dumps(t.arguments, ensure_ascii=False)
        out.print(
            Text(f"  {_item(t.item)}{t.name}({arguments}): " + " · ".join(x for x in facts if x))
        )
        if t.result is not None:
            out.print(Text(f"    result: {t.result}"))
        if t.error:
            out.print(Text(f"    error: {once(t.error, said)}", style="red"))
