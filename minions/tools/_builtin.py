"""Built-in tools for recipes: the time, files in a workspace, and (opt-in) HTTP GET.

File tools are confined to one workspace directory: ``..`` above it and absolute paths are
refused, and paths are opened one name at a time from the workspace's own descriptor without
following symbolic links, so nothing swapped in during a call can lead a read or a write
outside. `http_get` is not available unless a recipe enables it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fnmatch
import os
import stat
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from minions._text import cut_note
from minions.errors import ToolError
from minions.tools._tool import Tool, tool

__all__ = ["builtin_tools", "current_datetime", "file_tools", "http_get_tool"]

_MAX_READ = 1_000_000
MAX_HTTP_CHARS = 200_000
"""The most text `http_get` returns, whatever `max_chars` the model asks for."""


@tool(run_in_thread=False, side_effects=False)
def current_datetime(
    hours_ago: float = 0, days_ago: float = 0, timezone: str = "UTC"
) -> dict[str, Any]:
    """The current date and time, or a moment before it (e.g. 24 hours ago).

    Args:
        hours_ago: how many hours before now (0 for now).
        days_ago: how many days before now (0 for now).
        timezone: an IANA time zone name such as "UTC" or "Europe/Oslo".
    """
    try:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"Unknown time zone {timezone!r}; use a name such as 'UTC'.") from None
    moment = dt.datetime.now(zone) - dt.timedelta(hours=hours_ago, days=days_ago)
    return {
        "iso": moment.isoformat(timespec="seconds"),
        "unix": int(moment.timestamp()),
        "date": moment.date().isoformat(),
        "time": moment.strftime("%H:%M:%S"),
        "weekday": moment.strftime("%A"),
        "timezone": timezone,
    }


# -- files ---------------------------------------------------------------------------------------

MAX_DEPTH = 64
"""The most folders a file tool's path goes down."""
MAX_NAME_BYTES = 255
"""The longest file or folder name (in bytes, as file systems count)."""
MAX_PATTERN_CHARS = 256
"""The longest `list_files` pattern."""
MAX_LISTED = 10_000
"""The most files one `list_files` call names."""
MAX_SCANNED = 100_000
"""The most folder entries one `list_files` call looks at."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Close-on-exec (no child inherits a file), binary on Windows, and never blocking on a FIFO
# someone made in the workspace (its type is refused once it is open).
_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
_BY_DESCRIPTOR = (
    {os.open, os.mkdir, os.stat} <= os.supports_dir_fd
    and os.scandir in os.supports_fd
    and bool(_NOFOLLOW and _DIRECTORY)
)
"""POSIX: every name is looked up in a folder held open, without following links, so no
path can be swapped between a check and its use. Elsewhere each name is checked first (a
narrow race remains there)."""

_Folder = int | str
"""A folder held open: a descriptor, or (without descriptor calls) its path."""


def _enter(folder: _Folder, name: str) -> _Folder:
    """The folder `name` inside `folder`, never through a link."""
    if isinstance(folder, int):
        return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _FLAGS, dir_fd=folder)
    path = os.path.join(folder, name)
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
    if not stat.S_ISDIR(mode):
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    return path


def _open(folder: _Folder, name: str, flags: int) -> int:
    """A file descriptor for `name` inside `folder`, never through a link."""
    if isinstance(folder, int):
        return os.open(name, flags | _NOFOLLOW | _FLAGS, 0o666, dir_fd=folder)
    path = os.path.join(folder, name)
    if os.path.islink(path):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
    return os.open(path, flags | _NOFOLLOW | _FLAGS, 0o666)


def _is_link(folder: _Folder, name: str) -> bool:
    try:
        if isinstance(folder, int):
            return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
        return os.path.islink(os.path.join(folder, name))
    except OSError:
        return False


def _mkdir(folder: _Folder, name: str) -> None:
    with contextlib.suppress(FileExistsError):
        if isinstance(folder, int):
            os.mkdir(name, dir_fd=folder)
        else:
            os.mkdir(os.path.join(folder, name))


def _close(folder: _Folder | None) -> None:
    if isinstance(folder, int):
        os.close(folder)


def _shown(path: str) -> str:
    """A path as error messages quote it: short, however long the model made it."""
    return repr(path if len(path) <= 100 else f"{path[:100]}...")


def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return lowered == ".env" or lowered.startswith(".env.")


def _failure(exc: OSError, where: str, missing: str) -> ToolError:
    """`exc` as the model sees it: what went wrong with the workspace path `where`, never the
    host's path (an `OSError` carries the absolute one)."""
    code = exc.errno
    shown = _shown(where)
    if code == errno.ENOENT:
        return ToolError(missing)
    if code in (errno.ELOOP, errno.EMLINK):  # EMLINK: BSD's O_NOFOLLOW on a link
        return ToolError(
            f"{shown} is a symbolic link; file tools never follow links (use the path it "
            "points to, inside the workspace)."
        )
    reasons = {
        errno.ENOTDIR: f"{shown} is a file, not a folder.",
        errno.EISDIR: f"{shown} is a folder, not a file.",
        errno.EACCES: f"{shown}: permission denied.",
        errno.EPERM: f"{shown}: permission denied.",
        errno.ENAMETOOLONG: f"{shown}: a name in it is too long.",
        errno.ENOSPC: f"No space left on the disk to write {shown}.",
        errno.EROFS: "The workspace is on a read-only file system.",
        errno.ENXIO: f"{shown} is not a regular file.",
    }
    if code in reasons:
        return ToolError(reasons[code])
    reason = os.strerror(code) if code else "it cannot be used"
    return ToolError(f"{shown}: {reason}.")


