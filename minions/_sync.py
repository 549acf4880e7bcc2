"""The one way the sync API runs the async one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from minions.errors import MinionsError

__all__: list[str] = []

T = TypeVar("T")


def run_sync(start: Callable[[], Coroutine[Any, Any, T]], *, instead: str) -> T:
    """Run the coroutine `start()` makes to the end, in a new event loop.

    Raises:
        MinionsError: an event loop is already running in this thread (Jupyter, an async
            function); `instead` names what to await there.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(start())
    raise MinionsError(
        "cannot run synchronously inside a running event loop (Jupyter, an async function): "
        f"use `await {instead}` there instead"
    )
