"""Bearer-token auth and the body size limit, before any route runs."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from minions.service._errors import error

__all__: list[str] = []

PUBLIC_PATHS = frozenset({"/health", "/", "/favicon.ico"})
PUBLIC_PREFIX = "/console/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Guard:
    """Bearer-token auth and the body size limit, before any route runs (an unknown path
    without a token is a 401, not a 404: nothing is told to strangers)."""

    def __init__(self, app: Any, *, token: str, max_body: int) -> None:
        self.app = app
        self.token = token.encode()
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIX):
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            scheme, _, credentials = given.partition(b" ")
            if not given:
                message = "this endpoint needs an Authorization: Bearer <token> header"
                await error(401, message)(scope, receive, send)
                return
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credentials.strip(), self.token
            ):
                await error(401, "the bearer token is wrong")(scope, receive, send)
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._body(scope, receive)
            if body is None:
                message = f"the request body is larger than {self.max_body} bytes"
                await error(413, message)(scope, receive, send)
                return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)
