"""A stdio MCP server's stderr, summarised: counted, its last lines kept, never copied line by
line onto ours.

Servers log there as they please (a `rich` box for every failed call, 31 validation errors per
connection from a server on an older SDK that meets a newer client); what the user needs is a
summary when the connection closes and the last lines when the server fails to start or dies.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from typing import Final, TextIO, cast

__all__: list[str] = []

KEEP_LINES: Final = 20
"""How many of the last lines are kept."""
DRAIN_SECONDS: Final = 2.0
"""How long a failed connection waits for the rest of the server's stderr (a grandchild that
keeps the pipe open must not hold the error back)."""
MAX_LINE: Final = 500
"""Characters kept of each line (a line without an end is read in pieces of this size)."""


class StderrTail:
    """A pipe for a child's stderr, drained by a thread of its own.

    Give `file` to the child (``errlog=``), call `release` once it started (so that the end of
    the child is the end of the pipe), and read `lines` and `last` at any time.
    """

    def __init__(self, server: str) -> None:
        read_end, write_end = os.pipe()
        self.file = cast("TextIO", os.fdopen(write_end, "w"))
        self.lines = 0
        """Lines the server wrote so far."""
        self._last: deque[str] = deque(maxlen=KEEP_LINES)
        self._lock = threading.Lock()
        self._reader = os.fdopen(read_end, "rb")
        self._thread = threading.Thread(
            target=self._drain, name=f"mcp server {server} stderr", daemon=True
        )
        self._thread.start()

    def _drain(self) -> None:
        with self._reader:
            while True:
                raw = self._reader.readline(MAX_LINE * 4)
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").rstrip()
                with self._lock:
                    self.lines += 1
                    if line.strip():
                        self._last.append(line[:MAX_LINE])

    def release(self) -> None:
        """Close this process's end of the pipe (the child has its own): idempotent."""
        if not self.file.closed:
            self.file.close()

    async def drained(self) -> None:
        """Release the pipe and wait (at most `DRAIN_SECONDS`) for the thread to read what is
        left: after the child ended, its last words (a traceback) are read by then."""
        self.release()
        await asyncio.to_thread(self._thread.join, DRAIN_SECONDS)

    def last(self, count: int = 5) -> list[str]:
        """The last `count` lines that were not blank."""
        with self._lock:
            return list(self._last)[-count:]

    def said(self, count: int = 3) -> str:
        """The last lines on one line, for an error message: ``' (its stderr ended with: ...)'``,
        or nothing when the server said nothing."""
        last = self.last(count)
        if not last:
            return ""
        return f" (its stderr ended with: {' | '.join(line.strip() for line in last)})"
