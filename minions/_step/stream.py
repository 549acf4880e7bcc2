"""StepStream: one step run while the caller reads its events or its text as they come."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic

from minions._generic import OutputT
from minions._item import ItemId

if TYPE_CHECKING:
    from minions._emitter import EventEmitter
    from minions._step.execution import StepExecution
    from minions.events import Event

__all__ = ["StepStream"]


class StepStream(Generic[OutputT]):
    """A step running while you read what it does: its events (``async for event in
    stream``) or only the text the model writes (``async for text in stream.text()``).
    Made by `DefaultStep.stream` and `StepExecutor.stream`; the model streams its answers
    because you stream (`Prompt.stream`), whatever its own default.

    Use it as an async context manager: the step starts when the block (or the first read)
    starts; leaving the block before the step has ended cancels it, and waits for it to
    stop (its tool calls are cancelled, its conversation closed, nothing keeps running)::

        async with step.stream(model=model, inputs={"city": "Oslo"}) as stream:
            async for text in stream.text():
                print(text, end="")
        print(stream.execution.result())

    Text deltas come from every model call attempt: when an answer is retried (a transient
    error, or output re-asked), the deltas of the new attempt follow those of the one it
    replaces. A UI that must drop superseded text reads the events instead: each
    `TokenDelta` carries its `turn` and `attempt`, and a delta with a higher `attempt` for
    the same `turn` replaces what was shown for that turn.
    """

    def __init__(
        self,
        name: str,
        execute: Callable[[], Coroutine[Any, Any, StepExecution[OutputT]]],
        execution: Callable[[], StepExecution[OutputT]],
        events: EventEmitter,
    ) -> None:
        """Stream the step `name`: `execute` runs it (once, when the stream starts),
        `execution` reads its execution, and its events (its loop items' too) are read from
        `events`."""
        self._name = name
        self._execute = execute
        self._execution = execution
        self._emitter = events
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._task: asyncio.Task[StepExecution[OutputT]] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._events: AsyncGenerator[Event, None] | None = None

    @property
    def execution(self) -> StepExecution[OutputT]:
        """The step's execution: ended (COMPLETED or FAILED) once the stream has been read
        to the end or its block left; in progress before."""
        return self._execution()

    def _start(self) -> None:
        if self._task is not None:
            return
        # The listener and the callback hold the queue, not the stream: a stream nobody
        # holds any more is collected, and closing its generators cancels the step.
        queue = self._queue
        name = self._name
        items = ItemId(name).items_prefix

        def listen(event: Event) -> None:
            step_id = event.step_id
            if step_id is not None and (step_id == name or step_id.startswith(items)):
                queue.put_nowait(event)

        self._unsubscribe = self._emitter.subscribe(listen)
        self._task = asyncio.create_task(self._execute())
        self._task.add_done_callback(lambda _: queue.put_nowait(None))

    async def __aenter__(self) -> StepStream[OutputT]:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Event]:
        """The step's events as they happen (its loop items' too), ending with
        `StepCompleted` or `StepFailed`."""
        if self._events is None:
            self._events = self._generate()
        return self._events

    def text(self) -> AsyncIterator[str]:
        """The text the model writes, delta by delta, as it arrives (the `TokenDelta`
        events' text). Leaving the block after breaking out of the loop cancels the step."""
        return _Texts(aiter(self))

    async def aclose(self) -> None:
        """Stop reading; a step still running is cancelled, and this returns once it has
        stopped."""
        events, self._events = self._events, None
        if events is not None:
            await events.aclose()
        await self._stop()

    async def _generate(self) -> AsyncGenerator[Event, None]:
        self._start()
        task = self._task
        assert task is not None
        try:
            while True:
                event = await self._queue.get()
                if event is None:
                    break
                yield event
            task.result()  # a bug in the loop is raised here, not swallowed
        finally:
            await self._stop()

    async def _stop(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def __repr__(self) -> str:
        return f"StepStream({self.execution!r})"


class _Texts:
    """The text deltas of a stream's events. An iterator, not a generator: breaking out of
    a loop over it leaves nothing for the garbage collector to close (the stream's block does
    that, at once)."""

    def __init__(self, events: AsyncIterator[Event]) -> None:
        self._events = events

    def __aiter__(self) -> _Texts:
        return self

    async def __anext__(self) -> str:
        while True:
            event = await anext(self._events)
            if event.kind == "token_delta":
                return event.text
