"""Stream tickets: what a browser's `EventSource` (which cannot send an ``Authorization``
header) puts in the stream's URL instead of the token. A ticket is short-lived, good for one
run's stream only, and signed with a key derived from the token, so every API process that
shares the token accepts it and nothing is kept: ``<expiry>.<HMAC-SHA256 of run id and
expiry>``. The long-lived token never goes in a URL."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

__all__: list[str] = []

TICKET_SECONDS = 60
"""How long a ticket opens its run's stream (a stream opened with it lasts as long as the
run: the ticket is checked when a connection starts)."""

_TICKET = re.compile(r"(?P<expires>[0-9]{1,12})\.(?P<signature>[A-Za-z0-9_-]{43})")


class Tickets:
    """Issues and checks the stream tickets of one token."""

    def __init__(self, token: str) -> None:
        self._key = hmac.new(token.encode(), b"minions stream ticket", hashlib.sha256).digest()

    def _sign(self, run_id: str, expires: int) -> str:
        message = f"{run_id}\n{expires}".encode(errors="replace")
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self, run_id: str, *, now: float) -> tuple[str, int]:
        """A ticket for the run's stream, and when it expires (seconds since the epoch)."""
        expires = int(now) + TICKET_SECONDS
        return f"{expires}.{self._sign(run_id, expires)}", expires

    def valid(self, run_id: str, ticket: str, *, now: float) -> bool:
        """Whether `ticket` opens the run's stream now."""
        match = _TICKET.fullmatch(ticket)
        if match is None:
            return False
        expires = int(match["expires"])
        if expires < now:
            return False
        return hmac.compare_digest(match["signature"], self._sign(run_id, expires))
