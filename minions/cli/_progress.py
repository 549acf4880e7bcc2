"""Progress during long work (a model call of minutes, a planner thinking): in a pipe or a CI
log, a line at most every `progress_every()` seconds saying what runs, for how long and the
tokens so far; on a terminal, a spinner line that says the same."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.status import Status

from minions import events as ev
from minions._fold import IN_FLIGHT, Execution, RunStates, total
from minions.cli._errors import UsageError

__all__: list[str] = []

PROGRESS_ENV = "MINIONS_PROGRESS_EVERY"
DEFAULT_EVERY = 10.0


def progress_every() -> float:
    """Seconds between progress lines: ``MINIONS_PROGRESS_EVERY``, else 10; 0 turns them off.

    Raises:
        UsageError: the variable is not a number of seconds.
    """
    given = os.environ.get(PROGRESS_ENV, "").strip()
    if not given:
        return DEFAULT_EVERY
    try:
        every = float(given)
    except ValueError:
        every = -1.0
    if not every >= 0:  # NaN too
        raise UsageError(f"{PROGRESS_ENV}={given!r}: give seconds, e.g. 10 (0: no progress lines)")
    return every


def elapsed(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Ticker:
    """Says what `describe` returns while work goes on (``None``: nothing worth saying now).

    In a pipe (`console` not a terminal) a line is printed when `every` seconds passed since
    the last line anyone printed (`touch` says one was); on a terminal a spinner line is
    redrawn in place, and cleared at the end. Use as a context manager around the work.
    """

    def __init__(
        self,
        console: Console,
        describe: Callable[[], str | None],
        *,
        every: float | None = None,
        live: bool | None = None,
    ) -> None:
        self.console = console
        self.describe = describe
        self.every = progress_every() if every is None else every
        self.live = console.is_terminal if live is None else live
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status: Status | None = None

    def touch(self) -> None:
        """A line was just printed: the next progress line waits `every` seconds more."""
        self._last = time.monotonic()

    def start(self) -> None:
        if self.every <= 0 or self._thread is not None:
            return
        self._stop.clear()
        self._last = time.monotonic()
        if self.live:
            self._status = Status("", console=self.console)
            self._status.start()
        self._thread = threading.Thread(target=self._loop, name="minions-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _loop(self) -> None:
        while True:
            if self._status is not None:
                if self._stop.wait(0.25):
                    return
                self._status.update(self.describe() or "")
                continue
            wait = self._last + self.every - time.monotonic()
            if wait > 0:
                if self._stop.wait(wait):
                    return
                continue
            line = self.describe()
            if line:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self.touch()

    def __enter__(self) -> Ticker:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class FollowedRun:
    """What a followed run's events say runs now (the one fold of its events, by their own
    times: the stored ones come first, at once), for `Ticker`."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.states = RunStates()

    def __call__(self, event: ev.Event) -> None:
        self.states.fold(event)

    def line(self) -> str | None:
        executions = self.states.executions  # a copy: the loop's thread adds some
        running = [
            e
            for e in executions
            if e.item is None and e.status in IN_FLIGHT and self.states.latest(e.step_id) is e
        ]
        if not running:
            return None
        now = time.time()
        shown = []
        for step in running:
            took = elapsed(now - (step.started_at or now))
            shown.append(f"{step.step_id} ({took}{self._why(step)})")
        spent = total(e.spent for e in executions)
        tokens = spent.prompt_tokens + spent.completion_tokens
        return f"… run {self.run_id}: running {', '.join(shown)}; {tokens} tokens so far"

    def _why(self, step: Execution) -> str:
        """What a running step waits for: a person's decision on a call, or (its own call or
        one of its loop items') its endpoint's limits."""
        approval = step.waiting("approval")
        if approval is not None:
            return f", waits for approval of {approval.name}"
        for execution in (step, *self.states.items_of(step)):
            limit = execution.waiting("limit")
            if limit is not None:
                return f", waits for {limit.endpoint} ({limit.limit})"
        return ""
