"""Token deltas across processes: a worker's runs' deltas reach the followers of any process
of its store (the API processes of `minions serve --no-worker`, `minions runs events
--follow`), still never stored.

A worker's `DeltaPublisher` batches the deltas of all its runs (a short interval's worth, or
a few thousand characters, whichever comes first), merges those that continue one another,
and sends them as messages: on Postgres, NOTIFYs on ``minions_deltas`` (one statement per
batch; a notification nobody listens to is dropped by the server), on SQLite, whose processes
share one host, writes to the FIFO of each following process in the folder beside the
database file (none there: nothing is sent). Deltas are best effort, like a live view: a
batch that cannot be sent (the database away, a follower's FIFO full) is dropped, and what the
publisher holds is bounded.

A follower's process receives them in its `EventLog`: on Postgres on its one LISTEN
connection, on SQLite through a FIFO of its own (`FifoReader`), open while the process
follows a run (or serves); `decode` reads a message (`DeltaMessage`).

A message is one line: ``ORIGIN.NUMBER RUN_ID JSON``, the JSON a list of
``[seq, step_id, turn, attempt, timestamp, text]``; at most `PG_MESSAGE` bytes on Postgres
(a NOTIFY payload is under 8000) and `FIFO_MESSAGE` on SQLite (one atomic write of a pipe).
`ORIGIN` names the process's `LiveHub`: a service with a worker in its own process gets its
deltas through the hub, and drops its own messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import structlog

from minions.events import TokenDelta
from minions.runs._db import sqlalchemy_url, sqlite_path
from minions.runs._wake import write_fifo

__all__: list[str] = []

log = structlog.get_logger(__name__)

CHANNEL = "minions_deltas"
NOTIFY = "SELECT count(pg_notify(%s, m)) FROM unnest(%s::text[]) AS m"
"""Messages notified in one statement."""
PG_MESSAGE = 7900
"""Bytes of a NOTIFY payload at most (Postgres refuses 8000 and more)."""
FIFO_MESSAGE = min(select.PIPE_BUF, 4096)
"""Bytes of a FIFO message at most: a write of up to `PIPE_BUF` bytes is never interleaved
with another writer's."""
INTERVAL = 0.05
"""Seconds a delta waits at most for others to go with it."""
BATCH_CHARS = 4000
"""Characters of text that send a batch at once, before its interval is over."""
MAX_HELD = 1_000_000
"""Characters of text a publisher holds at most (a batch it cannot send in time is cut)."""
DELTAS_FIRST = 1.0
"""Seconds a commit of a run's events waits at most for a batch of its deltas on its way."""
RECONNECT = 1.0
"""Seconds between a publisher's tries to reach a Postgres that went away."""
LOOK = 1.0
"""Seconds a publisher on SQLite trusts its last listing of the followers' FIFOs (sooner
when their folder changed)."""

_Key = tuple[str, int, str | None, int, int]
"""What deltas that continue one another share: run, seq, step, turn, attempt."""


def streams_folder(url: str) -> Path | None:
    """Where the FIFOs of a SQLite store's followers are (None: not a SQLite file)."""
    path = sqlite_path(url)
    if path is None or str(path) in ("", ":memory:"):
        return None
    return path.with_name(path.name + ".streams")


def postgres(url: str) -> bool:
    return url.startswith(("postgresql", "postgres:"))


# -- messages ------------------------------------------------------------------------------------


def merged(deltas: Iterable[TokenDelta]) -> list[TokenDelta]:
    """`deltas` with each run of those that continue one another (one model call's attempt,
    in a row) as one delta: the first one's time, their texts joined."""
    out: list[TokenDelta] = []
    texts: list[list[str]] = []
    for delta in deltas:
        last = out[-1] if out else None
        if last is not None and _key(last) == _key(delta):
            texts[-1].append(delta.text)
            continue
        out.append(delta)
        texts.append([delta.text])
    return [
        d if len(t) == 1 else dataclasses.replace(d, text="".join(t))
        for d, t in zip(out, texts, strict=True)
    ]


def _key(delta: TokenDelta) -> _Key:
    return (delta.run_id, delta.seq, delta.step_id, delta.turn, delta.attempt)


def encode(origin: str, deltas: Iterable[TokenDelta], limit: int, *, first: int = 0) -> list[bytes]:
    """The messages that carry `deltas` (merged), each at most `limit` bytes, numbered from
    `first` (Postgres delivers one of two equal payloads of a transaction); a text too long
    for one message is cut into several deltas."""
    by_run: dict[str, list[list[object]]] = {}
    for delta in merged(deltas):
        by_run.setdefault(delta.run_id, []).append(
            [delta.seq, delta.step_id, delta.turn, delta.attempt, delta.timestamp, delta.text]
        )
    bodies: list[tuple[str, list[bytes]]] = []
    for run_id, entries in by_run.items():
        # The head's number is written with at most 20 digits.
        room = limit - len(f"{origin}.{'0' * 20} {run_id} ".encode()) - 3  # [] and the end
        batch: list[bytes] = []
        size = 0
        for entry in entries:
            for piece in _fitted(entry, room):
                if batch and size + 1 + len(piece) > room:
                    bodies.append((run_id, batch))
                    batch, size = [], 0
                batch.append(piece)
                size += len(piece) + (1 if len(batch) > 1 else 0)
        if batch:
            bodies.append((run_id, batch))
    return [
        f"{origin}.{first + n} {run_id} ".encode() + b"[" + b",".join(batch) + b"]\n"
        for n, (run_id, batch) in enumerate(bodies)
    ]


