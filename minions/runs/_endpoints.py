"""The endpoints' tables: the places of limited model endpoints shared by every worker of a
store (gates, calls in flight, the line of waiters), and what each endpoint taught the
structured-output ladder (`EndpointRecord`, with its evidence: `Lesson`); a 429's pause of an
endpoint, bounded and attributed (`EndpointPause`).

Taking a place is one transaction that writes first (it locks the endpoint's gate row: on
SQLite the write lock, on Postgres the row lock), so takers of one endpoint take turns over
every process: it drops calls out of the window and places whose holder died (their lease ran
out), puts the caller in line (or keeps it there), and grants a place only when the limits
hold for the caller and every caller ahead of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import sqlalchemy as sa

from minions._messages import OutputMode
from minions.runs import _audit
from minions.runs._db import Database
from minions.runs._tables import (
    capabilities_table,
    capability_strikes_table,
    endpoint_calls_table,
    endpoint_gates_table,
    endpoint_waiters_table,
)

if TYPE_CHECKING:
    from minions.models import EndpointLimit, EndpointWait, Evidence

__all__ = ["EndpointPause", "EndpointRecord", "Lesson"]

calls, gates, waiters = endpoint_calls_table, endpoint_gates_table, endpoint_waiters_table
strikes = capability_strikes_table


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
    max_pause: float = float("inf"),
) -> EndpointWait | None:
    """Take a place under `rule` for the call `ticket` (``None``), or say why it waits (it
    stays in line, seen now). A taken place is in flight until `lease` seconds from `now`
    unless renewed (`renew`). A pause holds at most `max_pause` seconds from when it was set
    (a worker whose limits allow less obeys its own bound)."""
    # Loaded by a worker with limits only (a store that lists endpoints needs none of it).
    from minions.models._internal import WINDOW, blocked

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
        paused_until, paused_at = db.execute(
            sa.select(gates.c.paused_until, gates.c.paused_at).where(gates.c.endpoint == match)
        ).one()
        if paused_at is not None:
            paused_until = min(paused_until, paused_at + max_pause)
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


def pause(
    database: Database,
    match: str,
    until: float,
    *,
    by: str | None = None,
    asked: float | None = None,
    now: float | None = None,
) -> None:
    """Send no call under the entry `match` before `until` (a 429's ``Retry-After``, capped
    by the caller): set at `now` by the run `by`, the endpoint having `asked` for that many
    seconds. A later pause that ends sooner changes nothing."""
    with database.begin() as db:
        _lock_gate(db, database, match)
        db.execute(
            gates.update()
            .where(gates.c.endpoint == match, gates.c.paused_until < until)
            .values(paused_until=until, paused_by=by, paused_at=now, pause_asked=asked)
        )


@dataclass(frozen=True, kw_only=True)
class EndpointPause:
    """A limited endpoint paused after a 429, as the store keeps it (`RunStore.pauses`).

    Attributes:
        endpoint: the entry of the limits it holds (its ``match``), without credentials.
        until: no call under it goes before this (Unix seconds).
        paused_at: when it was set (``None``: a store of before schema 9).
        paused_by: the run whose call was answered 429 (``None``: not a durable run's).
        asked: the seconds the endpoint's ``Retry-After`` asked (the pause is at most the
            limits' `max_pause` of the worker that set it).
    """

    endpoint: str
    until: float
    paused_at: float | None
    paused_by: str | None
    asked: float | None


def pauses(database: Database, *, now: float) -> list[EndpointPause]:
    """The endpoints paused at `now`."""
    from minions._text import redact_url

    with database.read() as db:
        rows = db.execute(
            sa.select(gates).where(gates.c.paused_until > now).order_by(gates.c.endpoint)
        ).all()
    return [
        EndpointPause(
            endpoint=redact_url(row.endpoint),
            until=float(row.paused_until),
            paused_at=row.paused_at,
            paused_by=row.paused_by,
            asked=row.pause_asked,
        )
        for row in rows
    ]


def lift_pauses(
    database: Database,
    base_url: str,
    model: str | None,
    *,
    now: float,
    audit: Mapping[str, Any] | None = None,
) -> int:
    """Lift the pauses that hold calls to the endpoint (to every model it serves when
    `model` is ``None``; to `model`: the base URL's entry and the model's own); how many
    were in force. `audit`: its entry, written with that count in the same transaction."""
    if model is None:
        which = sa.or_(
            gates.c.endpoint == base_url,
            gates.c.endpoint.startswith(f"{base_url}#", autoescape=True),
        )
    else:
        which = gates.c.endpoint.in_([base_url, f"{base_url}#{model}"])
    with database.begin() as db:
        lifted = int(
            db.execute(
                gates.update()
                .where(which, gates.c.paused_until > now)
                .values(paused_until=0.0, paused_by=None, paused_at=None, pause_asked=None)
            ).rowcount
        )
        _audit.write(db, audit and _audit.told(audit, lifted=lifted))
        return lifted


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
    evidence: dict[str, Evidence]
    """Why each refused feature is refused (none for a lesson of before schema 9)."""


@dataclass(frozen=True, kw_only=True)
class Lesson:
    """Why an endpoint's feature is refused for every run, and since when.

    Attributes:
        feature: a rung of the ladder (``json_schema``, ``tool``), ``tools`` or
            ``stream_options``.
        cause: ``refused``: the server refused it on the wire (HTTP 400 naming it);
            ``ignored``: answers of several runs ignored it (prose, twice in a row each);
            ``unknown``: learned by a minions that kept no evidence.
        since: when (Unix seconds; for ``ignored``, the first of the runs).
        runs: for ``ignored``, the runs whose answers ignored it.
        detail: for ``refused``, what the server said.
        expires_at: after this it is learned again.
    """

    feature: str
    cause: Literal["refused", "ignored", "unknown"]
    since: float
    runs: tuple[str, ...]
    detail: str
    expires_at: float


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
    lessons: tuple[Lesson, ...] = ()
    """Why each of `rejected` is refused, and since when."""


def learned(database: Database, *, expiry: float, now: float) -> list[EndpointRecord]:
    """What endpoints taught within `expiry` seconds before `now`, as shown."""
    found = []
    for c in capabilities(database, since=now - expiry):
        lessons = []
        for feature in sorted(c.rejected):
            why = c.evidence.get(feature)
            since = c.learned_at if why is None else why.since
            lessons.append(
                Lesson(
                    feature=feature,
                    cause="unknown" if why is None else why.cause,
                    since=since,
                    runs=() if why is None else why.runs,
                    detail="" if why is None else why.detail,
                    expires_at=since + expiry,
                )
            )
        found.append(
            EndpointRecord(
                base_url=c.base_url,
                model=c.model,
                rejected=tuple(sorted(c.rejected)),
                output_mode=c.worked,
                learned_at=c.learned_at,
                expires_at=c.learned_at + expiry,
                lessons=tuple(lessons),
            )
        )
    return found


def _evidence(text: str | None) -> dict[str, Evidence]:
    """A row's evidence; what cannot be read (a damaged row) is no evidence."""
    from minions.models import Evidence

    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    found: dict[str, Evidence] = {}
    if not isinstance(data, dict):
        return found
    for feature, why in data.items():
        try:
            cause = why["cause"]
            if cause not in ("refused", "ignored"):
                continue
            found[str(feature)] = Evidence(
                cause=cause,
                since=float(why["since"]),
                runs=tuple(str(run) for run in why.get("runs", ()))[:100],
                detail=str(why.get("detail", ""))[:500],
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return found


def _rejected(text: str) -> frozenset[str]:
    """A row's refused features; a damaged row refuses nothing."""
    try:
        data = json.loads(text)
    except ValueError:
        return frozenset()
    return frozenset(str(f) for f in data) if isinstance(data, list) else frozenset()


def capabilities(database: Database, *, since: float) -> list[Capability]:
    """What endpoints taught, learned after `since` (older entries, and older lessons of an
    entry, have expired)."""
    with database.read() as db:
        rows = db.execute(
            sa.select(capabilities_table)
            .where(capabilities_table.c.learned_at > since)
            .order_by(capabilities_table.c.base_url, capabilities_table.c.model)
        ).all()
    modes = get_args(OutputMode)
    found = []
    for row in rows:
        evidence = _evidence(row.evidence)
        rejected = frozenset(
            f for f in _rejected(row.rejected) if f not in evidence or evidence[f].since > since
        )
        found.append(
            Capability(
                base_url=row.base_url,
                model=row.model,
                rejected=rejected,
                worked=row.worked if row.worked in modes else None,
                learned_at=row.learned_at,
                evidence={f: e for f, e in evidence.items() if f in rejected},
            )
        )
    return found


def save_capability(
    database: Database,
    key: tuple[str, str],
    rejected: frozenset[str],
    worked: OutputMode | None,
    now: float,
    evidence: dict[str, Evidence] | None = None,
) -> None:
    """Keep what `key` (base URL, model) taught, and why."""
    values = {
        "rejected": json.dumps(sorted(rejected)),
        "worked": worked,
        "learned_at": now,
        "evidence": json.dumps(
            {
                feature: {
                    "cause": why.cause,
                    "since": why.since,
                    "runs": list(why.runs),
                    "detail": why.detail,
                }
                for feature, why in sorted((evidence or {}).items())
            }
        ),
    }
    where = (capabilities_table.c.base_url == key[0]) & (capabilities_table.c.model == key[1])
    with database.begin() as db:
        if not db.execute(capabilities_table.update().where(where).values(**values)).rowcount:
            db.execute(
                database.insert_ignoring_conflicts(
                    capabilities_table, {"base_url": key[0], "model": key[1], **values}
                )
            )


def strike(
    database: Database, key: tuple[str, str], mode: str, run_id: str, *, now: float, since: float
) -> dict[str, float]:
    """The run `run_id` saw `mode` of `key` ignored (its own demotion): kept once per run;
    the runs that did so after `since`, with when (older strikes are dropped)."""
    where = (strikes.c.base_url == key[0]) & (strikes.c.model == key[1]) & (strikes.c.mode == mode)
    with database.begin() as db:
        db.execute(
            database.insert_ignoring_conflicts(
                strikes,
                {"base_url": key[0], "model": key[1], "mode": mode, "run_id": run_id, "at": now},
            )
        )
        db.execute(strikes.delete().where(where, strikes.c.at <= since))
        rows = db.execute(sa.select(strikes.c.run_id, strikes.c.at).where(where)).all()
    return {row.run_id: float(row.at) for row in rows}


def forget_capabilities(
    database: Database,
    base_url: str,
    model: str | None,
    *,
    audit: Mapping[str, Any] | None = None,
) -> int:
    """Forget what the endpoint taught (every model it serves when `model` is ``None``);
    how many endpoints were forgotten. `audit`: its entry, written with that count in the
    same transaction."""
    where = capabilities_table.c.base_url == base_url
    struck = strikes.c.base_url == base_url
    if model is not None:
        where = where & (capabilities_table.c.model == model)
        struck = struck & (strikes.c.model == model)
    with database.begin() as db:
        count = int(db.execute(capabilities_table.delete().where(where)).rowcount)
        db.execute(strikes.delete().where(struck))
        _audit.write(db, audit and _audit.told(audit, forgotten=count))
        return count
