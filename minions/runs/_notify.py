"""Notifications: a signed JSON POST to the operator's URLs when a run failed, waits for a
person's approval, is stuck (held by a worker, no progress for a while, and not in a known
wait), or a schedule flagged a slot late or skipped it.

A `Notifier` runs in a thread of its own beside a server or a worker (``--notify URL``), so
nothing a run does ever waits for it. Each look it finds what is to be told in the store and
puts one row per thing and target in the outbox (``minions_notifications``), under a key
made of the target, the kind and what it is about: found again, or found by every process
given the same URL, it is told once. Then it sends what is due, claiming each row by moving
its next time on (one sender wins), and on a failure keeps the error and tries again later,
with a backoff doubling up to `MAX_BACKOFF`, until `MAX_ATTEMPTS`. A process that dies
between the claim and the answer leaves the row to be sent again after the claim's lease: a
receiver may get a notification twice then, and tells them apart by ``X-Minions-Delivery``.

The URLs are the operator's configuration, never what a request said: the outbox keeps, of a
target, a hash (the row's sender must be given the same URL) and its origin (what the fleet
view shows), never its path or query, which for many webhooks is their secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args

import sqlalchemy as sa
import structlog

from minions._fold import IN_FLIGHT, RunStates
from minions._text import redact_url
from minions.runs import _events as events
from minions.runs._db import DamagedStoreError, Database, detail
from minions.runs._tables import notifications_table as outbox

if TYPE_CHECKING:
    import httpx2

__all__ = ["Delivery", "NotifyTarget", "Notifier"]

log = structlog.get_logger(__name__)

Kind = Literal["failed", "waiting", "stuck", "late"]
KINDS: tuple[Kind, ...] = get_args(Kind)
EVENTS: dict[Kind, str] = {
    "failed": "run_failed",
    "waiting": "run_waiting",
    "stuck": "run_stuck",
    "late": "schedule_late",
}
"""The ``event`` of each kind's body."""
SECRET_ENV = "MINIONS_NOTIFY_SECRET"
"""The environment variable holding the secret that signs notifications."""
SIGNATURE = "X-Minions-Signature"
"""The header of the signature: ``t=<Unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``."""
MAX_ATTEMPTS = 20
"""Sends of one notification before it is given up (about a day with the backoff)."""
MAX_BACKOFF = 3600.0
"""The longest wait between two sends of one notification (seconds)."""
KEPT = 7 * 86400.0
"""Seconds a delivered or given-up notification stays in the outbox."""
LOOKBACK = 3600.0
"""How far back a notifier looks for failed runs (a notifier started after an outage tells
the failures of the last hour it missed)."""


