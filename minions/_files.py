"""Reading a file a person names (a limits file, a recipe): a regular file only, read up to a
bound, as UTF-8 text, or a message saying plainly why not.

`/dev/zero`, a FIFO nobody writes to, a folder or a file of gigabytes would otherwise hang the
command, fill the memory or end in a traceback.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__: list[str] = []

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
"""Opening never blocks (on a FIFO): its type is refused once it is open."""

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFileError(Exception):
    """Why a file cannot be read as text; the message does not name the file (the caller
    says which file it was, and what for). `missing`: there is no such file."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def read_text_file(path: str | Path, *, limit: int, what: str = "it", pipes: bool = False) -> str:
    """The text of the regular file at `path`, at most `limit` bytes of UTF-8 (`what` the
    file is, for the advice of an error: "save the recipe as UTF-8").

    With `pipes`, a pipe is read too, waiting for its writer as ``cat`` would (a shell's
    ``<(command)``); without, it is refused, never waited for.

    Raises:
        UnreadableFileError: it does not exist, cannot be opened, is not a regular file, is
            larger than `limit` bytes or is not UTF-8.
    """
    try:
        descriptor = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise UnreadableFileError("no such file", missing=True) from None
    except OSError as exc:
        raise UnreadableFileError(exc.strerror or str(exc)) from None
    try:
        mode = os.fstat(descriptor).st_mode
        if pipes and stat.S_ISFIFO(mode):
            os.set_blocking(descriptor, True)
        elif not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise UnreadableFileError(f"{kind}, not a regular file")
        data = _read(descriptor, limit + 1)
    except OSError as exc:
        raise UnreadableFileError(exc.strerror or str(exc)) from None
    finally:
        os.close(descriptor)
    if len(data) > limit:
        raise UnreadableFileError(f"larger than {_size(limit)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFileError(
            f"not UTF-8 text (byte {exc.start} cannot be read); save {what} as UTF-8"
        ) from None


_CHUNK = 1 << 20


def _read(descriptor: int, most: int) -> bytes:
    """Up to `most` bytes, a chunk at a time (a buffer of `most` bytes is never made for a
    small file)."""
    chunks: list[bytes] = []
    size = 0
    while size < most:
        chunk = os.read(descriptor, min(_CHUNK, most - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _size(count: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count:,} bytes"
