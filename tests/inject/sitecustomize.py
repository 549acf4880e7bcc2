"""Faults injected into `minions worker` processes of the tests, by environment variable (this
folder goes first on their PYTHONPATH; nothing here is part of minions).

- ``HOLD_BEFORE_CLAIM=FILE``: a run handed to the worker waits, before the worker claims it,
  while FILE exists (touching ``FILE.reached`` first): the worker holds the run in DBOS's
  queue without having claimed it.
"""

from __future__ import annotations

import os

if os.environ.get("HOLD_BEFORE_CLAIM"):
    import asyncio
    import pathlib
    import time
    from typing import Any

    from minions.runs import _runner

    _claim = _runner.DurableRunner._claim
    _hold = pathlib.Path(os.environ["HOLD_BEFORE_CLAIM"])

    def _wait() -> None:
        pathlib.Path(f"{_hold}.reached").touch()
        while _hold.exists():
            time.sleep(0.02)

    async def _held_claim(self: Any, run_id: str, attempt: int) -> Any:
        await asyncio.to_thread(_wait)
        return await _claim(self, run_id, attempt)

    _runner.DurableRunner._claim = _held_claim  # type: ignore[method-assign]