@dataclass(frozen=True, kw_only=True)
class NotifyTarget:
    """A URL notifications go to, and the kinds it is sent.

    Attributes:
        url: where the JSON is POSTed (``http`` or ``https``).
        kinds: which of ``failed``, ``waiting``, ``stuck``, ``late`` it gets.
    """

    url: str
    kinds: frozenset[Kind] = field(default_factory=lambda: frozenset(KINDS))

    @property
    def id(self) -> str:
        """The target's id in the outbox: a hash of its URL."""
        return hashlib.sha256(self.url.encode()).hexdigest()[:32]

    @property
    def shown(self) -> str:
        """How the fleet view and the log name it: its origin and its id, never its path or
        query (a webhook's path is often its secret): ``https://hooks.example/… (1a2b3c4d)``."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        host = (parts.hostname or "?") + (f":{parts.port}" if parts.port else "")
        return f"{parts.scheme}://{host}/… ({self.id[:8]})"

    @classmethod
    def parse(cls, text: str) -> NotifyTarget:
        """``URL`` (every kind) or ``KINDS=URL`` (``failed,late=https://...``).

        Raises:
            ValueError: not such a value (the message says what is wrong).
        """
        text = text.strip()
        kinds: frozenset[Kind] = frozenset(KINDS)
        if not text.lower().startswith(("http://", "https://")):
            given, sep, text = text.partition("=")
            names = [n.strip() for n in given.split(",") if n.strip()]
            wrong = [n for n in names if n not in KINDS]
            if not sep or not names or wrong:
                raise ValueError(
                    f"{(given + sep + text)!r}: give URL or KINDS=URL, KINDS among "
                    f"{', '.join(KINDS)} (failed,late=https://hooks.example/minions)"
                )
            kinds = frozenset(n for n in KINDS if n in names)
        if not text.lower().startswith(("http://", "https://")) or len(text) < 10:
            raise ValueError(f"{text!r} is not an http:// or https:// URL")
        return cls(url=text, kinds=kinds)


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """How notifications to one target fared (the fleet view's).

    Attributes:
        target: its origin and id (`NotifyTarget.shown`).
        delivered: notifications it answered with a 2xx.
        pending: notifications not delivered yet (being retried).
        failed: notifications given up after `MAX_ATTEMPTS`.
        last_delivered_at: when one was last delivered (None: never).
        last_error: the last send's error, while the last send failed (None: it did not).
        last_attempt_at: when one was last sent.
    """

    target: str
    delivered: int
    pending: int
    failed: int
    last_delivered_at: float | None
    last_error: str | None
    last_attempt_at: float | None


def deliveries(database: Database) -> list[Delivery]:
    """Each target's deliveries, as the outbox tells."""
    with database.read() as db:
        rows = db.execute(
            sa.text(
                "SELECT target, "
                "sum(CASE WHEN delivered_at IS NOT NULL THEN 1 ELSE 0 END) AS delivered, "
                "sum(CASE WHEN delivered_at IS NULL AND failed_at IS NULL THEN 1 ELSE 0 END) "
                "AS pending, sum(CASE WHEN failed_at IS NOT NULL THEN 1 ELSE 0 END) AS failed, "
                "max(delivered_at) AS last_delivered, max(last_attempt_at) AS last_attempt "
                "FROM minions_notifications GROUP BY target ORDER BY target"
            )
        ).all()
        last_errors = {
            r.target: r.last_error
            for r in db.execute(
                sa.text(
                    "SELECT n.target, n.last_error FROM minions_notifications n "
                    "WHERE n.last_attempt_at = (SELECT max(m.last_attempt_at) FROM "
                    "minions_notifications m WHERE m.target = n.target)"
                )
            )
        }
    return [
        Delivery(
            target=r.target,
            delivered=int(r.delivered),
            pending=int(r.pending),
            failed=int(r.failed),
            last_delivered_at=r.last_delivered,
            last_error=last_errors.get(r.target),
            last_attempt_at=r.last_attempt,
        )
        for r in rows
    ]


class Held(NamedTuple):
    """A run held by a worker that made no progress for a while (`stuck_candidates`)."""

    run_id: str
    recipe_id: str
    epoch: int
    last_seq: int
    progress_at: float
    """Its last progress: its last stored event, or its holder's claim when that is later."""


_HELD_LONG = sa.text(
    # The runs held now (`running`: by the status index, as many as the workers' places),
    # each with its last stored event (by the events' key).
    "SELECT r.run_id, r.recipe_id, r.epoch, r.last_seq, "
    "coalesce(r.claimed_at, r.started_at) AS held_since, e.data "
    "FROM minions_runs r LEFT JOIN minions_events e ON e.run_id = r.run_id AND e.seq = r.last_seq "
    "WHERE r.status = 'running' AND r.holder IS NOT NULL "
    "AND coalesce(r.claimed_at, r.started_at, 0) < :before"
)


def stuck_candidates(database: Database, now: float, after: float) -> list[Held]:
    """The runs held by a worker (``running``) whose last progress, their last stored event
    or their holder's claim (a run resumed after a long wait starts its hold fresh), is
    `after` seconds or more before `now`."""
    with database.read() as db:
        rows = db.execute(_HELD_LONG, {"before": now - after}).all()
    found = []
    for r in rows:
        progress = r.held_since or 0.0
        if r.data:
            with contextlib.suppress(DamagedStoreError):  # its claim says when it was held
                last = events.decoded(r.run_id, int(r.last_seq), r.data)
                progress = max(progress, last.timestamp)
        if now - progress >= after:
            found.append(Held(r.run_id, r.recipe_id, int(r.epoch), int(r.last_seq), progress))
    return found


def busy_steps(database: Database, run_id: str) -> list[str] | None:
    """What of the run works, as its stored events say (the one fold of `minions._fold`):
    the executions in flight (steps, loop items) that wait for nothing, by id (empty:
    nothing is in flight); None when it is in a known wait: something is in flight, and
    each execution in flight waits for its endpoint's limits (``model_call_waiting``) or a
    person's decision."""
    states = RunStates.of(events.readable(database, run_id))
    in_flight = [e for e in states.executions if e.status in IN_FLIGHT]
    leaves = [
        e
        for e in in_flight
        if e.item is not None or not any(i.status in IN_FLIGHT for i in states.items_of(e))
    ]
    if leaves and all(e.waits_for is not None for e in leaves):
        return None
    return [e.step_id for e in leaves if e.waits_for is None]


@dataclass(frozen=True)
class _Found:
    kind: Kind
    subject: str
    body: dict[str, Any]


class Notifier:
    """Finds what is to be told in a store and sends it to `targets` (see the module).

    Args:
        database: the run store (or its URL).
        targets: where notifications go.
        secret: signs each body (None: ``MINIONS_NOTIFY_SECRET``).
        stuck_after: seconds without progress after which a run held by a worker is stuck,
            unless it is in a known wait (see `busy_steps`).
        every: seconds between two looks of `run`.
        backoff: seconds before a failed notification's second send (doubled each time).
        timeout: seconds a receiver has to answer.
        clock: the time now (tests move it).
        transport: an httpx transport (tests).
    """

    def __init__(
        self,
        database: Database | str,
        targets: Sequence[NotifyTarget],
        *,
        secret: str | None = None,
        stuck_after: float = 900.0,
        every: float = 5.0,
        backoff: float = 5.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        secret = secret or os.environ.get(SECRET_ENV)
        if not secret:
            raise ValueError(
                f"notifications are signed: set {SECRET_ENV} to a secret shared with the receivers"
            )
        self.database = Database(database, create=True) if isinstance(database, str) else database
        self.targets = {t.id: t for t in targets}
        self.secret = secret.encode()
        self.stuck_after = stuck_after
        self.every, self.backoff, self.timeout = every, backoff, timeout
        self.clock = clock
        self._transport = transport
        self._client: httpx2.Client | None = None
        self._next_prune = 0.0
        self._waits: dict[tuple[str, int], list[str] | None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- finding -----------------------------------------------------------------------------

    def find(self) -> int:
        """Put what is to be told now in the outbox: how many new notifications."""
        now = self.clock()
        wanted = frozenset[Kind]().union(*(t.kinds for t in self.targets.values()))
        found = [
            *(self._failed(now) if "failed" in wanted else ()),
            *(self._waiting() if "waiting" in wanted else ()),
            *(self._stuck(now) if "stuck" in wanted else ()),
            *(self._late(now) if "late" in wanted else ()),
        ]
        if now >= self._next_prune:
            self._next_prune = now + 3600.0
            with self.database.begin() as db:
                db.execute(
                    outbox.delete().where(
                        sa.or_(outbox.c.delivered_at < now - KEPT, outbox.c.failed_at < now - KEPT)
                    )
                )
        if not found:
            return 0  # an idle store: nothing written
        added = 0
        with self.database.begin() as db:
            for target in self.targets.values():
                for thing in found:
                    if thing.kind not in target.kinds:
                        continue
                    body = {"event": EVENTS[thing.kind], **thing.body, "notified_at": now}
                    added += len(
                        db.execute(
                            self.database.insert_ignoring_conflicts(
                                outbox,
                                {
                                    "key": f"{target.id}:{thing.kind}:{thing.subject}",
                                    "target": target.shown,
                                    "event": EVENTS[thing.kind],
                                    "body": json.dumps(body),
                                    "created_at": now,
                                    "next_at": now,
                                    "attempts": 0,
                                },
                            ).returning(outbox.c.key)
                        ).all()
                    )
        return added

    def _failed(self, now: float) -> Iterable[_Found]:
        with self.database.read() as db:
            rows = db.execute(
                sa.text(
                    "SELECT run_id, recipe_id, schedule, error, finished_at FROM minions_runs "
                    "WHERE status = 'failed' AND finished_at >= :since"
                ),
                {"since": now - LOOKBACK},
            ).all()
        for r in rows:
            yield _Found(
                "failed",
                r.run_id,
                {
                    "run_id": r.run_id,
                    "recipe": r.recipe_id,
                    "schedule": r.schedule,
                    "error": r.error,
                    "at": r.finished_at,
                },
            )

    def _waiting(self) -> Iterable[_Found]:
        with self.database.read() as db:
            rows = db.execute(
                sa.text(
                    "SELECT a.run_id, a.call_id, a.step_id, a.tool, a.requested_at, r.recipe_id "
                    "FROM minions_approvals a JOIN minions_runs r ON r.run_id = a.run_id "
                    "WHERE a.decided_at IS NULL AND r.status = 'waiting'"
                )
            ).all()
        for r in rows:
            yield _Found(
                "waiting",
                f"{r.run_id}:{r.call_id}",
                {
                    "run_id": r.run_id,
                    "recipe": r.recipe_id,
                    "step": r.step_id,
                    "tool": r.tool,
                    "call_id": r.call_id,
                    "at": r.requested_at,
                },
            )

    def _stuck(self, now: float) -> Iterable[_Found]:
        """The runs held by a worker with no progress for `stuck_after` (`stuck_candidates`)
        that are not in a known wait (`busy_steps`)."""
        seen: dict[tuple[str, int], list[str] | None] = {}
        for r in stuck_candidates(self.database, now, self.stuck_after):
            key = (r.run_id, r.last_seq)
            cached = key in self._waits
            busy = seen[key] = self._waits[key] if cached else busy_steps(self.database, r.run_id)
            if busy is None:
                continue  # every step in flight waits for an endpoint or a person
            yield _Found(
                "stuck",
                f"{r.run_id}:{r.epoch}:{r.last_seq}",
                {
                    "run_id": r.run_id,
                    "recipe": r.recipe_id,
                    "steps": busy,
                    "last_progress_at": r.progress_at,
                    "stuck_for": now - r.progress_at,
                    "at": now,
                },
            )
        self._waits = seen  # a verdict per run and last event: the log up to it never changes

    def _late(self, now: float) -> Iterable[_Found]:
        with self.database.read() as db:
            rows = db.execute(
                sa.text(
                    "SELECT schedule, slot, why, reason, slots, first_slot, run_id, recipe_id, at "
                    "FROM minions_schedule_late WHERE at >= :since"
                ),
                {"since": now - LOOKBACK},
            ).all()
        for r in rows:
            yield _Found(
                "late",
                f"{r.schedule}:{r.slot!r}",
                {
                    "schedule": r.schedule,
                    "recipe": r.recipe_id,
                    "slot": r.slot,
                    "why": r.why,
                    "reason": r.reason,
                    "slots": r.slots,
                    "first_slot": r.first_slot,
                    "run_id": r.run_id,
                    "late_by": r.at - r.slot,
                    "at": r.at,
                },
            )

    # -- sending -----------------------------------------------------------------------------

    def deliver(self) -> int:
        """Send the due notifications of this notifier's targets: how many were delivered."""
        now = self.clock()
        with self.database.read() as db:
            due = db.execute(
                sa.select(outbox.c.key, outbox.c.next_at, outbox.c.attempts, outbox.c.body)
                .where(
                    outbox.c.next_at <= now,
                    outbox.c.delivered_at.is_(None),
                    outbox.c.failed_at.is_(None),
                )
                .order_by(outbox.c.next_at)
                .limit(100)
            ).all()
        delivered = 0
        for row in due:
            target = self.targets.get(row.key.split(":", 1)[0])
            if target is None:
                continue  # another process's target
            if self._claim(row, now):
                delivered += self._send(target, row.key, row.body, row.attempts + 1)
        return delivered

    def _claim(self, row: Any, now: float) -> bool:
        """Take the row for one send (another sender that read it too finds it moved on)."""
        with self.database.begin() as db:
            return bool(
                db.execute(
                    outbox.update()
                    .where(outbox.c.key == row.key, outbox.c.next_at == row.next_at)
                    .values(
                        next_at=now + self.timeout + 30.0,
                        attempts=row.attempts + 1,
                        last_attempt_at=now,
                    )
                ).rowcount
            )

    def signature(self, body: bytes, at: int) -> str:
        """The value of the `SIGNATURE` header of `body` sent at `at`."""
        mac = hmac.new(self.secret, f"{at}.".encode() + body, hashlib.sha256).hexdigest()
        return f"t={at},v1={mac}"

    def _send(self, target: NotifyTarget, key: str, body: str, attempt: int) -> int:
        import httpx2

        if self._client is None:
            self._client = httpx2.Client(timeout=self.timeout, transport=self._transport)
        data = body.encode()
        at = int(self.clock())
        error: str | None = None
        try:
            answer = self._client.post(
                target.url,
                content=data,
                headers={
                    "Content-Type": "application/json",
                    SIGNATURE: self.signature(data, at),
                    "X-Minions-Event": json.loads(body)["event"],
                    "X-Minions-Delivery": hashlib.sha256(key.encode()).hexdigest()[:32],
                    "User-Agent": "minions-notify",
                },
            )
            if not answer.is_success:
                error = f"HTTP {answer.status_code}"
        except Exception as exc:
            error = redact_url(f"{type(exc).__name__}: {exc}".replace(target.url, target.shown))
        now = self.clock()
        values: dict[str, Any]
        if error is None:
            values = {"delivered_at": now, "last_error": None}
        else:
            wait = min(MAX_BACKOFF, self.backoff * 2 ** (attempt - 1))
            values = {"next_at": now + wait, "last_error": error[:500]}
            if attempt >= MAX_ATTEMPTS:
                values["failed_at"] = now
            log.warning("notification not delivered", target=target.shown, error=error)
        with self.database.begin() as db:
            db.execute(outbox.update().where(outbox.c.key == key).values(**values))
        return int(error is None)

    # -- the thread --------------------------------------------------------------------------

    def look(self) -> None:
        """One look: find, then deliver (the store away: said, and tried at the next)."""
        try:
            self.find()
            self.deliver()
        except Exception as exc:
            log.warning("notifications wait for the run store", error=detail(exc))

    def start(self) -> Notifier:
        """Look every `every` seconds in a thread of its own, until `close`."""
        self._thread = threading.Thread(target=self._run, name="minions-notify", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(self.every)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)
        if self._client is not None:
            self._client.close()
