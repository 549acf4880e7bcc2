"""Token deltas across processes: a worker's runs' deltas reach the followers of any process
of its store (the API processes of `minions serve --no-worker`, `minions runs events
--follow`), still never stored.

A worker's `DeltaPublisher` batches the deltas of the runs somebody follows (a short
interval's worth, or a few thousand characters, whichever comes first), merges those that
continue one another, and sends them as messages: on Postgres, NOTIFYs on ``minions_deltas``
(one statement per batch), on SQLite, whose processes share one host, writes to the FIFO of
each following process in the folder beside the database file. Deltas of a run nobody
follows cost nothing on the wire: they are not sent at all. Deltas are best effort, like a
live view: a batch that cannot be sent (the database away, a follower's FIFO full) is
dropped, and what the publisher holds is bounded.

Who follows: on SQLite, a follower's FIFO in the folder (one `stat` per delta tells whether
anyone follows). On Postgres, each process's `EventLog` tells the workers which runs it
follows, in notes on ``minions_follows`` (``ORIGIN +RUN -RUN ...``): when it starts to follow
a run, again every `REFRESH` seconds, and when it stops; a worker keeps what it hears for
`FOLLOW_TTL` seconds (a follower killed without a word costs a few more seconds of deltas), and
asks again (``?`` on ``minions_deltas``) each time its LISTEN connection (re)connects. The
notes reach a worker in milliseconds; meanwhile it keeps the last `KEPT` seconds of the deltas
of each run nobody follows, and sends them when the first follower comes: a follower gets
every delta from the moment it began following (and perhaps a little before).

A follower's `EventLog` reads them: on Postgres on its one LISTEN connection, on SQLite
through a FIFO of its own, open while the process follows a run (or serves);
`decode` reads a message (`DeltaMessage`).

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
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import sqlalchemy as sa
import structlog

from minions.events import TokenDelta
from minions.runs._db import Database, sqlalchemy_url, sqlite_path
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

FOLLOWS = "minions_follows"
"""Postgres: the channel of the notes in which followers tell workers which runs they follow."""
ASK = "?"
"""Sent on `CHANNEL` by a worker whose LISTEN connection (re)connects: the followers of every
process tell again which runs they follow."""
REFRESH = 10.0
"""Seconds between a process's notes of all the runs it follows (Postgres)."""
FOLLOW_TTL = 3 * REFRESH
"""Seconds a worker counts a process as following a run after its last note of it."""
KEPT = 2.0
"""Seconds of the deltas of a run nobody follows a publisher keeps (Postgres), and sends when
a first follower comes: what was streamed while that follower's note was on its way."""
KEPT_CHARS = 64_000
"""Characters of a run's deltas kept at most."""

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


def follow_notes(origin: str, follow: Iterable[str], leave: Iterable[str] = ()) -> list[str]:
    """The notes (``ORIGIN +RUN -RUN ...``, each at most `PG_MESSAGE` bytes) that say a
    process follows the runs of `follow` and no longer follows those of `leave`."""
    words = [f"+{run}" for run in sorted(follow)] + [f"-{run}" for run in sorted(leave)]
    notes: list[str] = []
    note, size = origin, len(origin.encode())
    for word in words:
        length = 1 + len(word.encode())
        if note != origin and size + length > PG_MESSAGE:
            notes.append(note)
            note, size = origin, len(origin.encode())
        note, size = f"{note} {word}", size + length
    if note != origin:
        notes.append(note)
    return notes


