"""`minions ...` with the time each event was stored (its commit) appended to the file named
by ``MINIONS_STAMPS``, as ``run_id seq unix_time`` lines: the service benchmark measures
delivery from there to the SSE client."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from minions.runs import _leases

_append = _leases.append
_lock = threading.Lock()
_file = open(os.environ["MINIONS_STAMPS"], "a", buffering=1)  # noqa: SIM115


def append(database: Any, lease: _leases.Lease, *, after: int, events: Any, **kwargs: Any) -> None:
    _append(database, lease, after=after, events=events, **kwargs)
    if events:
        now = time.time()
        with _lock:
            _file.write("".join(f"{lease.run_id} {e[0]} {now}\n" for e in events))


_leases.append = append

if __name__ == "__main__":
    from minions.cli import main

    sys.argv[0] = "minions"
    main()
