"""Stream tickets: what a browser's `EventSource` (which cannot send an ``Authorization``
header) puts in the stream's URL instead of the token. A ticket is short-lived, good for one
run's stream only, and signed with a key derived from the token, so every API process that
shares the token accepts it and nothing is kept: ``<expiry>.<key id>.<HMAC-SHA256 of run id,
expiry and key id>``. A ticket carries the identity of the key it was issued to (its id, or
``token``): the stream it opens is that key's, checked when it opens and as it goes on (a
revoked key's stream ends), with that key's role looked up then. The long-lived key never goes
in a URL."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

__all__: list[str] = []

TICKET_SECONDS = 60
"""How long a ticket opens its run's stream (a stream opened with it lasts as long as the
run: the ticket is checked when a connection starts)."""

_TICKET = re.compile(
    r"(?P<expires>[0-9]{1,12})\.(?P<key>[a-z0-9]{1,32})\.(?P<signature>[A-Za-z0-9_-]{43})"
)


class Tickets:
    """Issues and checks the stream tickets of one token."""

    def __init__(self, token: str) -> None:
        self._key = hmac.new(token.encode(), b"minions stream ticket", hashlib.sha256).digest()

    def _sign(self, run_id: str, expires: int, key_id: str) -> str:
        message = f"{run_id}\n{expires}\n{key_id}".encode(errors="replace")
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self, run_id: str, *, key_id: str, now: float) -> tuple[str, int]:
        """A ticket of key `key_id` for the run's stream, and when it expires (seconds since
        the epoch)."""
        expires = int(now) + TICKET_SECONDS
        return f"{expires}.{key_id}.{self._sign(run_id, expires, key_id)}", expires

    def key_of(self, run_id: str, ticket: str, *, now: float) -> str | None:
        """The id of the key whose ticket `ticket` is, when it opens the run's stream now;
        else None."""
        match = _TICKET.fullmatch(ticket)
        if match is None:
            return None
        expires = int(match["expires"])
        if expires < now:
            return None
        signature = self._sign(run_id, expires, match["key"])
        return match["key"] if hmac.compare_digest(match["signature"], signature) else None
