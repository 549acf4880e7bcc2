"""Named API keys with roles, kept in the run store (their own table, ``minions_keys``).

A room: its functions take the `Database` first (`RunStore` reaches them through ``await
self._database.apply(...)``). A key is 32 random bytes (``mk_`` and 43 URL-safe characters);
the store keeps only its SHA-256 and finds a key by that hash. No slow key-derivation function:
those exist to make guessing *low-entropy* secrets (passwords) expensive, while a key of 256
random bits cannot be guessed at any cost, and a KDF would cost every request its time. The
lookup by hash is what makes the comparison safe from timing: an attacker who times it learns,
at best, a prefix of a hash of their own guess, never a prefix of a real key.

A revoked key keeps its row (its name is in the history of what it did) with `revoked_at`
set; a name is taken by at most one key that is not revoked (a unique index over the names
of live keys), so a person's key can be replaced under the same name.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import sqlalchemy as sa

from minions.errors import KeyExistsError, UnknownKeyError
from minions.runs import _audit
from minions.runs._db import Database
from minions.runs._projects import DEFAULT_PROJECT, check_project

__all__ = ["ROLES", "KeyRecord", "NewKey", "Role"]

Role = Literal["viewer", "approver", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
"""The roles, each allowed what the ones before it are, and more: viewer (read), approver
(+ decide approvals), operator (+ submit, cancel, resume, rerun, schedules), admin (+ keys,
prune, settings)."""
PREFIX = "mk_"
"""Every key starts with this (so that secret scanners and people know one when they see
it)."""
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
"""A key's name: what the history says did a thing (``alice``, ``ci-deploy``)."""
RESERVED = frozenset({"token", "cli", "schedule", "system"})
"""Names of actors that are not keys (see docs/access.md)."""

