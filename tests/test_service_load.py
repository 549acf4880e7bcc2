"""`minions serve` under hostile clients, bounded in count (a few hundred connections, on
127.0.0.1): connections that never finish their request are closed, event-stream clients
that vanish (at once, or right after connecting) release everything they held, connections
over the cap are refused while the in-process worker goes on with its runs; afterwards the
server's descriptors and memory are back where they were, and its streams' readers and
subscriptions are 0."""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from runs_helpers import ledger_lines
from service_helpers import (
    TOKEN,
    ServerProcess,
    auth,
    read_stream,
    server,
    submit,
    write_recipes,
)

pytestmark = pytest.mark.slow

SLOW = 300
STREAMS = 300
PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
"""A request's head that never ends."""


def descriptors(process: ServerProcess) -> int:
    """The server's open descriptors but its database files (the store's pool of
    connections grows with the load, up to its size: it is not a leak)."""
    folder = Path(f"/proc/{process.process.pid}/fd")
    count = 0
    for entry in folder.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue  # closed meanwhile
        count += "minions.db" not in target
    return count


def memory(process: ServerProcess) -> int:
    """The server's resident memory, in KiB."""
    for line in Path(f"/proc/{process.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def until(condition: Any, what: str, within: float = 60) -> None:
    """Poll `condition` (a state only the server can tell) until it holds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.05)


def health(process: ServerProcess) -> dict[str, Any]:
    answer = httpx2.get(process.base + "/health", timeout=30)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def answering(process: ServerProcess) -> bool:
    try:
        return httpx2.get(process.base + "/health", timeout=30).status_code == 200
    except httpx2.TransportError:
        return False


def idle(process: ServerProcess) -> bool:
    streams = health(process)["streams"]
    return all(streams[key] == 0 for key in ("open", "runs_followed", "live_subscriptions"))


def closed_by_server(
    sockets: list[socket.socket], within: float, enough: int | None = None
) -> list[socket.socket]:
    """The sockets the server closes within `within` seconds (read to their end), or the
    first `enough` of them."""
    selector = selectors.DefaultSelector()
    for each in sockets:
        each.setblocking(False)
        selector.register(each, selectors.EVENT_READ)
    ended: list[socket.socket] = []
    deadline = time.monotonic() + within
    wanted = len(sockets) if enough is None else enough
    while len(ended) < wanted and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
            connection = key.fileobj
            assert isinstance(connection, socket.socket)
            try:
                data = connection.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                selector.unregister(connection)
                ended.append(connection)
    selector.close()
    return ended


def partial_requests(port: int, count: int) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port), timeout=30)
        connection.sendall(PARTIAL)
        opened.append(connection)
    return opened


def stream_request(run_id: str) -> bytes:
    return (
        f"GET /runs/{run_id}/events/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n"
    ).encode()


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    return write_recipes(tmp_path / "recipes")


@pytest.fixture
def service(tmp_path: Path, recipes: Path) -> Iterator[ServerProcess]:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with server(
        tmp_path,
        url,
        "--recipes",
        str(recipes),
        "--request-timeout",
        "2",
        LEDGER=str(tmp_path / "ledger.txt"),
    ) as process:
        yield process


def test_slow_and_vanishing_clients_cost_nothing_once_gone(
    service: ServerProcess, tmp_path: Path
) -> None:
    client = httpx2.Client(base_url=service.base, headers=auth(), timeout=60)
    # Warm up (the database's connections, a stream), then take the baseline.
    warm = submit(client, "ledger", tag="warm")
    with client.stream("GET", f"/runs/{warm}/events/stream") as response:
        read_stream(response)
    until(lambda: idle(service), "the warm-up stream released")
    fds, rss = descriptors(service), memory(service)

    # A body that comes too slowly is refused.
    with socket.create_connection(("127.0.0.1", service.port), timeout=60) as slow_body:
        slow_body.sendall(
            f"POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
        )
        assert slow_body.recv(4096).startswith(b"HTTP/1.1 408 ")

    waiting = submit(client, "release")  # a run whose stream stays open: it waits for a person
    meanwhile = submit(client, "slow", tag="meanwhile")
    slow = partial_requests(service.port, SLOW)
    assert health(service)["status"] == "ok"  # answered while they hang

    # Stream clients: half read the stream's start, then all of them vanish at once; the
    # other half vanish right after sending their request.
    readers = []
    for _ in range(STREAMS // 2):
        reader = socket.create_connection(("127.0.0.1", service.port), timeout=30)
        reader.sendall(stream_request(waiting))
        received = b""
        while b"retry: 1000" not in received:
            received += reader.recv(4096)
        readers.append(reader)
    streams = health(service)["streams"]
    assert streams["open"] == STREAMS // 2
    assert streams["runs_followed"] == 1  # one reader of the run serves them all
    for reader in readers:
        reader.close()
    for _ in range(STREAMS // 2):
        with socket.create_connection(("127.0.0.1", service.port), timeout=30) as quitter:
            quitter.sendall(stream_request(waiting))

    # The slow ones are closed by the server; the streams released everything.
    assert len(closed_by_server(slow, within=60)) == SLOW
    for each in slow:
        each.close()
    until(lambda: idle(service), "every stream released")
    until(lambda: descriptors(service) <= fds, f"descriptors back to {fds}")
    assert memory(service) < rss + 64 * 1024

    # The run submitted meanwhile completed.
    with client.stream("GET", f"/runs/{meanwhile}/events/stream") as response:
        assert read_stream(response)[-1]["event"] == "run_completed"
    assert client.get(f"/runs/{meanwhile}").json()["status"] == "completed"
    client.close()


def test_connections_over_the_cap_are_refused_while_the_worker_goes_on(
    tmp_path: Path, recipes: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    ledger = tmp_path / "ledger.txt"
    cap = 20
    with server(
        tmp_path,
        url,
        "--recipes",
        str(recipes),
        "--max-connections",
        str(cap),
        "--request-timeout",
        "60",
        LEDGER=str(ledger),
    ) as service:
        with httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client:
            submit(client, "slow", tag="saturated")
        held = partial_requests(service.port, 2 * cap)
        # Those over the cap are closed at once; those under it wait for their head (60 s).
        closed = closed_by_server(held, within=30, enough=cap)
        assert len(closed) == cap
        waiting = [each for each in held if each not in closed]
        with pytest.raises(BlockingIOError):
            waiting[0].recv(1)
        # The worker in the same process goes on with its run all the while.
        until(
            lambda: (
                [s for r, s, _ in ledger_lines(ledger) if r == "saturated"]
                == ["one", "two", "three", "four", "five"]
            ),
            "the run's five steps, while the API is saturated",
        )
        for each in held:
            each.close()
        until(lambda: answering(service), "answering again")