class _Workspace:
    """The folder file tools work in. Paths are taken apart by the tools (``..`` cannot go
    above the folder) and opened one name at a time from the folder's own descriptor, never
    following a link: a symbolic link anywhere in a path is refused, whenever it appears."""

    def __init__(self, root: Path, protected: Collection[Path]) -> None:
        self.root = root.resolve()
        self.protected = protected  # the loader may add to it after this is made

    def parts(self, relative: str, *, argument: str = "path") -> tuple[str, ...]:
        """The names of a workspace path, in order (``()`` for the workspace itself).

        Raises:
            ToolError: the path is empty, holds a NUL, leaves the workspace, goes too deep
                or has a name too long.
        """
        if not isinstance(relative, str) or not relative.strip():
            raise ToolError(f"The {argument} is empty; give a path inside the workspace.")
        if "\x00" in relative:
            raise ToolError(f"The {argument} {_shown(relative)} holds a NUL character.")
        text = relative.replace("\\", "/")  # a Windows-style path means the same folders
        names: list[str] = []
        outside = text.startswith("/")
        for name in text.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                if not names:
                    outside = True
                    break
                names.pop()
                continue
            names.append(name)
        if outside:
            raise ToolError(
                f"Path {_shown(relative)} is outside the workspace; use a path inside it, "
                "such as 'notes.txt'."
            )
        if len(names) > MAX_DEPTH:
            raise ToolError(
                f"The {argument} {_shown(relative)} is {len(names):,} levels deep; file tools "
                f"go at most {MAX_DEPTH} levels deep."
            )
        for name in names:
            try:
                size = len(os.fsencode(name))
            except UnicodeError:
                raise ToolError(
                    f"The {argument} {_shown(relative)} holds characters a file name cannot have."
                ) from None
            if size > MAX_NAME_BYTES:
                raise ToolError(
                    f"The name {_shown(name)} in the {argument} is {size:,} bytes long; a file "
                    f"or folder name has at most {MAX_NAME_BYTES}."
                )
        return tuple(names)

    @contextlib.contextmanager
    def folder(
        self, names: Sequence[str], *, missing: str, create: bool = False
    ) -> Iterator[_Folder]:
        """The folder `names` lead to, held open while the block runs (created, with the
        folders above it, when `create`).

        Raises:
            ToolError: a name is missing (`missing`), a link, a file, or cannot be opened.
        """
        try:
            if create:
                os.makedirs(self.root, exist_ok=True)
            current: _Folder = (
                os.open(self.root, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _FLAGS)
                if _BY_DESCRIPTOR
                else str(self.root)
            )
        except OSError as exc:
            raise _failure(exc, ".", missing) from None
        try:
            for depth, name in enumerate(names):
                try:
                    if create:
                        _mkdir(current, name)
                    inner = _enter(current, name)
                except OSError as exc:
                    if exc.errno == errno.ENOTDIR and _is_link(current, name):
                        exc = OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                    raise _failure(exc, "/".join(names[: depth + 1]), missing) from None
                _close(current)
                current = inner
            yield current
        finally:
            _close(current)

    def check(self, descriptor: int, where: str) -> os.stat_result:
        """What is open at `descriptor`, if file tools may use it: a regular file with no
        other hard link (a link to a file outside would let them read or write it).

        Raises:
            ToolError: it is a folder or something else, or has other hard links.
        """
        info = os.fstat(descriptor)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{_shown(where)} is a folder, not a file.")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{_shown(where)} is not a regular file; file tools only use files.")
        if info.st_nlink > 1:
            raise ToolError(
                f"{_shown(where)} has other hard links (it may be a file outside the "
                "workspace); file tools never read or write such a file."
            )
        return info


