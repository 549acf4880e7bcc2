"""The HTTP connections of `minions serve`: uvicorn's h11 protocol with the two bounds it
lacks. uvicorn times out a connection that is silent between requests (keep-alive), never
one that sends a request's head slowly (or sends part of it and stops): such connections
were held forever, until the process ran out of descriptors. Here a request's head must
arrive whole within a deadline, and connections beyond a cap are closed as they come, so
that descriptors stay for the database and the worker's runs."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__: list[str] = []

RESERVED_DESCRIPTORS = 256
"""Descriptors kept for the rest of the process (the database, the worker's runs, their MCP
servers and model connections, logs) when the connection cap is fitted to the limit."""


def bounded_protocol(*, head_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head is not whole within
    `head_timeout` seconds (from its start, or from the previous response's end), and any
    connection over `max_connections`."""

    class BoundedProtocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()  # over the cap: it costs one descriptor, for no time
                return
            self._await_head()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:
                self._head_came()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():
                self._await_head()  # the next request's head, if the client sends one

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_came()
            super().connection_lost(exc)

        def _await_head(self) -> None:
            self._head_came()
            self.head_timer = self.loop.call_later(head_timeout, self._head_too_slow)

        def _head_came(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_too_slow(self) -> None:
            self.head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return BoundedProtocol


def connection_cap(wanted: int) -> int:
    """`wanted`, or fewer when the process's descriptor limit would not hold them besides
    `RESERVED_DESCRIPTORS` (the soft limit is raised towards the hard one first)."""
    try:
        import resource
    except ImportError:  # not on POSIX: no limit to fit
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + RESERVED_DESCRIPTORS
    if soft == resource.RLIM_INFINITY:
        return wanted
    if soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    return max(16, min(wanted, soft - RESERVED_DESCRIPTORS))
