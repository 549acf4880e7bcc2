"""What wakes an idle worker, so that it need not poll its store: a run queued (or queued
again) and a schedule changed. On Postgres, a NOTIFY on ``minions_wake`` sent in the
transaction that queues the run (delivered at its commit, to every worker on any host); on
SQLite, whose workers share one host, a byte written to each worker's FIFO in the folder
beside the database file. A worker still looks now and then by itself, in case a wake was
missed (a LISTEN connection that was down, a submitter of an older minions).

On SQLite the byte is written while the queuing transaction still holds the database's
write lock: the woken worker's dequeue (an IMMEDIATE transaction) waits for its commit, and
so sees the run."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import sqlalchemy as sa
import structlog

from minions.runs._db import Database, sqlalchemy_url, sqlite_path

__all__: list[str] = []

log = structlog.get_logger(__name__)

CHANNEL = "minions_wake"
Wake = Literal["queue", "schedules"]
_BYTES: dict[Wake, bytes] = {"queue": b"q", "schedules": b"s"}


def wake_folder(url: str) -> Path | None:
    """Where the FIFOs of a SQLite store's workers are (None: not a SQLite file)."""
    path = sqlite_path(url)
    if path is None or str(path) in ("", ":memory:"):
        return None
    return path.with_name(path.name + ".wake")


def wake_in(db: sa.Connection, url: str, what: Wake) -> None:
    """Wake the store's workers about `what`, in the caller's transaction `db` (Postgres: at
    its commit; SQLite: now, the write lock held)."""
    if db.dialect.name == "postgresql":
        db.execute(sa.text("SELECT pg_notify(:channel, :what)"), {"channel": CHANNEL, "what": what})
    else:
        poke(url, what)


def wake(database: Database, what: Wake) -> None:
    """Wake the store's workers about something committed."""
    if wake_folder(database.url) is not None:
        poke(database.url, what)
        return
    with database.begin() as db:
        wake_in(db, database.url, what)


def poke(url: str, what: Wake) -> None:
    """Write `what` to the FIFO of each worker of a SQLite store; a FIFO nobody reads (its
    worker died) is removed."""
    folder = wake_folder(url)
    if folder is None or not folder.is_dir():
        return
    for path in folder.glob("*.fifo"):
        write_fifo(path, [_BYTES[what]])


def write_fifo(path: Path, messages: list[bytes]) -> None:
    """Write `messages` to a reader's FIFO, each at once or not at all (a reader that is
    behind: the rest is dropped); a FIFO without a reader (its process died) is removed."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader: its process is gone
            with contextlib.suppress(OSError):
                path.unlink()
        return
    try:
        for message in messages:
            os.write(descriptor, message)
    except OSError:
        pass  # full (its reader has enough to read already) or gone
    finally:
        os.close(descriptor)


class Listener:
    """Tells a worker what woke it (`on_wake`, from a thread of its own) until stopped.

    Args:
        url: the store.
        on_wake: called with what woke the worker; with both kinds when it (re)connects
            (what was committed while nobody listened).
        heard: on Postgres, more channels the same connection listens to, and what is
            called (in its thread) with each of their payloads.
        greeting: on Postgres, ``(channel, payload)`` notified each time it (re)connects,
            once it listens.
    """

    def __init__(
        self,
        url: str,
        on_wake: Callable[[Wake], None],
        *,
        heard: Mapping[str, Callable[[str], None]] | None = None,
        greeting: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.url = url
        self.on_wake = on_wake
        self.heard = dict(heard or {})
        self.greeting = tuple(greeting)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fifo: Path | None = None
        self._descriptors: tuple[int, int] | None = None

    def start(self) -> None:
        folder = wake_folder(self.url)
        if folder is not None:
            self._open_fifo(folder)
            target = self._read_fifo
        elif self.url.startswith(("postgresql", "postgres:")):
            target = self._listen
        else:
            return
        self._thread = threading.Thread(target=target, name="minions-wake", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._descriptors is not None:
            with contextlib.suppress(OSError):
                os.write(self._descriptors[1], b"x")  # unblocks its read
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._descriptors is not None:
            for descriptor in self._descriptors:
                with contextlib.suppress(OSError):
                    os.close(descriptor)
            self._descriptors = None
        if self._fifo is not None:
            with contextlib.suppress(OSError):
                self._fifo.unlink()

    # -- SQLite: a FIFO ----------------------------------------------------------------------

    def _open_fifo(self, folder: Path) -> None:
        """Made under a temporary name and opened before it is given its own: a submitter
        never finds it without a reader (and removes it as a dead worker's)."""
        folder.mkdir(mode=0o700, exist_ok=True)
        name = uuid.uuid4().hex
        making = folder / f"{name}.new"
        os.mkfifo(making, 0o600)
        reading = os.open(making, os.O_RDONLY | os.O_NONBLOCK)
        # Its own writer: a reader of a FIFO that no writer holds open sees end-of-file at
        # once, again and again.
        writing = os.open(making, os.O_WRONLY | os.O_NONBLOCK)
        self._descriptors = (reading, writing)
        self._fifo = folder / f"{name}.fifo"
        os.replace(making, self._fifo)

    def _read_fifo(self) -> None:
        assert self._descriptors is not None
        reading = self._descriptors[0]
        while not self._stop.is_set():
            ready, _, _ = select.select([reading], [], [])
            if not ready or self._stop.is_set():
                continue
            try:
                data = os.read(reading, 4096)
            except BlockingIOError:
                continue
            for what, byte in _BYTES.items():
                if byte in data:
                    self.on_wake(what)

    # -- Postgres: LISTEN --------------------------------------------------------------------

    def _listen(self) -> None:
        import psycopg

        url = sqlalchemy_url(self.url).replace("postgresql+psycopg://", "postgresql://")
        while not self._stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=10) as connection:
                    for channel in (CHANNEL, *self.heard):
                        connection.execute(f"LISTEN {channel}")
                    for channel, payload in self.greeting:
                        connection.execute("SELECT pg_notify(%s, %s)", (channel, payload))
                    for what in _BYTES:
                        self.on_wake(what)  # what was committed while nobody listened
                    while not self._stop.is_set():
                        for note in connection.notifies(timeout=1.0):
                            if note.channel != CHANNEL:
                                self._heard(note.channel, note.payload)
                            elif note.payload in _BYTES:
                                self.on_wake(note.payload)
            except Exception:  # the database went away: the worker looks by itself meanwhile
                self._stop.wait(1.0)

    def _heard(self, channel: str, payload: str) -> None:
        callback = self.heard.get(channel)
        if callback is None:
            return
        try:
            callback(payload)
        except Exception:  # a note it cannot use: never the end of the worker's wake-ups
            log.exception("a notification could not be handled", channel=channel)