def _fitted(entry: list[object], room: int) -> Iterator[bytes]:
    """One entry as JSON, or several (its text cut) when it does not fit in `room` bytes."""
    encoded = json.dumps(entry, separators=(",", ":")).encode()
    text = entry[-1]
    assert isinstance(text, str)
    if len(encoded) <= room or len(text) < 2:
        if len(encoded) <= room:
            yield encoded
        return  # a step id too long for any message: nobody can be told this delta
    middle = len(text) // 2
    yield from _fitted([*entry[:-1], text[:middle]], room)
    yield from _fitted([*entry[:-1], text[middle:]], room)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeltaMessage:
    """A message as received."""

    origin: str
    """The `LiveHub` of the process that sent it."""
    run_id: str
    deltas: list[TokenDelta]


def decode(message: str) -> DeltaMessage | None:
    """A message's origin, run and deltas (None: not a message of this format)."""
    origin, _, rest = message.partition(" ")
    origin = origin.partition(".")[0]
    run_id, _, data = rest.partition(" ")
    try:
        entries = json.loads(data)
        if not isinstance(entries, list):
            return None
        deltas = [
            TokenDelta(
                run_id=run_id,
                seq=int(seq),
                step_id=None if step_id is None else str(step_id),
                turn=int(turn),
                attempt=int(attempt),
                timestamp=float(timestamp),
                text=str(text),
            )
            for seq, step_id, turn, attempt, timestamp, text in entries
        ]
    except (ValueError, TypeError):
        return None
    return DeltaMessage(origin=origin, run_id=run_id, deltas=deltas)


# -- the publisher (a worker) --------------------------------------------------------------------


