"""The audit log: who changed what, when, and from where (the ``minions_audit`` table).

A room: its functions take the `Database` first, except `write`, which joins the caller's
transaction, so that a state change and its entry commit together or not at all (the room
that changes a run, an approval, a schedule or a key writes its entry with `write` over its
own connection). Entries are only added, and deleted by age (`prune`, the audit's own
retention horizon), never changed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import sqlalchemy as sa

from minions.runs._db import Database
from minions.runs._tables import audit_table

__all__ = ["AUDIT_ACTIONS", "Actor", "AuditEntry"]

AuditAction = Literal[
    "run.submit",
    "run.rerun",
    "run.cancel",
    "run.resume",
    "approval.approve",
    "approval.reject",
    "schedule.add",
    "schedule.replace",
    "schedule.pause",
    "schedule.resume",
    "schedule.remove",
    "eval.start",
    "eval.finish",
    "history.prune",
    "audit.prune",
    "endpoint.forget",
    "endpoint.lift",
    "cache.clear",
    "key.add",
    "key.revoke",
]
ACTIONS: tuple[AuditAction, ...] = get_args(AuditAction)
"""Every action the audit log records (``family.verb``: a filter may name a family)."""
AUDIT_ACTIONS = ACTIONS
FAMILIES = frozenset(action.split(".")[0] for action in ACTIONS)
SYSTEM = "system"
"""The actor of what a worker does by itself (its retention's prunes)."""
BATCH = 5000
"""Entries deleted per transaction by `prune`."""


@dataclass(frozen=True, kw_only=True)
class Actor:
    """Who makes a change, and from where: what the audit log records of it.

    Attributes:
        name: a key's name, ``token``, ``cli:USER``, ``schedule:NAME``, ``system`` (None:
            not known).
        address: where the change came from: the client's address for the service, the
            machine's name for a command run on the store.
        project: the project the change is in.
    """

    name: str | None = None
    address: str | None = None
    project: str = "default"

    @classmethod
    def of(cls, actor: str | Actor | None) -> Actor:
        """`actor` as an `Actor` (a name alone comes from nowhere known)."""
        return actor if isinstance(actor, Actor) else cls(name=actor)


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """One state change, as the audit log keeps it.

    Attributes:
        id: its place in the log (later changes have larger ids).
        at: when (Unix seconds).
        actor: who (`Actor.name`; None: not known).
        address: from where (`Actor.address`).
        action: what (one of `ACTIONS`).
        target: what it changed: a run's id, a schedule's or a key's name, ``runs``.
        project: the project of the change.
        detail: what else the change said (the call decided and why, a prune's counts).
    """

    id: int
    at: float
    actor: str | None
    address: str | None
    action: str
    target: str
    project: str = "default"
    detail: dict[str, Any] = field(default_factory=dict)


def check_action(action: str) -> str:
    """`action`, when it is one of `ACTIONS` or a family of them (``run``, ``schedule``...).

    Raises:
        ValueError: it is neither (the message lists them).
    """
    if action in ACTIONS or action in FAMILIES:
        return action
    raise ValueError(
        f"unknown action {action!r}; one of: {', '.join(ACTIONS)} (or a family: "
        f"{', '.join(sorted(FAMILIES))})"
    )


def entry(
    action: AuditAction,
    target: str,
    actor: str | Actor | None,
    /,
    **detail: Any,
) -> dict[str, Any]:
    """The row of an entry for `write` (the details given as None are left out)."""
    who = Actor.of(actor)
    told = {k: v for k, v in detail.items() if v is not None}
    return {
        "action": action,
        "target": target,
        "actor": who.name,
        "address": who.address,
        "project": who.project,
        "detail": json.dumps(told, default=str) if told else None,
    }


def told(row: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """The entry `row` (`entry`) with `more` in its detail: what the change turned out to
    do (how many it deleted), known only in its transaction."""
    detail = {**json.loads(row.get("detail") or "{}"), **more}
    return {**row, "detail": json.dumps(detail, default=str)}


def write(db: sa.Connection, row: Mapping[str, Any] | None, *, project: str | None = None) -> None:
    """Add the entry `row` (`entry`) in the caller's transaction (None: nothing); `project`:
    the project of what changed, as the room read it in that transaction (over the
    actor's, which only says where a new thing goes)."""
    if row is not None:
        values = dict(row) if project is None else {**row, "project": project}
        db.execute(audit_table.insert().values(**values, at=time.time()))


def add(database: Database, row: Mapping[str, Any]) -> None:
    """Add the entry `row` in a transaction of its own (a change that made none: a
    schedule's removal is one statement of its room)."""
    with database.begin() as db:
        write(db, row)


def listed(
    database: Database,
    *,
    since: float | None = None,
    actor: str | None = None,
    action: str | None = None,
    project: str | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """The entries at or after `since`, of `actor`, of `action` (or its family), in
    `project`, newest first; `before` (an entry's id) continues after a page's last one."""
    table = audit_table.c
    query = sa.select(audit_table).order_by(table.id.desc()).limit(limit)
    if since is not None:
        query = query.where(table.at >= since)
    if actor is not None:
        query = query.where(table.actor == actor)
    if action is not None:
        if action in FAMILIES:
            query = query.where(table.action.startswith(action + ".", autoescape=True))
        else:
            query = query.where(table.action == action)
    if project is not None:
        query = query.where(table.project == project)
    if before is not None:
        query = query.where(table.id < before)
    with database.read() as db:
        return [_record(row) for row in db.execute(query)]


def prune(database: Database, *, before: float, audit: Mapping[str, Any] | None = None) -> int:
    """Delete the entries older than `before` (Unix seconds), a batch per transaction; how
    many. `audit`: the prune's own entry (``audit.prune``), written with how many it
    deleted in the transaction of its last batch, when it deleted some (the entry is newer
    than `before`: no prune deletes its own record)."""
    table = audit_table.c
    deleted = 0
    while True:
        with database.begin() as db:
            ids = sa.select(table.id).where(table.at < before).limit(BATCH).scalar_subquery()
            gone = db.execute(audit_table.delete().where(table.id.in_(ids))).rowcount
            deleted += gone
            if gone < BATCH:
                if audit is not None and deleted:
                    write(db, told(audit, entries=deleted))
                return deleted


def _record(row: Any) -> AuditEntry:
    return AuditEntry(
        id=row.id,
        at=row.at,
        actor=row.actor,
        address=row.address,
        action=row.action,
        target=row.target,
        project=row.project,
        detail=json.loads(row.detail) if row.detail else {},
    )
