"""`minions ...` with the time each event was stored (its commit) appended to the file named
by ``MINIONS_STAMPS``, as ``run_id seq unix_time`` lines: the service benchmark measures
delivery from there to the SSE client."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from minions.runs._store import Store

_write = Store.write
_lock = threading.Lock()
_file = open(os.environ["MINIONS_STAMPS"], "a", buffering=1)  # noqa: SIM115


def write(self: Store, run_id: str, events: Any, **kwargs: Any) -> None:
    _write(self, run_id, events, **kwargs)
    if events:
        now = time.time()
        with _lock:
            _file.write("".join(f"{run_id} {e['seq']} {now}\n" for e in events))


Store.write = write  # type: ignore[method-assign]

if __name__ == "__main__":
    from minions.cli import main

    sys.argv[0] = "minions"
    main()
