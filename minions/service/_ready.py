"""Whether a service process can serve now: its run store answers with the schema this
minions knows, and the worker in its process (if any) runs. What ``/health/ready`` and
``/health`` say, and what a worker's own probe says of it (`worker_problem`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from minions.errors import StoreError
from minions.runs import RunStore

if TYPE_CHECKING:
    from minions.runs import Worker

__all__: list[str] = []

READY_TIMEOUT: Final = 5.0
"""Seconds a readiness check waits for the store (a probe must answer before its own
timeout; a store slower than this is not ready)."""


def worker_problem(worker: Worker) -> str | None:
    """Why a worker does not take runs now, or ``None`` when it does (said to anyone: its
    state, not its error, which may name hosts)."""
    if worker.state == "running":
        return None
    return f"the worker in this process is {worker.state}"


async def store_problem(runs: RunStore) -> str | None:
    """Why the run store cannot be used now, or ``None`` when it can (said to anyone: no
    URL, host or driver message; the log has those)."""
    try:
        async with asyncio.timeout(READY_TIMEOUT):
            return await runs.check()
    except TimeoutError:
        return f"the run store did not answer within {READY_TIMEOUT:g} s"
    except StoreError:
        return "the run store cannot be reached"
    except Exception as exc:  # a store that answers nonsense is not usable either
        return f"the run store cannot be read ({type(exc).__name__})"


async def problem(runs: RunStore, worker: Worker | None) -> str | None:
    """Why this service process cannot serve now, or ``None`` when it can."""
    found = await store_problem(runs)
    if found is None and worker is not None:
        found = worker_problem(worker)
    return found