def file_tools(workspace: str | Path, *, protected: Collection[Path] = ()) -> list[Tool]:
    """`read_file`, `write_file` and `list_files`, confined to `workspace`.

    Paths are opened one name at a time from the workspace folder, never following a
    symbolic link (so none can lead outside, even one swapped in during a call), and a file
    with other hard links is neither read nor written. `write_file` never writes a
    `protected` path (a recipe loaded from YAML protects its own files and the tool modules
    it imports), and no tool reads or writes a `.env` file. Every failure is a `ToolError`
    naming the path inside the workspace, never the host's. The workspace folder is created
    by the first write.
    """
    space = _Workspace(Path(workspace), protected)

    def read_file(path: str) -> str:
        """Read a text file of the workspace.

        Args:
            path: the file's path inside the workspace.
        """
        names = space.parts(path)
        where = "/".join(names) or "."
        if not names:
            raise ToolError("'.' is the workspace folder; give a file's path, such as 'notes.txt'.")
        if _is_secret(names[-1]):
            raise ToolError(
                f"{_shown(path)} holds secrets (a .env file); file tools never read it."
            )
        missing = f"No file {_shown(path)} in the workspace."
        try:
            with space.folder(names[:-1], missing=missing) as folder:
                descriptor = _open(folder, names[-1], os.O_RDONLY)
            with os.fdopen(descriptor, "rb") as file:
                info = space.check(descriptor, where)
                data = file.read(_MAX_READ)  # at most the cap, however big the file
        except OSError as exc:
            raise _failure(exc, where, missing) from None
        text = data.decode("utf-8", errors="replace")
        if info.st_size > len(data):
            text += cut_note(info.st_size, len(data), "bytes")
        return text

    def write_file(path: str, content: str) -> dict[str, Any]:
        """Write a text file in the workspace (folders are created as needed).

        Args:
            path: the file's path inside the workspace.
            content: the text to write.
        """
        names = space.parts(path)
        where = "/".join(names)
        if not names:
            raise ToolError(
                "'.' is the workspace folder itself; write_file needs a file's path, such as "
                "'notes.txt'."
            )
        if _is_secret(names[-1]):
            raise ToolError(
                f"{_shown(path)} would be a .env file, which holds secrets; file tools never "
                "write one. Use another name."
            )
        if space.root.joinpath(*names) in space.protected:
            raise ToolError(
                f"{_shown(path)} is part of the recipe (its YAML or a tools module); file tools "
                f"never write it. Use another name."
            )
        data = content.encode("utf-8", errors="replace")
        missing = f"No folder for {_shown(path)} in the workspace."
        try:
            with space.folder(names[:-1], missing=missing, create=True) as folder:
                # Not truncated on opening: a file that must not be written is left as it is.
                descriptor = _open(folder, names[-1], os.O_WRONLY | os.O_CREAT)
            with os.fdopen(descriptor, "wb") as file:
                space.check(descriptor, where)
                file.truncate(0)
                file.write(data)
        except OSError as exc:
            raise _failure(exc, where, missing) from None
        return {"path": where, "bytes": len(data)}

    def list_files(path: str = ".", pattern: str = "*") -> list[str]:
        """List the files of a workspace folder.

        Args:
            path: the folder inside the workspace.
            pattern: a glob pattern such as "*.md" ("**/*" to include subfolders).
        """
        names = space.parts(path)
        steps = _pattern_steps(pattern)
        if not names and not space.root.exists():
            return []  # nothing written yet
        missing = f"No folder {_shown(path)} in the workspace."
        with space.folder(names, missing=missing) as folder:
            try:
                found, complete = _walk(folder, steps, names)
            except OSError as exc:
                raise _failure(exc, "/".join(names) or ".", missing) from None
        found.sort()
        if not complete:
            found.append(
                f"[cut: more files than the {len(found):,} listed; narrow the folder or the "
                "pattern]"
            )
        return found

    made = [
        Tool(read_file, side_effects=False),
        tool(write_file),
        Tool(list_files, side_effects=False),
    ]
    for each in made:
        each.reach = str(space.root)
    return made


