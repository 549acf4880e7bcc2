"""`minions ARGS...` with every SQL statement its database engines send counted (SQLAlchemy's
`before_cursor_execute`, DBOS's and minions' engines alike); SIGUSR1 writes the count so far
to the file $MINIONS_BENCH_COUNT. Used by `idle.py`."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

_count = 0
_lock = threading.Lock()


@event.listens_for(Engine, "before_cursor_execute")
def _counted(*_: Any) -> None:
    global _count
    with _lock:
        _count += 1


def _write(*_: Any) -> None:
    Path(os.environ["MINIONS_BENCH_COUNT"]).write_text(str(_count))


signal.signal(signal.SIGUSR1, _write)

from minions.cli import main  # noqa: E402

sys.argv = ["minions", *sys.argv[1:]]
main()
