"""The one way the sync API runs the async one."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__: list[str] = []

T = TypeVar("T")


def run_sync(start: Callable[[], Coroutine[Any, Any, T]], *, name: str) -> T:
    """Run the coroutine `start()` makes to the end, in a new event loop.

    Inside a running event loop (a notebook cell, an async function) the new loop runs in a
    thread of its own, with the caller's context variables (``block_real_models()`` holds
    there too), while the caller's thread waits: the caller's loop is blocked meanwhile, so
    async code should ``await`` what `name` names.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(start())
    context = contextvars.copy_context()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(context.run(lambda: asyncio.run(start())))
        except BaseException as exc:  # handed to the caller's thread as it is
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"minions: {name}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