def announce(database: Database, notes: Sequence[str]) -> None:
    """Notify the follow `notes` on `FOLLOWS`, in one statement (Postgres)."""
    with database.statement() as db:
        db.execute(
            sa.text(
                "SELECT count(pg_notify(:channel, m)) FROM unnest(CAST(:notes AS text[])) AS m"
            ),
            {"channel": FOLLOWS, "notes": list(notes)},
        )


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
    store, batched, from a thread of its own that sleeps while no delta comes; the deltas of
    a run nobody follows are not sent.

    On Postgres it learns who follows from the notes its worker's LISTEN connection hears
    (`listening`, `greeting`: see `minions.runs._wake.Listener`); the notes of its own
    process's followers are not for it (they get its deltas through the `LiveHub`).

    Args:
        url: the store.
        origin: the name its messages carry (the `LiveHub` of its process, if any).
        interval: seconds a delta waits at most for others to go with it.
        batch_chars: characters that send a batch at once.
        clock: the monotonic clock of the follows' expiry and of what is kept.
    """

    def __init__(
        self,
        url: str,
        *,
        origin: str | None = None,
        interval: float = INTERVAL,
        batch_chars: int = BATCH_CHARS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.origin = origin or uuid.uuid4().hex[:12]
        self.interval = interval
        self.batch_chars = batch_chars
        self.clock = clock
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
        pg = postgres(url)
        self._fifos = None if pg else _FifoWriter(url)
        """On SQLite: who follows (nobody: deltas are dropped as they come, at no cost)."""
        self._send: Callable[[list[bytes]], None] = self._fifos or _Notifier(url)
        self._limit = PG_MESSAGE if pg else FIFO_MESSAGE
        self._follows: dict[str, dict[str, float]] = {}
        """On Postgres: the processes that follow each run, and until when (their notes)."""
        self._kept: dict[str, _Kept] = {}
        """On Postgres: the last deltas of each run nobody follows."""
        self._swept = 0.0
        self.listening: Mapping[str, Callable[[str], None]] = {FOLLOWS: self.heard} if pg else {}
        """The channels its worker's LISTEN connection hears for it, and what it does then."""
        self.greeting: tuple[tuple[str, str], ...] = ((CHANNEL, ASK),) if pg else ()
        """What that connection notifies each time it (re)connects: followers tell again."""

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
        """Hold `delta` for the next batch if somebody follows its run (any thread; never
        blocks on the store)."""
        if self._thread is None:
            return
        if self._fifos is not None:
            if not self._fifos.followers():
                return
            with self._ready:
                self._hold(delta)
            return
        with self._ready:
            now = self.clock()
            if self._followed(delta.run_id, now):
                self._hold(delta)
                return
            kept = self._kept.get(delta.run_id)
            if kept is None:
                self._sweep(now)
                kept = self._kept[delta.run_id] = _Kept()
            kept.add(now, delta)

    def heard(self, note: str) -> None:
        """A follow note (``ORIGIN +RUN -RUN ...``) from a process's followers (Postgres):
        the kept deltas of a run that has its first follower go on their way at once."""
        origin, *words = note.split()
        if origin == self.origin:
            return  # this process's followers: the hub tells them
        with self._ready:
            now = self.clock()
            for word in words:
                run_id = word[1:]
                if word.startswith("+"):
                    first = not self._followed(run_id, now)
                    self._follows.setdefault(run_id, {})[origin] = now + FOLLOW_TTL
                    kept = self._kept.pop(run_id, None)
                    if first and kept is not None:
                        for delta in kept.since(now - KEPT):
                            self._hold(delta)
                elif word.startswith("-"):
                    origins = self._follows.get(run_id)
                    if origins is not None:
                        origins.pop(origin, None)
                        if not origins:
                            del self._follows[run_id]
            self._sweep(now)

    def _followed(self, run_id: str, now: float) -> bool:
        origins = self._follows.get(run_id)
        if not origins:
            return False
        if any(until > now for until in origins.values()):
            return True
        del self._follows[run_id]  # its followers went quiet: gone
        return False

    def _sweep(self, now: float) -> None:
        """Forget the follows that ran out and the kept deltas that are too old (at most once
        a second)."""
        if now - self._swept < 1.0:
            return
        self._swept = now
        for run_id in [r for r, k in self._kept.items() if k.newest < now - KEPT]:
            del self._kept[run_id]
        for run_id, origins in list(self._follows.items()):
            for origin in [o for o, until in origins.items() if until <= now]:
                del origins[origin]
            if not origins:
                del self._follows[run_id]

    def _hold(self, delta: TokenDelta) -> None:
        """Hold `delta` for the next batch (`_ready` held)."""
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
                # What is kept for a follower yet to come is older than these events: a
                # follower that reads them would drop it.
                self._kept.pop(run_id, None)
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
                async with asyncio.timeout(DELTAS_FIRST):
                    await future
            except TimeoutError:
                return []  # the store holds that batch up: this commit does not wait for it
        messages = encode(self.origin, mine, self._limit)
        self.sent += len(messages)
        if self._fifos is None:
            return [m.decode().rstrip("\n") for m in messages]
        for path in self._fifos.followers():
            write_fifo(path, messages)
        return []


class _Kept:
    """The last deltas of a run nobody follows: `KEPT` seconds of them, `KEPT_CHARS` at
    most."""

    def __init__(self) -> None:
        self.deltas: deque[tuple[float, TokenDelta]] = deque()
        self.chars = 0
        self.newest = 0.0

    def add(self, now: float, delta: TokenDelta) -> None:
        self.deltas.append((now, delta))
        self.chars += len(delta.text)
        self.newest = now
        while self.deltas and (self.deltas[0][0] < now - KEPT or self.chars > KEPT_CHARS):
            self.chars -= len(self.deltas.popleft()[1].text)

    def since(self, moment: float) -> list[TokenDelta]:
        return [delta for at, delta in self.deltas if at >= moment]


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
