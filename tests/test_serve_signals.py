"""`minions serve` stops on SIGTERM or SIGINT and its worker drains; a second signal cuts the
drain short. uvicorn puts back, as it stops, the handlers it found when it started: with the
default ones there, a second signal between the server's stop and the drain killed the
process (exit -15, `test_a_second_signal_cuts_serve_s_drain_short` once in a loaded run)."""

from __future__ import annotations

import signal
from typing import Any

import uvicorn

from minions.service._serve import serve_then_drain


class Server(uvicorn.Server):
    """Starts and stops as uvicorn does with the signals (its `capture_signals`), serving
    nothing; records the SIGTERM handler left once it has stopped."""

    def __init__(self) -> None:
        super().__init__(uvicorn.Config(app=lambda *_: None))
        self.left: Any = None
        self.exits: list[int] = []

    def run(self, sockets: Any = None) -> None:
        with self.capture_signals():
            pass
        self.left = signal.getsignal(signal.SIGTERM)

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.exits.append(sig)


def test_a_signal_after_the_server_stopped_reaches_the_drain_not_the_default() -> None:
    before = signal.getsignal(signal.SIGTERM)
    server = Server()
    drained: list[bool] = []

    def drain() -> None:
        signal.raise_signal(signal.SIGTERM)  # a second signal, while the worker drains
        drained.append(True)

    serve_then_drain(server, drain)
    assert server.left == server.handle_exit  # not the default handler, which kills
    assert drained == [True]
    assert server.exits == [signal.SIGTERM]  # it cut the drain short (handle_exit)
    assert signal.getsignal(signal.SIGTERM) == before  # put back as it was