def _pattern_steps(pattern: str) -> tuple[str, ...]:
    """A `list_files` pattern as names to match one folder level each (``**``: any number
    of levels, repeats folded into one).

    Raises:
        ToolError: the pattern is empty, absolute, too long, or leaves the folder.
    """
    if (
        not isinstance(pattern, str)
        or not pattern
        or pattern.startswith(("/", "\\"))
        or "\x00" in pattern
    ):
        raise ToolError(
            f"The pattern {_shown(str(pattern))} must be relative to the folder, such as '*.md'."
        )
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ToolError(
            f"The pattern is {len(pattern):,} characters long; a pattern has at most "
            f"{MAX_PATTERN_CHARS}, such as '**/*.md'."
        )
    steps: list[str] = []
    for name in pattern.replace("\\", "/").split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            raise ToolError(f"The pattern {_shown(pattern)} must stay inside the folder (no '..').")
        if name == "**" and steps and steps[-1] == "**":
            continue
        steps.append(name)
    return tuple(steps)


def _advance(steps: tuple[str, ...], at: Iterable[int]) -> frozenset[int]:
    """Positions in `steps` reachable from `at` when each ``**`` matches no folder."""
    reached = set(at)
    todo = list(reached)
    while todo:
        index = todo.pop()
        if index < len(steps) and steps[index] == "**" and index + 1 not in reached:
            reached.add(index + 1)
            todo.append(index + 1)
    return frozenset(reached)


def _match(steps: tuple[str, ...], at: frozenset[int], name: str) -> frozenset[int]:
    """The positions after one more name: a set of positions, never a backtracking search,
    so no pattern costs more than its length times the path's."""
    following = set()
    for index in at:
        if index < len(steps):
            if steps[index] == "**":
                following.add(index)
            elif fnmatch.fnmatchcase(name, steps[index]):
                following.add(index + 1)
    return _advance(steps, following)


def _walk(top: _Folder, steps: tuple[str, ...], prefix: tuple[str, ...]) -> tuple[list[str], bool]:
    """The files under `top` that `steps` match (as workspace paths under `prefix`), and
    whether that is all of them: without recursion, never through a link, at most
    `MAX_DEPTH` deep, `MAX_SCANNED` entries and `MAX_LISTED` files."""
    found: list[str] = []
    end = len(steps)
    scanned = 0
    # Each level: the folder held open (None: the caller's), its path, the pattern
    # positions reached there, and its entries still to look at.
    stack: list[tuple[_Folder | None, tuple[str, ...], frozenset[int], Any]] = [
        (None, prefix, _advance(steps, {0}), os.scandir(top))
    ]
    try:
        while stack:
            folder, where, at, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                _close(folder)
                stack.pop()
                continue
            scanned += 1
            if scanned > MAX_SCANNED or len(found) >= MAX_LISTED:
                return found, False
            after = _match(steps, at, entry.name)
            if not after or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if len(stack) < MAX_DEPTH and any(i < end for i in after):
                    try:
                        inner = _enter(top if folder is None else folder, entry.name)
                    except OSError:
                        continue  # a folder it may not open, or one that just went
                    try:
                        listing = os.scandir(inner)
                    except OSError:
                        _close(inner)
                        continue
                    stack.append((inner, (*where, entry.name), after, listing))
            elif end in after and entry.is_file(follow_symlinks=False):
                found.append("/".join((*where, entry.name)))
        return found, True
    finally:
        for folder, _, _, entries in stack:
            entries.close()
            _close(folder)


_SCHEME_PORTS = {"http": 80, "https": 443}


def _host_and_port(entry: str) -> tuple[str, int | None]:
    """``example.com`` (any port), ``example.com:8080``, ``[::1]:8000`` or ``::1``."""
    text = entry.strip().lower()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        if port.isdigit():
            return host, int(port)
    return text, None


def _private_reason(address: str) -> str | None:
    """Why an IP address is not for `http_get` by default (loopback, private, link-local...),
    or None for a public one."""
    import ipaddress

    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
            address.split("%")[0]
        )
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for reason, flag in (
        ("a loopback address", ip.is_loopback),
        ("an unspecified address", ip.is_unspecified),
        ("a link-local address (cloud metadata lives there)", ip.is_link_local),
        ("a multicast address", ip.is_multicast),
        ("a private address", ip.is_private),
        ("a reserved address", ip.is_reserved),
    ):
        if flag:
            return reason
    if not ip.is_global:
        return "not a public address"
    return None