keys_metadata = sa.MetaData()
keys_table = sa.Table(
    "minions_keys",
    keys_metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("hash", sa.Text, nullable=False, unique=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("projects", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("created_by", sa.Text, nullable=True),
    sa.Column("revoked_at", sa.Float, nullable=True),
    sa.Column("revoked_by", sa.Text, nullable=True),
    sa.Index(
        "ix_minions_keys_live_name",
        "name",
        unique=True,
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    ),
)

_ready: weakref.WeakSet[Database] = weakref.WeakSet()
"""The stores whose keys table is known to exist (made on first use: a store of an older
minions gets it empty)."""


@dataclass(frozen=True, kw_only=True)
class KeyRecord:
    """An API key as stored (never the key itself).

    Attributes:
        id: the key's public id (stream tickets name it).
        name: who the key is: the actor its requests are recorded as.
        role: what it may do (see `ROLES`).
        projects: the projects it sees and acts in (an admin key: every one).
        created_by: the actor that added it.
        revoked_at: when it was revoked (None: it works).
    """

    id: str
    name: str
    role: Role
    projects: tuple[str, ...] = ()
    created_at: float = 0.0
    created_by: str | None = None
    revoked_at: float | None = None
    revoked_by: str | None = None


@dataclass(frozen=True, kw_only=True)
class NewKey:
    """A key just added: its record and the key itself, which is shown this once."""

    record: KeyRecord
    key: str = field(repr=False)


def key_hash(key: str) -> str:
    """The SHA-256 of a key, as stored (hex)."""
    return hashlib.sha256(key.encode("utf-8", errors="replace")).hexdigest()


def check_name(name: str) -> str:
    """`name`, when it can name a key.

    Raises:
        ValueError: it cannot (the message says why).
    """
    if not NAME.fullmatch(name):
        raise ValueError(
            f"key name {name!r}: use 1 to 64 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or a digit"
        )
    if name in RESERVED:
        raise ValueError(
            f"key name {name!r} is reserved for actors that are not keys; choose another"
        )
    return name


def check_role(role: str) -> Role:
    """`role`, when it is one.

    Raises:
        ValueError: it is not.
    """
    for known in ROLES:
        if role == known:
            return known
    raise ValueError(f"unknown role {role!r}; one of: {', '.join(ROLES)}")


def check_projects(projects: Sequence[str]) -> tuple[str, ...]:
    """The projects, in order, each once.

    Raises:
        ValueError: one is not a project name.
    """
    for project in projects:
        check_project(project)
    return tuple(dict.fromkeys(projects)) or (DEFAULT_PROJECT,)


def _ensure(database: Database) -> None:
    """Make the keys table when the store has none (adding a key does)."""
    if database in _ready:
        return
    with database.begin() as db:
        if database.postgres:
            db.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('minions_schema'))"))
        keys_metadata.create_all(db)
    _ready.add(database)


def _exists(database: Database) -> bool:
    """Whether the store has the keys table (reading never makes it)."""
    if database in _ready:
        return True
    with database.read() as db:
        found = sa.inspect(db).has_table(keys_table.name)
    if found:
        _ready.add(database)
    return found


def add(
    database: Database,
    name: str,
    *,
    role: str,
    projects: Sequence[str] = (),
    actor: str | None = None,
    audit: Mapping[str, Any] | None = None,
) -> NewKey:
    """Add a key: a new random key, of which only the hash is stored (with its `audit`
    entry, in one transaction).

    Raises:
        ValueError: the name, role or a project is not valid.
        KeyExistsError: a key that is not revoked has this name.
    """
    row = {
        "id": secrets.token_hex(8),
        "name": check_name(name),
        "role": check_role(role),
        "projects": json.dumps(list(check_projects(projects))),
        "created_at": time.time(),
        "created_by": actor,
    }
    key = PREFIX + secrets.token_urlsafe(32)
    _ensure(database)
    try:
        with database.begin() as db:
            db.execute(keys_table.insert().values(**row, hash=key_hash(key)))
            _audit.write(db, audit)
    except sa.exc.IntegrityError:
        raise KeyExistsError(name) from None
    return NewKey(record=_record(row), key=key)


def listed(database: Database, *, revoked: bool = False) -> list[KeyRecord]:
    """The keys that work (and the revoked ones too, when `revoked`), by name."""
    if not _exists(database):
        return []
    query = sa.select(keys_table).order_by(keys_table.c.name, keys_table.c.created_at)
    if not revoked:
        query = query.where(keys_table.c.revoked_at.is_(None))
    with database.read() as db:
        return [_record(row._mapping) for row in db.execute(query)]


def revoke(
    database: Database,
    name: str,
    *,
    actor: str | None = None,
    audit: Mapping[str, Any] | None = None,
) -> KeyRecord:
    """Revoke the key of that name: it fails from its next request on (with its `audit`
    entry, in one transaction).

    Raises:
        UnknownKeyError: no key that is not revoked has this name.
    """
    if not _exists(database):
        raise UnknownKeyError(name)
    table = keys_table.c
    with database.begin() as db:
        row = db.execute(
            keys_table.update()
            .where(table.name == name, table.revoked_at.is_(None))
            .values(revoked_at=time.time(), revoked_by=actor)
            .returning(*keys_table.c)
        ).one_or_none()
        if row is not None:
            _audit.write(db, audit)
    if row is None:
        raise UnknownKeyError(name)
    return _record(row._mapping)


def by_key(database: Database, key: str) -> KeyRecord | None:
    """The key that works whose hash is `key`'s, or None (one indexed read)."""
    if not key.startswith(PREFIX) or len(key) > 100:
        return None
    return _working(database, keys_table.c.hash == key_hash(key))


def by_name(database: Database, name: str) -> KeyRecord | None:
    """The key that works with this name, or None."""
    return _working(database, keys_table.c.name == name) if NAME.fullmatch(name) else None


def by_id(database: Database, key_id: str) -> KeyRecord | None:
    """The key that works with this id, or None."""
    return _working(database, keys_table.c.id == key_id)


def _working(database: Database, which: sa.ColumnElement[bool]) -> KeyRecord | None:
    """The key that works and is `which`, or None."""
    if not _exists(database):
        return None
    with database.read() as db:
        row = db.execute(
            sa.select(keys_table).where(which, keys_table.c.revoked_at.is_(None))
        ).one_or_none()
    return None if row is None else _record(row._mapping)


def _record(row: Mapping[Any, Any]) -> KeyRecord:
    return KeyRecord(
        id=row["id"],
        name=row["name"],
        role=check_role(row["role"]),
        projects=tuple(json.loads(row["projects"])),
        created_at=row["created_at"],
        created_by=row["created_by"],
        revoked_at=row.get("revoked_at"),
        revoked_by=row.get("revoked_by"),
    )
