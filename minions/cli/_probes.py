"""What a worker serves over HTTP beside its work (``minions worker --metrics-port``,
``--health-port``): its process's Prometheus metrics, and its probes: ``/health/live`` (the
process answers) and ``/health/ready`` (its run store answers with the schema this minions
knows and its loop takes runs; 503 with the reason otherwise). A small threaded server of the
standard library, each request in a thread of its own: a slow store never blocks the worker."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__: list[str] = []

Answer = tuple[int, str, bytes]
"""Status, content type, body."""
Route = Callable[[], Answer]


def probe(problem: Callable[[], str | None]) -> Route:
    """A probe route: 200 ``{"status": "ok"}``, or 503 with the reason `problem` gives."""

    def answer() -> Answer:
        try:
            why = problem()
        except Exception as exc:  # a probe that fails says so: not ready
            why = f"the readiness check failed ({type(exc).__name__})"
        body = {"status": "ok" if why is None else "unavailable", "reason": why}
        return 200 if why is None else 503, "application/json", json.dumps(body).encode()

    return answer


class ProbeServer:
    """Serves `routes` (path to answer) on `host`:`port` in a thread, until `close`.

    Raises:
        OSError: the address cannot be bound (taken, or not this machine's).
    """

    def __init__(self, host: str, port: int, routes: dict[str, Route]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, kind, body = 404, "application/json", b'{"detail": "not found"}'
                else:
                    status, kind, body = route()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # a scrape every few seconds is no news

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="minions-probes", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
