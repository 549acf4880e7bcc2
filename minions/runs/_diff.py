"""The difference of two runs, step by step: status, output (a structured diff of JSON
outputs), tokens, model calls and duration, and the first step where they diverge."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from minions._text import count_values
from minions.errors import DiffTooLargeError
from minions.runs._checkpoints import DONE, StepRecord
from minions.runs._runs import RunRecord

__all__ = ["RunDiff", "StepDiff"]


@dataclass(frozen=True, kw_only=True)
class OutputChange:
    """One place where two outputs differ: its JSON path (``$``, ``$.title``, ``$.items[2]``)
    and the value in each run (``None`` where it is missing)."""

    path: str
    a: Any = None
    b: Any = None


@dataclass(frozen=True, kw_only=True)
class StepDiff:
    """One step execution (a step's visit) in two runs. A side is ``None`` where that run has
    no finished execution of it.

    Attributes:
        diverges: the runs differ here: only one of them finished it, or one completed it
            (or reused it) and the other failed, or their outputs differ. Tokens, calls and
            durations differ between any two runs and do not count.
        changes: where the outputs differ (empty when they are equal).
    """

    step_id: str
    visit: int
    status: tuple[str | None, str | None]
    diverges: bool
    changes: tuple[OutputChange, ...]
    tokens: tuple[int, int]
    calls: tuple[int, int]
    duration: tuple[float | None, float | None]
    reused: tuple[bool, bool] = (False, False)

    @property
    def key(self) -> str:
        """The step's id, with ``#visit`` after a first visit."""
        return self.step_id if self.visit == 1 else f"{self.step_id}#{self.visit}"


@dataclass(frozen=True, kw_only=True)
class RunDiff:
    """Two runs compared step by step, in the order the first run finished its steps (then
    the steps only the second finished).

    Attributes:
        first_divergence: the first step (`StepDiff.key`) where they diverge; ``None`` when
            every step has the same outcome and output.
    """

    run_a: str
    run_b: str
    status: tuple[str, str]
    steps: tuple[StepDiff, ...]
    first_divergence: str | None
    tokens: tuple[int, int]
    calls: tuple[int, int]


MAX_DIFF_VALUES = 500_000
"""The most JSON values of step outputs (both runs together) one diff compares by default:
about a second of a thread, and an answer of a few tens of MB at most."""

_DIFFS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="minions-diff")
"""Diffs run here, off the event loop, two at a time."""


async def diff_off_loop(a: RunRecord, b: RunRecord, max_values: int | None) -> RunDiff:
    """`diff_runs` in a thread of its own pool (the caller's event loop goes on)."""
    job = functools.partial(diff_runs, a, b, max_values=max_values)
    return await asyncio.get_running_loop().run_in_executor(_DIFFS, job)


def diff_runs(a: RunRecord, b: RunRecord, *, max_values: int | None = None) -> RunDiff:
    """Compare two runs (with their finished steps) step by step.

    Raises:
        DiffTooLargeError: their step outputs hold more than `max_values` JSON values
            (default `MAX_DIFF_VALUES`).
    """
    limit, counted = MAX_DIFF_VALUES if max_values is None else max_values, 0
    for step in (*a.steps, *b.steps):
        counted += count_values(step.output, limit - counted)
        if counted > limit:
            raise DiffTooLargeError(a.run_id, b.run_id, limit)
    left = {(s.step_id, s.visit): s for s in a.steps}
    right = {(s.step_id, s.visit): s for s in b.steps}
    order = list(left) + [k for k in right if k not in left]
    steps = tuple(_step_diff(key, left.get(key), right.get(key)) for key in order)
    first = next((s.key for s in steps if s.diverges), None)
    return RunDiff(
        run_a=a.run_id,
        run_b=b.run_id,
        status=(a.status, b.status),
        steps=steps,
        first_divergence=first,
        tokens=(_tokens(a.usage), _tokens(b.usage)),
        calls=(sum(s.model_calls for s in a.steps), sum(s.model_calls for s in b.steps)),
    )


def _step_diff(key: tuple[str, int], a: StepRecord | None, b: StepRecord | None) -> StepDiff:
    changes: tuple[OutputChange, ...] = ()
    if a is not None and b is not None:
        changes = tuple(output_changes(a.output, b.output))
    diverges = (
        a is None
        or b is None
        or (a.status in DONE) != (b.status in DONE)
        or bool(changes)
        or (a.status not in DONE and a.error != b.error)
    )
    return StepDiff(
        step_id=key[0],
        visit=key[1],
        status=(_of(a, "status"), _of(b, "status")),
        diverges=diverges,
        changes=changes,
        tokens=(_tokens(_of(a, "usage") or {}), _tokens(_of(b, "usage") or {})),
        calls=(_of(a, "model_calls") or 0, _of(b, "model_calls") or 0),
        duration=(_of(a, "duration"), _of(b, "duration")),
        reused=(_of(a, "status") == "reused", _of(b, "status") == "reused"),
    )


def output_changes(a: Any, b: Any, path: str = "$") -> Iterator[OutputChange]:
    """Where JSON values `a` and `b` differ: mappings key by key, lists item by item (an item
    only one of them has is a change with ``None`` on the other side), anything else whole."""
    if isinstance(a, dict) and isinstance(b, dict):
        for name in [*a, *(k for k in b if k not in a)]:
            sub = f"{path}.{name}" if str(name).isidentifier() else f"{path}[{name!r}]"
            if name not in a or name not in b:
                yield OutputChange(path=sub, a=a.get(name), b=b.get(name))
            else:
                yield from output_changes(a[name], b[name], sub)
        return
    if isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            sub = f"{path}[{index}]"
            if index >= len(a) or index >= len(b):
                yield OutputChange(
                    path=sub,
                    a=a[index] if index < len(a) else None,
                    b=b[index] if index < len(b) else None,
                )
            else:
                yield from output_changes(a[index], b[index], sub)
        return
    if a != b or type(a) is not type(b):
        yield OutputChange(path=path, a=a, b=b)


def _of(record: StepRecord | None, name: str) -> Any:
    return None if record is None else getattr(record, name)


def _tokens(usage: dict[str, int]) -> int:
    return int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