class DeltaPublisher:
    """Sends the token deltas of a worker's runs to the followers of every process of its
    store, batched, from a thread of its own that sleeps while no delta comes.

    Args:
        url: the store.
        origin: the name its messages carry (the `LiveHub` of its process, if any).
        interval: seconds a delta waits at most for others to go with it.
        batch_chars: characters that send a batch at once.
    """

    def __init__(
        self,
        url: str,
        *,
        origin: str | None = None,
        interval: float = INTERVAL,
        batch_chars: int = BATCH_CHARS,
    ) -> None:
        self.url = url
        self.origin = origin or uuid.uuid4().hex[:12]
        self.interval = interval
        self.batch_chars = batch_chars
        self.sent = 0
        """Messages sent."""
        self.batches = 0
        """Batches sent (on Postgres, one statement each)."""
        self.dropped = 0
        """Deltas dropped: held past `MAX_HELD`, or their batch could not be sent."""
        self._held: list[TokenDelta] = []
        self._chars = 0
        self._since = 0.0
        self._ready = threading.Condition()
        self._stopping = False
        self._sending: set[str] = set()
        """The runs of the batch on its way now."""
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        """Commits waiting for the batch on its way (`before_commit`)."""
        self._thread: threading.Thread | None = None
        self._fifos = None if postgres(url) else _FifoWriter(url)
        """On SQLite: who follows (nobody: deltas are dropped as they come, at no cost)."""
        self._send: Callable[[list[bytes]], None] = self._fifos or _Notifier(url)
        self._limit = PG_MESSAGE if postgres(url) else FIFO_MESSAGE

    def start(self) -> None:
        if streams_folder(self.url) is None and not postgres(self.url):
            return  # an in-memory store: no other process can follow it
        self._thread = threading.Thread(target=self._loop, name="minions-deltas", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Send what is held, and stop."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
        closing = getattr(self._send, "close", None)
        if closing is not None:
            closing()

    def publish(self, delta: TokenDelta) -> None:
        """Hold `delta` for the next batch (any thread; never blocks on the store)."""
        if self._thread is None or (self._fifos is not None and not self._fifos.followers()):
            return
        with self._ready:
            if self._chars + len(delta.text) > MAX_HELD:
                self.dropped += 1
                return
            if not self._held:
                self._since = time.monotonic()
            self._held.append(delta)
            self._chars += len(delta.text)
            if len(self._held) == 1 or self._chars >= self.batch_chars:
                self._ready.notify()

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._held and not self._stopping:
                    self._ready.wait()
                while not self._stopping and self._chars < self.batch_chars:
                    left = self._since + self.interval - time.monotonic()
                    if left <= 0:
                        break
                    self._ready.wait(left)
                batch, self._held, self._chars = self._held, [], 0
                self._sending = {d.run_id for d in batch}
                stopping = self._stopping
            if batch:
                messages = encode(self.origin, batch, self._limit)
                try:
                    self._send(messages)
                    self.sent += len(messages)
                    self.batches += 1
                except Exception as exc:  # best effort: the next batch tries again
                    self.dropped += len(batch)
                    log.debug("token deltas not sent", error=str(exc))
            with self._ready:
                self._sending = set()
                waiting, self._waiters = self._waiters, []
            for loop, future in waiting:
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                    loop.call_soon_threadsafe(_resolve, future)
            if stopping:
                return

    async def before_commit(self, run_id: str) -> list[str]:
        """The run's deltas held now, taken out of the next batch to go before the commit
        of the run's events after them, so that a follower of any process reads them in
        their place: on SQLite written to the followers' FIFOs now (nothing returned), on
        Postgres returned as the payloads the commit notifies (in its own transaction, so
        nothing is added to the store's load). A batch of the run's on its way is waited
        for first (a second at most)."""
        while True:
            with self._ready:
                if run_id not in self._sending:
                    mine = [d for d in self._held if d.run_id == run_id]
                    if not mine:
                        return []
                    self._held = [d for d in self._held if d.run_id != run_id]
                    self._chars -= sum(len(d.text) for d in mine)
                    break
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._waiters.append((loop, future))
            try:
                await asyncio.wait_for(future, DELTAS_FIRST)
            except TimeoutError:
                return []  # the store holds that batch up: this commit does not wait for it
        messages = encode(self.origin, mine, self._limit)
        self.sent += len(messages)
        if self._fifos is None:
            return [m.decode().rstrip("\n") for m in messages]
        for path in self._fifos.followers():
            write_fifo(path, messages)
        return []


class _Notifier:
    """Postgres: one NOTIFY per message, a batch in one statement, over a connection of its
    own (opened when first needed, again a while after it failed)."""

    def __init__(self, url: str) -> None:
        self.url = sqlalchemy_url(url).replace("postgresql+psycopg://", "postgresql://")
        self._connection: object | None = None
        self._failed_at = -RECONNECT

    def __call__(self, messages: list[bytes]) -> None:
        import psycopg

        connection = self._connection
        if connection is None:
            if time.monotonic() - self._failed_at < RECONNECT:
                raise ConnectionError("the store was away a moment ago")
            try:
                connection = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
            except Exception:
                self._failed_at = time.monotonic()
                raise
            self._connection = connection
        assert isinstance(connection, psycopg.Connection)
        try:
            connection.execute(NOTIFY, (CHANNEL, [m.decode().rstrip("\n") for m in messages]))
        except Exception:
            self.close()
            self._failed_at = time.monotonic()
            raise

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()  # type: ignore[attr-defined]


class _FifoWriter:
    """SQLite: each message written to the FIFO of each follower in the streams folder; a
    FIFO nobody reads (its process died) is removed."""

    def __init__(self, url: str) -> None:
        self.folder = streams_folder(url)
        self._fifos: list[Path] = []
        self._seen: tuple[int, float] = (-1, -LOOK)

    def followers(self) -> list[Path]:
        """The followers' FIFOs: listed again when the folder changed (a follower came or
        went), or a `LOOK` after the last listing; one `stat` otherwise."""
        folder = self.folder
        if folder is None:
            return []
        try:
            changed = os.stat(folder).st_mtime_ns
        except OSError:
            return []  # nobody ever followed: no folder
        now = time.monotonic()
        if changed != self._seen[0] or now - self._seen[1] >= LOOK:
            self._seen = (changed, now)
            self._fifos = sorted(folder.glob("*.fifo"))
        return self._fifos

    def __call__(self, messages: list[bytes]) -> None:
        for path in self.followers():
            write_fifo(path, messages)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- the receiver (a follower's process) ---------------------------------------------------------


class FifoReader:
    """A follower process's FIFO in a SQLite store's streams folder: its whole lines, as they
    come (`read`, when its descriptor is readable: `descriptor`)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(mode=0o700, exist_ok=True)
        name = uuid.uuid4().hex
        making = folder / f"{name}.new"
        os.mkfifo(making, 0o600)
        # Opened before it has its name: a publisher never finds it without a reader (and
        # removes it as a dead follower's); and with a writer of its own, or its reader
        # would see end-of-file again and again while no publisher writes.
        self.descriptor = os.open(making, os.O_RDONLY | os.O_NONBLOCK)
        self._writer = os.open(making, os.O_WRONLY | os.O_NONBLOCK)
        self.path = folder / f"{name}.fifo"
        os.replace(making, self.path)
        self._partial = b""

    def read(self) -> list[str]:
        """The whole messages readable now."""
        chunks = [self._partial]
        while True:
            try:
                data = os.read(self.descriptor, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data)
            if len(data) < 65536:
                break
        lines = b"".join(chunks).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > FIFO_MESSAGE:
            self._partial = b""  # never a message of ours
        return [line.decode("utf-8", "replace") for line in lines if line]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        for descriptor in (self.descriptor, self._writer):
            with contextlib.suppress(OSError):
                os.close(descriptor)
