"""The endpoints' tables: the places of limited model endpoints shared by every worker of a
store (gates, calls in flight, the line of waiters), and what each endpoint taught the
structured-output ladder (`EndpointRecord`).

Taking a place is one transaction that writes first (it locks the endpoint's gate row: on
SQLite the write lock, on Postgres the row lock), so takers of one endpoint take turns over
every process: it drops calls out of the window and places whose holder died (their lease ran
out), puts the caller in line (or keeps it there), and grants a place only when the limits
hold for the caller and every caller ahead of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

import sqlalchemy as sa

from minions._messages import OutputMode
from minions.runs._db import Database
from minions.runs._tables import (
    capabilities_table,
    endpoint_calls_table,
    endpoint_gates_table,
    endpoint_waiters_table,
)

if TYPE_CHECKING:
    from minions.models._limits import EndpointLimit, EndpointWait

__all__ = ["EndpointRecord"]

calls, gates, waiters = endpoint_calls_table, endpoint_gates_table, endpoint_waiters_table


def _lock_gate(db: sa.Connection, database: Database, match: str) -> None:
    """Write the endpoint's gate row first: every taker of the endpoint waits here for the
    one before it."""
    touch = gates.update().where(gates.c.endpoint == match).values(endpoint=match)
    if db.execute(touch).rowcount:
        return
    db.execute(database.insert_ignoring_conflicts(gates, {"endpoint": match, "paused_until": 0.0}))
    db.execute(touch)


def take(
    database: Database,
    rule: EndpointLimit,
    *,
    ticket: str,
    holder: str,
    tokens: int,
    now: float,
    lease: float,
    line_ttl: float,
) -> EndpointWait | None:
    """Take a place under `rule` for the call `ticket` (``None``), or say why it waits (it
    stays in line, seen now). A taken place is in flight until `lease` seconds from `now`
    unless renewed (`renew`)."""
    # Loaded by a worker with limits only (a store that lists endpoints needs none of it).
    from minions.models._limits import WINDOW, blocked

    match = rule.match
    with database.begin() as db:
        _lock_gate(db, database, match)
        db.execute(
            calls.delete().where(
                calls.c.endpoint == match,
                sa.or_(
                    sa.and_(calls.c.lease_until.is_(None), calls.c.started_at <= now - WINDOW),
                    calls.c.lease_until < now,
                ),
            )
        )
        db.execute(
            waiters.delete().where(waiters.c.endpoint == match, waiters.c.seen_at < now - line_ttl)
        )
        mine = (waiters.c.endpoint == match) & (waiters.c.ticket == ticket)
        since = db.execute(sa.select(waiters.c.since).where(mine)).scalar()
        if since is None:
            since = now
            db.execute(
                waiters.insert().values(
                    endpoint=match, ticket=ticket, since=now, seen_at=now, tokens=tokens
                )
            )
        else:
            db.execute(waiters.update().where(mine).values(seen_at=now))
        ahead, ahead_tokens = db.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(waiters.c.tokens), 0)).where(
                waiters.c.endpoint == match,
                sa.or_(
                    waiters.c.since < since,
                    sa.and_(waiters.c.since == since, waiters.c.ticket < ticket),
                ),
            )
        ).one()
        in_flight = db.execute(
            sa.select(sa.func.count()).where(
                calls.c.endpoint == match, calls.c.lease_until.is_not(None)
            )
        ).scalar_one()
        requests, used, oldest = db.execute(
            sa.select(
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(calls.c.tokens), 0),
                sa.func.min(calls.c.started_at),
            ).where(calls.c.endpoint == match, calls.c.started_at > now - WINDOW)
        ).one()
        paused_until = db.execute(
            sa.select(gates.c.paused_until).where(gates.c.endpoint == match)
        ).scalar_one()
        # The callers ahead go first: this one may go now only if there is room for them too.
        wait = blocked(
            rule,
            now=now,
            in_flight=in_flight + ahead,
            requests=requests + ahead,
            tokens_used=int(used) + int(ahead_tokens),
            oldest=oldest,
            paused_until=paused_until,
            tokens=tokens,
        )
        if wait is not None:
            return wait
        db.execute(waiters.delete().where(mine))
        db.execute(
            calls.insert().values(
                call_id=ticket,
                endpoint=match,
                holder=holder,
                started_at=now,
                tokens=tokens,
                lease_until=now + lease,
            )
        )
        return None


def give_back(database: Database, match: str, ticket: str, tokens: int | None) -> None:
    """The call `ticket` ended (it cost `tokens`; ``None``: as estimated), or its caller
    stopped waiting: its place is free, and it leaves the line."""
    with database.begin() as db:
        values: dict[str, Any] = {"lease_until": None}
        if tokens is not None:
            values["tokens"] = tokens
        db.execute(calls.update().where(calls.c.call_id == ticket).values(**values))
        db.execute(waiters.delete().where(waiters.c.endpoint == match, waiters.c.ticket == ticket))


def renew(database: Database, tickets: list[str], until: float) -> None:
    """Keep the places of `tickets` in flight until `until` (a worker's heartbeat)."""
    if not tickets:
        return
    with database.begin() as db:
        db.execute(
            calls.update()
            .where(calls.c.call_id.in_(tickets), calls.c.lease_until.is_not(None))
            .values(lease_until=until)
        )


def pause(database: Database, match: str, until: float) -> None:
    """Send no call under the entry `match` before `until` (a 429's ``Retry-After``)."""
    with database.begin() as db:
        _lock_gate(db, database, match)
        db.execute(
            gates.update()
            .where(gates.c.endpoint == match, gates.c.paused_until < until)
            .values(paused_until=until)
        )


# -- what endpoints taught -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Capability:
    """What one endpoint taught the structured-output ladder, as stored."""

    base_url: str
    model: str
    rejected: frozenset[str]
    """Features it refused (rungs of the ladder, ``tools``, ``stream_options``)."""
    worked: OutputMode | None
    """The mode that last produced valid output."""
    learned_at: float


@dataclass(frozen=True, kw_only=True)
class EndpointRecord:
    """What a model endpoint taught the structured-output ladder, kept in the store so every
    worker and later run starts at the mode that worked (`minions endpoints list`)."""

    base_url: str
    model: str
    rejected: tuple[str, ...]
    """Features it refused: rungs of the ladder (``json_schema``, ``tool``), ``tools`` (it
    ignores tools altogether), ``stream_options``."""
    output_mode: str | None
    """The structured-output mode that last produced valid output."""
    learned_at: float
    expires_at: float
    """After this it is learned again."""


def learned(database: Database, *, expiry: float, now: float) -> list[EndpointRecord]:
    """What endpoints taught within `expiry` seconds before `now`, as shown."""
    return [
        EndpointRecord(
            base_url=c.base_url,
            model=c.model,
            rejected=tuple(sorted(c.rejected)),
            output_mode=c.worked,
            learned_at=c.learned_at,
            expires_at=c.learned_at + expiry,
        )
        for c in capabilities(database, since=now - expiry)
    ]


def capabilities(database: Database, *, since: float) -> list[Capability]:
    """What endpoints taught, learned after `since` (older entries have expired)."""
    with database.read() as db:
        rows = db.execute(
            sa.select(capabilities_table)
            .where(capabilities_table.c.learned_at > since)
            .order_by(capabilities_table.c.base_url, capabilities_table.c.model)
        ).all()
    modes = get_args(OutputMode)
    return [
        Capability(
            base_url=row.base_url,
            model=row.model,
            rejected=frozenset(json.loads(row.rejected)),
            worked=row.worked if row.worked in modes else None,
            learned_at=row.learned_at,
        )
        for row in rows
    ]


def save_capability(
    database: Database,
    key: tuple[str, str],
    rejected: frozenset[str],
    worked: OutputMode | None,
    now: float,
) -> None:
    """Keep what `key` (base URL, model) taught."""
    values = {"rejected": json.dumps(sorted(rejected)), "worked": worked, "learned_at": now}
    where = (capabilities_table.c.base_url == key[0]) & (capabilities_table.c.model == key[1])
    with database.begin() as db:
        if not db.execute(capabilities_table.update().where(where).values(**values)).rowcount:
            db.execute(
                database.insert_ignoring_conflicts(
                    capabilities_table, {"base_url": key[0], "model": key[1], **values}
                )
            )


def forget_capabilities(database: Database, base_url: str, model: str | None) -> int:
    """Forget what the endpoint taught (every model it serves when `model` is ``None``);
    how many endpoints were forgotten."""
    where = capabilities_table.c.base_url == base_url
    if model is not None:
        where = where & (capabilities_table.c.model == model)
    with database.begin() as db:
        return int(db.execute(capabilities_table.delete().where(where)).rowcount)
