"""The live view of a run: one row per step, updated from events as they happen."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from minions import events as ev
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

_STYLE = {
    "pending": ("·", "dim"),
    "running": ("▶", "bold cyan"),
    "completed": ("✓", "green"),
    "failed": ("✗", "bold red"),
    "skipped": ("↷", "yellow"),
}


@dataclass
class StepRow:
    """What the live view knows of one step."""

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
    """Text deltas of its model call in flight (a rough count of tokens not reported yet)."""
    note: str = ""

    def elapsed(self, now: float) -> float | None:
        if self.started is None:
            return None
        return (self.ended or now) - self.started

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class LiveView:
    """An event listener that keeps a table of the run's steps.

    In ``live`` mode (the default on a terminal) it redraws the table in place between
    `start` and `stop`, and clears it at the end (the command prints a summary instead); in
    ``lines`` mode (the default elsewhere: CI logs, pipes) it prints one line per step that
    starts, ends or is skipped; ``off`` prints nothing. In every mode `rows` keeps what each
    step did, so a run cut short can still be reported.
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
        self.rows: dict[str, StepRow] = {step: StepRow(step) for step in steps}
        self.run_status = "running"
        self.mode: ViewMode = mode or ("live" if console.is_terminal else "lines")
        self._live: Live | None = None
        self._started = time.monotonic()
        self._ticker = Ticker(console, self.progress_line, live=False)
        """In ``lines`` mode, a line now and then while steps run long."""

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._started = time.monotonic()
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

    def _row(self, step_id: str) -> StepRow:
        row = self.rows.get(step_id)
        if row is None:
            row = self.rows[step_id] = StepRow(step_id)
        return row

    def __call__(self, event: Any) -> None:
        step_id = getattr(event, "step_id", None)
        base, _, item = (step_id or "").partition("[")
        now = time.monotonic()
        if isinstance(event, ev.StepStarted):
            row = self._row(base)
            if item:
                row.items_started += 1
            else:
                row.status, row.started, row.ended = "running", now, None
                row.items_started = row.items_done = 0
                others = [
                    r.id for r in self.rows.values() if r.status == "running" and r is not row
                ]
                self._line(f"▶ {base}" + (f" (alongside {', '.join(others)})" if others else ""))
        elif isinstance(event, ev.StepCompleted | ev.StepFailed):
            row = self._row(base)
            if item:
                row.items_done += 1
            else:
                row.status = "completed" if isinstance(event, ev.StepCompleted) else "failed"
                row.ended = now
                if isinstance(event, ev.StepFailed):
                    row.note = event.error
                self._line(self._end_line(row, now))
        elif isinstance(event, ev.StepSkipped):
            row = self._row(base)
            row.status, row.note = "skipped", event.reason
            self._line(f"↷ {base} skipped: {event.reason}")
        elif isinstance(event, ev.ModelCallCompleted | ev.ModelCallFailed):
            row = self._row(base)
            row.model_calls += 1
            row.streamed = 0
            row.prompt_tokens += event.usage.prompt_tokens
            row.completion_tokens += event.usage.completion_tokens
            row.unknown_usage = row.unknown_usage or event.usage.unknown_calls > 0
        elif isinstance(event, ev.TokenDelta):
            self._row(base).streamed += 1
        elif isinstance(event, ev.ToolCallCompleted | ev.ToolCallFailed):
            self._row(base).tool_calls += 1
        elif isinstance(event, ev.ModelCallWaiting):
            row = self._row(base)
            why = _WAITS.get(event.reason, event.reason)
            row.note = f"waits: {why}"
            self._line(f"… {base} waits for {event.endpoint}: {why}")
        elif isinstance(event, ev.ModelCallStarted):
            row = self._row(base)
            if row.note.startswith("waits: "):
                row.note = ""
        elif isinstance(event, ev.RetryScheduled):
            self._row(base).retries += 1
        elif isinstance(event, ev.ApprovalRequested):
            row = self._row(base)
            row.note = f"waiting for approval of {event.name}"
            self._line(f"? {base} waits for approval: {event.name} ({event.call_id})")
        elif isinstance(event, ev.ApprovalResolved):
            row = self._row(base)
            row.note = "" if event.approved else f"{event.name} rejected"
            verdict = "approved" if event.approved else f"rejected: {event.reason or ''}"
            self._line(f"  {base}: {event.name} {verdict}".rstrip())
        elif isinstance(event, ev.RunCompleted):
            self.run_status = "completed"
        elif isinstance(event, ev.RunFailed):
            self.run_status = "failed"

    def _line(self, text: str) -> None:
        if self.mode == "lines":
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)
            self._ticker.touch()

    def progress_line(self) -> str | None:
        """What runs now, for how long, and the tokens so far; ``None`` when nothing runs."""
        now = time.monotonic()
        rows = list(self.rows.values())
        running = [r for r in rows if r.status == "running"]
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

    def _end_line(self, row: StepRow, now: float) -> str:
        mark, _ = _STYLE[row.status]
        elapsed = row.elapsed(now) or 0.0
        text = f"{mark} {row.id} {row.status} in {elapsed:.2f}s"
        if row.tokens:
            text += f", {row.tokens} tokens"
        if row.status == "failed":
            text += f": {row.note}"
        return text

    # -- rendering -----------------------------------------------------------------------------

    def render(self) -> RenderableType:
        now = time.monotonic()
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
        for row in list(self.rows.values()):
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
                row.note,
            )
        running = [r.id for r in list(self.rows.values()) if r.status == "running"]
        clock = f"{now - self._started:.1f}s"
        footer = Text(
            f"{clock} · running now: {', '.join(running)}"
            if running
            else f"{clock} · run {self.run_status}",
            style="cyan" if running else "dim",
        )
        return Group(table, footer)
