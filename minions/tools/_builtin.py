"""Built-in tools for recipes: the time, files in a workspace, and (opt-in) HTTP GET.

File tools are confined to one workspace directory: any path that resolves outside it —
through ``..``, an absolute path or a symlink — is refused. `http_get` is not available unless
a recipe enables it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from minions.errors import ToolError
from minions.tools._tool import Tool, tool

__all__ = ["builtin_tools", "current_datetime", "file_tools", "http_get_tool"]

_MAX_READ = 1_000_000
MAX_HTTP_CHARS = 200_000
"""The most text `http_get` returns, whatever `max_chars` the model asks for."""


@tool(run_in_thread=False)
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


class _Workspace:
    def __init__(self, root: Path, protected: Collection[Path]) -> None:
        self.root = root.resolve()
        self.protected = protected

    def path(self, relative: str, *, argument: str = "path") -> Path:
        if not relative.strip():
            raise ToolError(f"The {argument} is empty; give a path inside the workspace.")
        if "\x00" in relative:
            raise ToolError(f"The {argument} {relative!r} holds a NUL character.")
        try:
            candidate = (self.root / relative).resolve()
        except (OSError, ValueError) as exc:
            raise ToolError(f"The {argument} {relative!r} is not a usable path ({exc}).") from None
        if not candidate.is_relative_to(self.root):
            raise ToolError(
                f"Path {relative!r} is outside the workspace; use a path inside it, such as "
                f"'notes.txt'."
            )
        return candidate

    def writable(self, relative: str) -> Path:
        target = self.path(relative)
        if target in self.protected:
            raise ToolError(
                f"{relative!r} is part of the recipe (its YAML or a tools module); file tools "
                f"never write it. Use another name."
            )
        return target

    def show(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."


def file_tools(workspace: str | Path, *, protected: Collection[Path] = ()) -> list[Tool]:
    """`read_file`, `write_file` and `list_files`, confined to `workspace`.

    `write_file` never writes a `protected` path (a recipe loaded from YAML protects its own
    files and the tool modules it imports), and `read_file` never reads a `.env` file. The
    workspace folder is created by the first write.
    """
    space = _Workspace(Path(workspace), protected)

    def read_file(path: str) -> str:
        """Read a text file of the workspace.

        Args:
            path: the file's path inside the workspace.
        """
        target = space.path(path)
        if target.name == ".env" or target.name.startswith(".env."):
            raise ToolError(f"{path!r} holds secrets (a .env file); file tools never read it.")
        if not target.is_file():
            raise ToolError(f"No file {path!r} in the workspace.")
        with target.open("rb") as file:  # at most the cap, however big the file
            data = file.read(_MAX_READ)
        return data.decode("utf-8", errors="replace")

    def write_file(path: str, content: str) -> dict[str, Any]:
        """Write a text file in the workspace (folders are created as needed).

        Args:
            path: the file's path inside the workspace.
            content: the text to write.
        """
        target = space.writable(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return {"path": space.show(target), "bytes": len(content.encode("utf-8"))}

    def list_files(path: str = ".", pattern: str = "*") -> list[str]:
        """List the files of a workspace folder.

        Args:
            path: the folder inside the workspace.
            pattern: a glob pattern such as "*.md" ("**/*" to include subfolders).
        """
        folder = space.path(path)
        if folder == space.root and not folder.exists():
            return []  # nothing written yet
        if not folder.is_dir():
            raise ToolError(f"No folder {path!r} in the workspace.")
        if not pattern or pattern.startswith(("/", "\\")) or "\x00" in pattern:
            raise ToolError(
                f"The pattern {pattern!r} must be relative to the folder, such as '*.md'."
            )
        found = []
        try:
            items = sorted(folder.glob(pattern))
        except (NotImplementedError, ValueError) as exc:
            raise ToolError(f"The pattern {pattern!r} cannot be used: {exc}.") from None
        for item in items:
            resolved = item.resolve()
            if item.is_file() and resolved.is_relative_to(space.root):
                found.append(space.show(item))
        return found

    return [tool(read_file), tool(write_file), tool(list_files)]


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
