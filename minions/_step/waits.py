"""Time spent waiting apart from time spent working: a step's model calls wait for their
endpoint's limits, its tool calls for a person's approval. `Waits` keeps a step's (the union
of its waits in time), `RunWaits` a run's (the time every step it was running was waiting)."""

from __future__ import annotations

from time import monotonic

__all__: list[str] = []


class RunWaits:
    """When a run was blocked: it was running steps and every one of them was waiting.

    Time between steps, or while one step works and another waits, is the run's work.
    """

    __slots__ = ("_since", "_total", "running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        """Steps of the run running now."""
        self.waiting = 0
        """Of those, the steps waiting now."""
        self._since = 0.0
        self._total = 0.0

    def _change(self, running: int, waiting: int) -> None:
        before = self.running > 0 and self.waiting >= self.running
        after = running > 0 and waiting >= running
        if after and not before:
            self._since = monotonic()
        elif before and not after:
            self._total += monotonic() - self._since
        self.running, self.waiting = running, waiting

    def started(self) -> None:
        """A step started."""
        if self.waiting:
            self._change(self.running + 1, self.waiting)
        else:  # nothing waits: nothing to time (every step's path)
            self.running += 1

    def ended(self) -> None:
        """A step ended (its waits were over)."""
        if self.waiting:
            self._change(self.running - 1, self.waiting)
        else:
            self.running -= 1

    def step_waits(self, waiting: bool) -> None:
        """A step started (True) or stopped (False) waiting."""
        self._change(self.running, self.waiting + (1 if waiting else -1))

    @property
    def seconds(self) -> float:
        """Seconds the run was blocked, so far."""
        if self.running > 0 and self.waiting >= self.running:
            return self._total + monotonic() - self._since
        return self._total


class Waits:
    """The waits of one step execution, as the union of their times (parallel tool calls
    may wait for approval at once). An inner execution (a loop's item) tells its waits to
    the execution that runs it (`parent`); a step of the run tells the run (`run`).

    Args:
        run: the run's waits, for a step of the run itself.
    """

    __slots__ = ("_since", "_total", "open", "parent", "run")

    def __init__(self, run: RunWaits | None = None) -> None:
        self.open = 0
        """Waits going on now."""
        self.parent: Waits | None = None
        self.run = run
        self._since = 0.0
        self._total = 0.0

    def enter(self) -> None:
        """A wait begins."""
        self.open += 1
        if self.open == 1:
            self._since = monotonic()
            if self.parent is not None:
                self.parent.enter()
            elif self.run is not None:
                self.run.step_waits(True)

    def leave(self) -> None:
        """A wait ends."""
        self.open -= 1
        if self.open == 0:
            self._total += monotonic() - self._since
            if self.parent is not None:
                self.parent.leave()
            elif self.run is not None:
                self.run.step_waits(False)

    @property
    def seconds(self) -> float:
        """Seconds spent waiting, so far."""
        if self.open:
            return self._total + monotonic() - self._since
        return self._total
