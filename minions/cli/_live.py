"""The live view of a run: one row per step, told by the one fold of its events
(`minions._fold`) as they happen."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from minions import events as ev
from minions._fold import IN_FLIGHT, Execution, RunStates, step_error, total
from minions._item import ItemId
from minions._text import token_count
from minions.cli._progress import Ticker, elapsed

__all__ = []

ViewMode = Literal["live", "lines", "off"]
"""``live`` redraws a table in place (a terminal), ``lines`` prints a line per step that
starts, ends or is skipped (CI logs, pipes), ``off`` only keeps count (``--quiet``)."""

_WAITS = {
    "max_concurrent": "as many calls as allowed are in flight",
    "requests_per_minute": "its requests per minute are used up",
    "tokens_per_minute": "its tokens per minute are used up",
    "retry_after": "it answered 429 (Retry-After)",
}
"""What a `ModelCallWaiting` waits for, in words."""

_STYLE: dict[str, tuple[str, str]] = {
    "pending": ("·", "dim"),
    "running": ("▶", "bold cyan"),
    "waiting": ("?", "bold yellow"),
    "completed": ("✓", "green"),
    "failed": ("✗", "bold red"),
    "skipped": ("↷", "yellow"),
    "reused": ("✓", "cyan"),
}
"""How each execution status (`EXECUTION_STATUSES`) is marked."""


@dataclass
class StepRow:
    """What the live view shows of one step (every visit and loop item of it together)."""

    id: str
    status: str = "pending"
    started: float | None = None
    ended: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unknown_usage: bool = False
    model_calls: int = 0
    tool_calls: int = 0
    retries: int = 0
    items_done: int = 0
    items_started: int = 0
    streamed: int = 0
    """Text deltas of its model calls in flight (a rough count of tokens not reported yet)."""
    note: str = ""

    def elapsed(self, now: float) -> float | None:
        if self.started is None:
            return None
        return (self.ended or now) - self.started

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def step_row(states: RunStates, step: str) -> StepRow:
    """What the one fold of the run's events (`states`) tells of `step`."""
    executions = states.of_step(step)
    latest = states.latest(step)
    spent = total(e.spent for e in executions)
    row = StepRow(
        step,
        prompt_tokens=spent.prompt_tokens,
        completion_tokens=spent.completion_tokens,
        unknown_usage=spent.unknown_calls > 0,
        model_calls=sum(e.model_calls for e in executions),
        tool_calls=sum(e.tool_calls for e in executions),
        retries=sum(len(e.retries) for e in executions),
        streamed=sum(e.streamed for e in executions),
    )
    if latest is None:
        return row
    row.status, row.started, row.ended = latest.status, latest.started_at, latest.finished_at
    row.items_started, row.items_done = latest.items_started, latest.items_done
    row.note = _note(latest, executions)
    return row


def _note(latest: Execution, executions: Sequence[Execution]) -> str:
    """Why a step failed or was skipped, what it waits for, or a call a person rejected."""
    if latest.status == "failed":
        return step_error(latest.step_id, latest.error or "")
    if latest.status == "skipped":
        return latest.skipped or ""
    approval = latest.waiting("approval")
    if approval is not None:
        return f"waiting for approval of {approval.name}"
    for execution in executions:
        limit = execution.waiting("limit")
        if limit is not None:
            return f"waits: {_WAITS.get(limit.limit or '', limit.limit)}"
    rejected = [w for w in latest.waits if w.kind == "approval" and w.approved is False]
    return f"{rejected[-1].name} rejected" if rejected else ""


