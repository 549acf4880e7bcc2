"""What `minions runs show` prints of a run's steps: every step that started or was skipped,
failed and skipped ones included, with its status, times, tokens and error, read from the
run's events (the store keeps checkpoints of completed steps only) and its stored steps (their
outputs and attempts); and a hint when the run's worker is dead."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from minions import events as ev
from minions._text import token_count

__all__: list[str] = []


@dataclass
class ShownStep:
    """One row: a step's visit as its events tell it."""

    step_id: str
    visit: int = 1
    status: str = "pending"
    started_at: float | None = None
    finished_at: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    unknown_calls: int = 0
    items: int = 0
    attempts: int = 1
    error: str = ""
    output: Any = None
    waited: float = 0.0
    """Seconds of its time it waited (for its endpoint's limits, for approvals)."""
    waiting: str = ""
    """What it waits for now (``endpoint``, ``approval``), while it runs."""

    @property
    def tokens(self) -> str:
        if not self.calls:
            return ""
        total = self.prompt_tokens + self.completion_tokens
        return token_count(total, unreported=self.unknown_calls > 0)

    def duration(self, now: float) -> str:
        if self.started_at is None:
            return ""
        return f"{(self.finished_at or now) - self.started_at:.2f}s"


def shown_steps(events: Iterable[ev.Event], stored: Sequence[Any] = ()) -> list[ShownStep]:
    """The run's steps in the order they started (or were skipped), each visit once, with
    what its latest events say (a resumed run's step that failed, then completed, shows as
    completed). `stored`: the store's `StepRecord`s, for outputs and attempts."""
    rows: dict[tuple[str, int], ShownStep] = {}
    current: dict[str, ShownStep] = {}  # a step's row being filled (its latest visit)

    def row(step_id: str, visit: int | None = None) -> ShownStep:
        if visit is None:
            found = current.get(step_id)
            if found is not None:
                return found
            visit = 1
        key = (step_id, visit)
        if key not in rows:
            rows[key] = ShownStep(step_id=step_id, visit=visit)
        current[step_id] = rows[key]
        return rows[key]

    for event in events:
        base, bracket, _ = (event.step_id or "").partition("[")
        if not base:
            continue
        if isinstance(event, ev.ModelCallCompleted | ev.ModelCallFailed):
            shown = row(base)  # a loop item's calls count on its step's row
            shown.prompt_tokens += event.usage.prompt_tokens
            shown.completion_tokens += event.usage.completion_tokens
            shown.calls += max(event.usage.calls, 1)
            shown.unknown_calls += event.usage.unknown_calls
        elif bracket:  # a loop item: counted on its step's row
            if isinstance(event, ev.StepCompleted | ev.StepFailed):
                row(base).items += 1
        elif isinstance(event, ev.ModelCallWaiting | ev.ApprovalRequested):
            row(base).waiting = "endpoint" if isinstance(event, ev.ModelCallWaiting) else "approval"
        elif isinstance(event, ev.ModelCallStarted | ev.ApprovalResolved):
            row(base).waiting = ""
        elif isinstance(event, ev.StepStarted):
            shown = row(base, event.visit)
            shown.status, shown.started_at, shown.finished_at = "running", event.timestamp, None
            shown.error, shown.waited, shown.waiting = "", 0.0, ""
        elif isinstance(event, ev.StepCompleted | ev.StepFailed):
            shown = row(base, event.visit)
            shown.finished_at = event.timestamp
            shown.waited, shown.waiting = event.waited, ""
            if isinstance(event, ev.StepCompleted):
                shown.status, shown.error = "completed", ""
            else:
                shown.status, shown.error = "failed", event.error
        elif isinstance(event, ev.StepSkipped):
            shown = row(base)
            if shown.status == "pending":
                shown.status, shown.error = "skipped", event.reason
    for record in stored:
        if getattr(record, "item", None) is not None:
            continue
        key = (record.step_id, record.visit)
        if key not in rows:  # stored but its events are not (an old store): still listed
            rows[key] = ShownStep(step_id=record.step_id, visit=record.visit, status=record.status)
        shown = rows[key]
        shown.output = record.output
        shown.attempts = record.attempts
        shown.waited = shown.waited or getattr(record, "waited", 0.0)
        shown.error = shown.error or (record.error or "")
        for name in ("started_at", "finished_at"):  # the store's times, where it keeps them
            value = getattr(record, name, None)
            if value is not None and getattr(shown, name) is None:
                setattr(shown, name, value)
    return list(rows.values())


def _waited(seconds: float) -> str:
    return f"{seconds:.2f}s" if seconds else ""


def _when(moment: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(moment)) if moment else ""


def _output(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:79] + "…"


def steps_table(steps: Sequence[ShownStep], now: float) -> Table:
    """The steps with their visit, status, start, time (and of it, the time they waited for
    their endpoint's limits or for approvals, when one did), tokens, attempts, and the error of a
    failed step (why a skipped one did not run), else the output, cut short. Ids are never
    cut: their column does not wrap, and the last column folds instead."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("step", no_wrap=True)
    if any(s.visit > 1 for s in steps):
        table.add_column("visit", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    waits = any(s.waited or s.waiting for s in steps)
    if waits:
        table.add_column("waited", justify="right", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    if any(s.attempts > 1 for s in steps):
        table.add_column("attempts", justify="right", no_wrap=True)
    table.add_column("error or output", overflow="fold")
    for s in steps:
        cells = [s.step_id]
        if any(x.visit > 1 for x in steps):
            cells.append(str(s.visit))
        status = s.status + (f" ({s.items} items)" if s.items else "")
        cells += [status, _when(s.started_at), s.duration(now)]
        if waits:
            cells.append(f"waiting for {s.waiting}" if s.waiting else _waited(s.waited))
        cells.append(s.tokens)
        if any(x.attempts > 1 for x in steps):
            cells.append(str(s.attempts))
        cells.append(s.error if s.status in ("failed", "skipped") else _output(s.output))
        table.add_row(*cells, style="red" if s.status == "failed" else None)
    return table


def dead_worker_hint(record: Any, workers: Sequence[Any], now: float) -> str:
    """A line for a run that says it runs (or waits) while its worker is dead, or ``""``."""
    if record.status not in ("running", "waiting") or not record.executor_id:
        return ""
    mine = [w for w in workers if w.executor_id == record.executor_id]
    if not mine or mine[-1].alive:
        return ""
    beat = mine[-1].heartbeat_at
    alive = [w.executor_id for w in workers if w.alive]
    then = (
        f"a live worker ({alive[0]}) takes it over from its last completed step"
        if alive
        else "start a worker (`minions worker`) to take it over from its last completed step"
    )
    return (
        f"hint: its worker {record.executor_id} last beat {now - beat:.0f}s ago and seems "
        f"dead: {then}"
    )
