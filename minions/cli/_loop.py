"""How a command that runs work in the foreground (`minions run`, `minions eval run`) runs
it: on an event loop where Ctrl-C cancels the work and SIGTERM does the same, closed only
once the tool calls still running in threads end; and the exit codes such commands share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from rich.console import Console

__all__: list[str] = []

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
"""The run failed."""
EXIT_USAGE = 2
"""Bad usage, an invalid recipe or invalid inputs: nothing ran."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as shells report it)."""
EXIT_TERMINATED = 143
"""SIGTERM (128 + 15): `docker stop`, Kubernetes, a CI timeout. Handled like Ctrl-C."""


class Loop:
    """An asyncio runner whose SIGINT handler cancels the run on Ctrl-C; SIGTERM does the
    same (it is turned into a SIGINT), so a stopped container still ends its run cleanly."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.interrupted = False
        self.terminated = False

    def on_sigterm(self, signum: int, frame: object) -> None:
        self.terminated = True
        signal.raise_signal(signal.SIGINT)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T | None:
        """The coroutine's result, or ``None`` when Ctrl-C cancelled it."""
        try:
            return self.runner.run(coroutine)
        except (KeyboardInterrupt, asyncio.CancelledError):
            self.interrupted = True
            return None


@contextlib.contextmanager
def event_loop(err: Console) -> Iterator[Loop]:
    """A `Loop`, closed at the end.

    Closing waits for tool calls still running in threads (a thread cannot be cancelled):
    after a Ctrl-C, the user is told so, and a second Ctrl-C leaves at once.
    """
    loop = Loop()
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, loop.on_sigterm)
    try:
        yield loop
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        notice = threading.Timer(
            1.0,
            lambda: err.print(
                "waiting for tool calls still running in threads (Ctrl-C again to quit now)",
                style="yellow",
            ),
        )
        notice.daemon = True
        if loop.interrupted:
            notice.start()
        try:
            loop.runner.close()
        except KeyboardInterrupt:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        finally:
            notice.cancel()
