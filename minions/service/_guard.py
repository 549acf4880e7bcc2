"""What every request goes through before a route runs: the bearer token (or a stream ticket,
on a stream), the bytes of its path, query and body, the body's size and pace; and what
catches a route that fails, so that a failure is logged once, briefly, and answered 500."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import ipaddress
import re
import time
import traceback
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Literal
from urllib.parse import parse_qs

import structlog
from fastapi.responses import JSONResponse

from minions.errors import StoreError
from minions.runs import KeyRecord, RunStore
from minions.service._access import CALLER, TOKEN_CALLER, Caller
from minions.service._bytes import json_problem, path_problem, query_problem
from minions.service._errors import error
from minions.service._routes.console import FILES
from minions.service._tickets import Tickets

__all__: list[str] = []

log = structlog.get_logger(__name__)

PUBLIC_PATHS = frozenset(
    {"/health", "/health/live", "/health/ready", "/", *(f"/console/{name}" for name in FILES)}
)
"""What strangers may read: the probes and the console's own files (which hold no data); every
other path, unknown ones included, is a 401 without a key (``/metrics`` too, unless the server
makes it public)."""
STREAM = re.compile(r"/runs/(?P<run_id>[^/]+)/events/stream")
THREAD_ABOVE = 64 << 10
"""A body larger than this is checked in a thread (the check walks every value)."""

Scope = MutableMapping[str, Any]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _BodyTooLarge(Exception):
    pass


def proxy_networks(given: Sequence[str]) -> list[IPNetwork]:
    """The networks of `given` addresses and networks.

    Raises:
        ValueError: one is neither.
    """
    networks = []
    for text in given:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"trusted proxy {text!r}: give an IP address (127.0.0.1) or a network (10.0.0.0/24)"
            ) from None
    return networks


def _runs(scope: Scope) -> RunStore:
    runs: RunStore = scope["app"].state.runs
    return runs


def _caller_of(key: KeyRecord) -> Caller:
    return Caller(name=key.name, role=key.role, projects=key.projects, key_id=key.id)


class Guard:
    """The key, the bytes and the pace of every request, before any route runs (an unknown
    path without a key is a 401, not a 404: nothing is told to strangers), and the barrier
    that turns a route's failure into one short log line and a 500. The caller it finds (a
    named key of the store, found by its hash, or the server's token, an admin) is put in
    the request's scope for the routes' permissions (`minions.service._access`).

    Args:
        app: the application.
        token: the server's own bearer token (an admin key).
        max_body: a larger body is a 413.
        body_timeout: seconds a client may take to send a body (slower: 408).
        proxy_user_header: the header in which a trusted proxy names a request's user (the
            key of that name, without the key itself).
        trusted_proxies: the addresses or networks of those proxies.
        public: the paths served without a key.

    Raises:
        ValueError: a trusted proxy is not an address or a network.
    """

    def __init__(
        self,
        app: Any,
        *,
        token: str,
        max_body: int,
        body_timeout: float,
        proxy_user_header: str | None = None,
        trusted_proxies: Sequence[str] = (),
        public: frozenset[str] = PUBLIC_PATHS,
    ) -> None:
        self.app = app
        self.public = public
        self.token = token.encode()
        self.proxy_header = proxy_user_header.lower().encode() if proxy_user_header else None
        self.proxies = proxy_networks(trusted_proxies)
        self.tickets = Tickets(token)
        self.max_body = max_body
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            refusal = await self._refusal(scope)
        except StoreError:
            log.error("run store error", path=scope["path"], error="keys cannot be read")
            refusal = error(503, "the run store cannot be used now; see the server's log")
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                async with asyncio.timeout(self.body_timeout):
                    body = await self._body(scope, receive)
            except _BodyTooLarge:
                message = f"the request body is larger than {self.max_body} bytes"
                await error(413, message)(scope, receive, send)
                return
            except TimeoutError:
                message = f"the request body did not come within {self.body_timeout:g} s"
                await error(408, message, "request_timeout")(scope, receive, send)
                return
            problem = await self._body_problem(scope, body)
            if problem is not None:
                await error(400, problem, "invalid_json")(scope, receive, send)
                return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self._barrier(scope, replay, send)
            return
        await self._barrier(scope, receive, send)

    async def _refusal(self, scope: Scope) -> JSONResponse | None:
        """The answer to a request refused before its body is read, or None (and the
        request's `Caller` is in its scope)."""
        path: str = scope["path"]
        if path not in self.public:
            given = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, credentials = given.partition(b" ")
            user = self._proxy_user(scope)
            if user is not None:  # a trusted proxy says who it is
                caller = await self._named(scope, user)
                if caller is None:
                    shown = user.decode("ascii", errors="replace")[:64]
                    return error(
                        401, f"the proxy's user {shown!r} has no key here (minions keys add)"
                    )
            elif given:
                if scheme.lower() != b"bearer":
                    return error(401, "the Authorization header must be: Bearer <key>")
                caller = await self._bearer(scope, credentials.strip())
                if caller is None:
                    return error(401, "the bearer key is wrong or was revoked")
            else:
                ticketed = await self._ticketed(scope)
                if ticketed is False:
                    message = (
                        "the stream ticket is wrong, expired, for another run or of a key "
                        "revoked since; get another: POST /runs/{run_id}/events/ticket"
                    )
                    return error(401, message)
                if ticketed is None:
                    message = "this endpoint needs an Authorization: Bearer <key> header"
                    return error(401, message)
                caller = ticketed
            client = scope.get("client")
            scope[CALLER] = dataclasses.replace(caller, address=client[0] if client else None)
        problem = path_problem(scope.get("raw_path") or path.encode())
        if problem is None:
            problem = query_problem(scope["query_string"])
        return None if problem is None else error(400, problem)

    async def _bearer(self, scope: Scope, credentials: bytes) -> Caller | None:
        """The caller a bearer credential names: the server's token, or a key that works."""
        if hmac.compare_digest(credentials, self.token):
            return TOKEN_CALLER
        if len(credentials) > 100:
            return None  # not a key (one that is not shaped as a key is not looked up either)
        try:
            key = credentials.decode("ascii")
        except UnicodeDecodeError:
            return None
        found = await _runs(scope).key_of(key)
        return None if found is None else _caller_of(found)

    def _proxy_user(self, scope: Scope) -> bytes | None:
        """The user a trusted proxy names in its header (None: no header configured, not
        from a trusted proxy, or no such header)."""
        if self.proxy_header is None or not self.proxies:
            return None
        client = scope.get("client")
        if not client:
            return None
        try:
            peer = ipaddress.ip_address(client[0])
        except ValueError:
            return None
        if not any(peer in network for network in self.proxies):
            return None
        value: bytes | None = dict(scope["headers"]).get(self.proxy_header)
        return value.strip() if value is not None and value.strip() else None

    async def _named(self, scope: Scope, user: bytes) -> Caller | None:
        try:
            name = user.decode("ascii")
        except UnicodeDecodeError:
            return None
        found = await _runs(scope).key_named(name)
        return None if found is None else _caller_of(found)

    async def _ticketed(self, scope: Scope) -> Caller | Literal[False] | None:
        """The caller whose ticket opens a request for a run's stream (False: a ticket
        that does not; None: no ticket, or not a stream)."""
        match = STREAM.fullmatch(scope["path"])
        if match is None or scope["method"] not in ("GET", "HEAD"):
            return None
        try:
            query = parse_qs(scope["query_string"].decode("ascii"), max_num_fields=20)
        except (UnicodeDecodeError, ValueError):
            return False
        given = query.get("ticket")
        if given is None:
            return None
        if len(given) != 1:
            return False
        key_id = self.tickets.key_of(match["run_id"], given[0], now=time.time())
        if key_id is None:
            return False
        if key_id == TOKEN_CALLER.key_id:
            return TOKEN_CALLER
        found = await _runs(scope).key_by_id(key_id)
        return False if found is None else _caller_of(found)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                raise _BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _body_problem(self, scope: Scope, body: bytes) -> str | None:
        """What is wrong with a JSON body (or one without a content type, which the routes
        read as JSON), or None."""
        if not body:
            return None
        content_type = dict(scope["headers"]).get(b"content-type", b"").lower()
        if content_type and b"json" not in content_type:
            return None  # not read as JSON: the route refuses it
        if len(body) > THREAD_ABOVE:
            return await asyncio.to_thread(json_problem, body)
        return json_problem(body)

    async def _barrier(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; a failure is logged once, without local variables (they hold the
        token and the request), and answered 500 when no answer has started."""
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            # Formatted here, whatever the logging setup: a renderer showing local variables
            # would print the token.
            lines = traceback.format_exception(exc, limit=-12)  # the innermost frames
            log.error(
                "request failed",
                method=scope["method"],
                path=scope["path"],
                exception="".join(lines),
            )
            if not started:
                message = "the server failed on this request; see its log"
                await error(500, message)(scope, receive, send)
