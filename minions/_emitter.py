"""The emitter of a run's events, apart from the event types themselves (`minions.events`).

Building the event dataclasses is a fifth of ``import minions``; a run without listeners (and
without a configured structlog) never builds an event, so the step loop imports the types only
when it emits one, and this module keeps the emitter free of them.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Literal

from minions._log import configured_logger, loud_logger

if TYPE_CHECKING:
    from minions.events import Event, EventListener

__all__ = ["EventEmitter"]

CutShort = Literal["parked", "handed_back"]
"""Why a durable run's execution ends before the run does: it ``parked`` (a call waits for a
person's decision, holding no worker) or was ``handed_back`` (its worker drains); either way
the run goes on later, from its checkpoints."""

_QUIET = frozenset({"token_delta", "model_call_started", "tool_call_started"})

_ENCLOSING: contextvars.ContextVar[EventEmitter | None] = contextvars.ContextVar(
    "minions_enclosing_emitter", default=None
)
"""The emitter of the run whose task runs now (see `EventEmitter.context_for_inner_runs`)."""


class EventEmitter:
    """Numbers the events of one run and hands them to its listeners: 1, 2, 3... without a
    gap; a token delta carries the number of the event before it.

    Build an event without `run_id`, `seq` and `timestamp` and `emit` it: the emitter stamps
    those. Listeners are called in the order given; an exception in a listener is logged and
    does not stop the run or the other listeners. Where building an event costs something
    (one per token), check `active` first.
    """

    def __init__(self, run_id: str, listeners: Iterable[EventListener] = ()) -> None:
        self.run_id = run_id
        self._listeners: tuple[EventListener, ...] = tuple(listeners)
        self.last = 0
        """The number of the last event emitted (a token delta takes none of its own)."""
        self._silent: CutShort | None = None
        self._enclosing = _ENCLOSING.get()
        """The emitter of the run this one runs inside (a recipe step's inner run): silenced
        with it."""

    def continue_after(self, seq: int) -> None:
        """Number the next event `seq + 1`: a durable run that goes on after its stored
        events continues their numbering, so every event is numbered once, here."""
        self.last = seq

    @property
    def listeners(self) -> Sequence[EventListener]:
        """The listeners events are delivered to, in order."""
        return self._listeners

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add a listener for the events from now on (a stream of one step of the run);
        returns the function that removes it."""
        self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

        return unsubscribe

    def silence(self, why: CutShort) -> None:
        """Deliver and log nothing more, nor do the runs inside this one (see
        `context_for_inner_runs`): a durable run handed to another worker, or parked while a
        call waits for a person, whose cancelled steps would say things that are not so (that
        they failed, that the run failed). `why` is what its spans say instead."""
        self._silent = why

    @property
    def silenced(self) -> bool:
        """Whether it delivers and logs nothing more (it, or the run it runs inside, was
        silenced)."""
        return self._silent is not None or (
            self._enclosing is not None and self._enclosing.silenced
        )

    @property
    def cut_short(self) -> CutShort | None:
        """Why it was silenced (it, or the run it runs inside): the run's execution ends
        before the run does, and its work cancelled from now on did not fail."""
        if self._silent is not None or self._enclosing is None:
            return self._silent
        return self._enclosing.cut_short

    def context_for_inner_runs(self) -> contextvars.Context:
        """A copy of the current context in which emitters made later are silenced with
        this one: run the run's task in it, and the runs its recipe steps run inside it (each
        with an emitter of its own) fall silent when it does."""
        context = contextvars.copy_context()
        context.run(_ENCLOSING.set, self)
        return context

    @property
    def active(self) -> bool:
        """Whether anybody receives events (so building them is worth it)."""
        return not self.silenced and (bool(self._listeners) or configured_logger() is not None)

    def emit(self, event: Event) -> Event | None:
        """Stamp `event` with the run id, the next sequence number and the time, and deliver
        it. Returns the delivered event, or ``None`` when nobody listens."""
        logger = configured_logger()
        if self.silenced or (not self._listeners and logger is None):
            return None
        if event.kind != "token_delta":
            # A token delta is never stored (it is live text): it carries the number of the
            # event before it, so stored events are numbered without a gap.
            self.last += 1
        event = replace(event, run_id=self.run_id, seq=self.last, timestamp=time.time())
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                _report_listener_failure(listener, event)
        if logger is not None:
            data = asdict(event)
            kind = data.pop("kind")
            if kind in _QUIET:
                logger.debug(kind, **data)
            else:
                logger.info(kind, **data)
        return event


def _report_listener_failure(listener: EventListener, event: Event) -> None:
    # A broken listener must not go unnoticed, even when the application configured no
    # logging: then the report goes to stderr (the library never configures structlog).
    loud_logger().exception("event listener failed", listener=repr(listener), event_kind=event.kind)
