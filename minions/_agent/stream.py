"""RunStream: the events of one run as an async iterator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

from minions._step.result import AgentResult
from minions.events import Event, EventListener

__all__ = ["RunStream"]


class RunStream:
    """The events of one run, as an async iterator; `result` is set once it has ended."""

    def __init__(self, start: Callable[[EventListener], Coroutine[Any, Any, AgentResult]]) -> None:
        self._start = start
        self._events: AsyncGenerator[Event, None] | None = None
        self.result: AgentResult | None = None
        """The run's result, once the last event has been read."""

    def __aiter__(self) -> AsyncIterator[Event]:
        if self._events is None:
            self._events = self._generate()
        return self._events

    async def aclose(self) -> None:
        """Stop reading; a run still going is cancelled."""
        if self._events is not None:
            await self._events.aclose()

    async def __aenter__(self) -> RunStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _generate(self) -> AsyncGenerator[Event, None]:
        # `None` marks the end of the run: no event is ever `None`.
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        task = asyncio.create_task(self._start(queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while True:
                event = await queue.get()
                if event is None:
                    break
                yield event
            self.result = task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