class LiveView:
    """An event listener that shows the run's steps as the one fold of its events tells them
    (`minions._fold`).

    In ``live`` mode (the default on a terminal) it redraws a table in place between `start`
    and `stop`, and clears it at the end (the command prints a summary instead); in ``lines``
    mode (the default elsewhere: CI logs, pipes) it prints one line per step that starts, ends
    or is skipped; ``off`` prints nothing. In every mode `rows` tells what each step did, so a
    run cut short can still be reported.
    """

    def __init__(
        self,
        console: Console,
        steps: Sequence[str] = (),
        *,
        title: str = "",
        mode: ViewMode | None = None,
    ) -> None:
        self.console = console
        self.title = title
        self.states = RunStates()
        self._steps = list(steps)
        self.mode: ViewMode = mode or ("live" if console.is_terminal else "lines")
        self._live: Live | None = None
        self._started = time.time()
        self._ticker = Ticker(console, self.progress_line, live=False)
        """In ``lines`` mode, a line now and then while steps run long."""

    @property
    def rows(self) -> dict[str, StepRow]:
        """Each step's row: the recipe's steps in order, then any other the events told of."""
        steps = dict.fromkeys(self._steps)
        steps.update(dict.fromkeys(e.step for e in self.states.executions))
        return {step: step_row(self.states, step) for step in steps}

    @property
    def run_status(self) -> str:
        return "running" if self.states.status == "pending" else self.states.status

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._started = time.time()
        if self.mode == "live":
            # `get_renderable` redraws on every refresh, so elapsed times tick between events.
            self._live = Live(
                console=self.console,
                get_renderable=self.render,
                refresh_per_second=8,
                transient=True,
            )
            self._live.start()
        elif self.mode == "lines":
            self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- events --------------------------------------------------------------------------------

    def __call__(self, event: ev.Event) -> None:
        self.states.fold(event)
        if self.mode != "lines" or event.step_id is None:
            return
        name = ItemId.parse(event.step_id)
        base = name.step
        if isinstance(event, ev.StepStarted) and name.item is None:
            others = [r.id for r in self.rows.values() if r.status in IN_FLIGHT and r.id != base]
            self._line(f"▶ {base}" + (f" (alongside {', '.join(others)})" if others else ""))
        elif isinstance(event, ev.StepCompleted | ev.StepFailed) and name.item is None:
            self._line(self._end_line(step_row(self.states, base)))
        elif isinstance(event, ev.StepSkipped):
            self._line(f"↷ {base} skipped: {event.reason}")
        elif isinstance(event, ev.ModelCallWaiting):
            why = _WAITS.get(event.reason, event.reason)
            self._line(f"… {base} waits for {event.endpoint}: {why}")
        elif isinstance(event, ev.ApprovalRequested):
            self._line(f"? {base} waits for approval: {event.name} ({event.call_id})")
        elif isinstance(event, ev.ApprovalResolved):
            verdict = "approved" if event.approved else f"rejected: {event.reason or ''}"
            self._line(f"  {base}: {event.name} {verdict}".rstrip())

    def _line(self, text: str) -> None:
        if self.mode == "lines":
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)
            self._ticker.touch()

    def progress_line(self) -> str | None:
        """What runs now, for how long, and the tokens so far; ``None`` when nothing runs."""
        now = time.time()
        rows = list(self.rows.values())
        running = [r for r in rows if r.status in IN_FLIGHT]
        if not running:
            return None
        shown = []
        for row in running:
            bits = [elapsed(row.elapsed(now) or 0.0)]
            if row.items_started:
                bits.append(f"{row.items_done}/{row.items_started} items")
            if row.model_calls:
                bits.append(f"{row.model_calls} model call{'s' if row.model_calls > 1 else ''}")
            if row.streamed:
                bits.append(f"~{row.streamed} tokens streamed")
            if row.note:
                bits.append(row.note)
            shown.append(f"{row.id} ({', '.join(bits)})")
        tokens = sum(r.tokens for r in rows)
        return (
            f"… {elapsed(now - self._started)}: running {', '.join(shown)}; {tokens} tokens so far"
        )

    def _end_line(self, row: StepRow) -> str:
        mark, _ = _STYLE[row.status]
        elapsed = row.elapsed(time.time()) or 0.0
        text = f"{mark} {row.id} {row.status} in {elapsed:.2f}s"
        if row.tokens:
            text += f", {row.tokens} tokens"
        if row.status == "failed":
            text += f": {row.note}"
        return text

    # -- rendering -----------------------------------------------------------------------------

    def render(self) -> RenderableType:
        now = time.time()
        table = Table(title=self.title or None, expand=False, show_edge=False, pad_edge=False)
        # The summary table's names, in its order (it replaces this one at the end).
        table.add_column("", width=1)
        table.add_column("step", no_wrap=True)
        table.add_column("status")
        table.add_column("time", justify="right")
        table.add_column("model calls", justify="right")
        table.add_column("tool calls", justify="right")
        table.add_column("retries", justify="right")
        table.add_column("tokens", justify="right")
        table.add_column("note", overflow="ellipsis", max_width=50)
        rows = list(self.rows.values())
        for row in rows:
            mark, style = _STYLE[row.status]
            elapsed = row.elapsed(now)
            status = row.status
            if row.items_started:
                status += f" {row.items_done}/{row.items_started} items"
            tokens = (
                token_count(row.tokens, unreported=row.unknown_usage) if row.model_calls else ""
            )
            table.add_row(
                Text(mark, style=style),
                row.id,
                Text(status, style=style),
                f"{elapsed:.1f}s" if elapsed is not None else "",
                str(row.model_calls or ""),
                str(row.tool_calls or ""),
                str(row.retries or ""),
                tokens,
                Text(row.note),
            )
        running = [r.id for r in rows if r.status in IN_FLIGHT]
        clock = f"{now - self._started:.1f}s"
        footer = Text(
            f"{clock} · running now: {', '.join(running)}"
            if running
            else f"{clock} · run {self.run_status}",
            style="cyan" if running else "dim",
        )
        return Group(table, footer)
