"""What `minions runs show` prints of a run's steps: every step that started or was skipped,
failed and skipped ones included, with its status, times, tokens and error, as the one fold
of the run's events tells them (`minions._fold`) with its stored steps laid over (their
outputs and attempts); and a hint when the run's worker is dead."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from minions._fold import RunStates, WaitKind, total
from minions._text import token_count
from minions.cli._common import plain
from minions.runs import StepRecord

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
    waiting: WaitKind | None = None
    """What it waits for now (``approval``, ``limit``: its endpoint's), while it runs."""

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


def shown_steps(states: RunStates, stored: Sequence[StepRecord] = ()) -> list[ShownStep]:
    """The run's steps in the order they started (or were skipped), each visit once, as the
    one fold of the run's events tells them with what the store kept laid over
    (`RunStore.step_states`: a resumed run's step that failed, then completed, shows as
    completed; a step whose events are missing shows), and the outputs and attempts of the
    stored ones (`stored`)."""
    kept = {(r.step_id, r.visit): r for r in stored}
    rows = []
    for execution in states.executions:
        if execution.item is not None:
            continue  # a loop item: counted on its step's row
        items = states.items_of(execution)
        spent = total(e.spent for e in (execution, *items))
        record = kept.get((execution.step_id, execution.visit))
        rows.append(
            ShownStep(
                step_id=execution.step_id,
                visit=execution.visit,
                status=execution.status,
                started_at=execution.started_at,
                finished_at=execution.finished_at,
                prompt_tokens=spent.prompt_tokens,
                completion_tokens=spent.completion_tokens,
                calls=execution.model_calls + sum(e.model_calls for e in items),
                unknown_calls=spent.unknown_calls,
                items=execution.items_done,
                attempts=record.attempts if record is not None else 1,
                error=execution.error or execution.skipped or "",
                output=record.output if record is not None else None,
                waited=execution.waited,
                waiting=states.waits_for(execution),
            )
        )
    return rows


_WAITING: dict[WaitKind, str] = {
    "approval": "waiting for approval",
    "limit": "waiting for endpoint",
}


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
        cells: list[str | Text] = [s.step_id]
        if any(x.visit > 1 for x in steps):
            cells.append(str(s.visit))
        status = s.status + (f" ({s.items} items)" if s.items else "")
        cells += [status, _when(s.started_at), s.duration(now)]
        if waits:
            cells.append(_WAITING[s.waiting] if s.waiting else _waited(s.waited))
        cells.append(s.tokens)
        if any(x.attempts > 1 for x in steps):
            cells.append(str(s.attempts))
        cells.append(plain(s.error if s.status in ("failed", "skipped") else _output(s.output)))
        table.add_row(*cells, style="red" if s.status == "failed" else None)
    return table


def dead_worker_hint(record: Any, workers: Sequence[Any], now: float) -> str:
    """A line for a run that says it runs while its worker is dead, or ``""`` (a run that
    waits for a person is held by no worker)."""
    if record.status != "running" or not record.executor_id:  # a waiting run is parked
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