def _connect(address: Any, timeout: float | None, family: int) -> Any:
    """Open a TCP connection to one resolved address (tests reroute it)."""
    import socket

    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if timeout is not None:
            sock.settimeout(timeout)
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def http_get_tool(*, allowed_hosts: Iterable[str] | None = None, timeout: float = 20.0) -> Tool:
    """`http_get`, for recipes that enable it.

    It never fetches a loopback, private, link-local (cloud metadata), multicast or reserved
    address: each host is resolved and every address it connects to is checked, on the first
    request and on every redirect, so a name cannot point somewhere else between check and
    connect. `allowed_hosts` limits where it may go: ``"example.com"`` (any port) or
    ``"example.com:8080"`` (that port only); a host named there explicitly may be private
    (``"127.0.0.1:8000"`` for a local service). No proxy from the environment is used.
    """
    allowed = [_host_and_port(h) for h in allowed_hosts] if allowed_hosts is not None else None

    def explicitly_allowed(host: str, port: int) -> bool:
        return allowed is not None and any(h == host and p in (None, port) for h, p in allowed)

    def guarded_connection(address: tuple[str, int], timeout: Any = None, *_: Any) -> Any:
        import socket

        host, port = address[0].lower(), int(address[1])
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ToolError(f"Could not resolve {host!r}: {exc}", retryable=True) from None
        trusted = explicitly_allowed(host, port)
        last: OSError | None = None
        for family, _kind, _proto, _name, sockaddr in found:
            reason = None if trusted else _private_reason(str(sockaddr[0]))
            if reason is not None:
                raise ToolError(
                    f"Host {host!r} resolves to {sockaddr[0]}, {reason}: http_get does not "
                    f"go there unless the recipe allows it (http: {{allowed_hosts: "
                    f"['{host}:{port}']}})."
                )
            try:
                return _connect(sockaddr, timeout, family)
            except OSError as exc:
                last = exc
        raise last or OSError(f"no address for {host!r}")

    def http_get(url: str, max_chars: int = 20_000) -> dict[str, Any]:
        """Fetch a URL with HTTP GET and return its status and text.

        Args:
            url: an http or https URL.
            max_chars: the most characters of the body to return (at most 200,000).
        """
        if not isinstance(max_chars, int) or max_chars < 1:
            raise ToolError(f"max_chars must be a positive number, not {max_chars!r}.")
        max_chars = min(max_chars, MAX_HTTP_CHARS)
        import http.client
        import urllib.error
        import urllib.parse
        import urllib.request

        def check(target: str) -> None:
            parsed = urllib.parse.urlparse(target)
            if parsed.scheme not in _SCHEME_PORTS or not parsed.hostname:
                raise ToolError(f"Not an http(s) URL: {target!r}.")
            try:
                port = parsed.port or _SCHEME_PORTS[parsed.scheme]
            except ValueError:
                raise ToolError(f"Not a usable port in {target!r}.") from None
            host = parsed.hostname.lower()
            if allowed is not None and not explicitly_allowed(host, port):
                shown = sorted(h if p is None else f"{h}:{p}" for h, p in allowed)
                raise ToolError(
                    f"Host {host if parsed.port is None else f'{host}:{port}'!r} is not "
                    f"allowed; allowed: {shown}."
                )

        class Redirects(urllib.request.HTTPRedirectHandler):
            """Follows a redirect only where the URL itself could go."""

            def redirect_request(
                self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
            ) -> Any:
                check(newurl)
                return super().redirect_request(req, fp, code, msg, headers, newurl)

        class Guarded(http.client.HTTPConnection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._create_connection = guarded_connection

        class GuardedTLS(http.client.HTTPSConnection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._create_connection = guarded_connection

        class Plain(urllib.request.HTTPHandler):
            def http_open(self, req: Any) -> Any:
                return self.do_open(Guarded, req)

        class Secure(urllib.request.HTTPSHandler):
            def https_open(self, req: Any) -> Any:
                return self.do_open(GuardedTLS, req, context=getattr(self, "_context", None))

        check(url)
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), Redirects, Plain, Secure
        )
        request = urllib.request.Request(url, headers={"User-Agent": "minions"})
        try:
            with opener.open(request, timeout=timeout) as response:
                body = response.read(max_chars * 4).decode("utf-8", errors="replace")
                return {"status": response.status, "url": response.url, "text": body[:max_chars]}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "url": url, "text": str(exc.reason)}
        except (urllib.error.URLError, TimeoutError) as exc:
            raise ToolError(f"Could not fetch {url!r}: {exc}", retryable=True) from None

    return tool(http_get)


def builtin_tools(
    workspace: str | Path = ".",
    *,
    http: bool = False,
    allowed_hosts: Iterable[str] | None = None,
    protected: Collection[Path] = (),
) -> list[Tool]:
    """All built-in tools: `current_datetime`, the file tools, and `http_get` if `http`."""
    tools = [current_datetime, *file_tools(workspace, protected=protected)]
    if http:
        tools.append(http_get_tool(allowed_hosts=allowed_hosts))
    return tools
