"""minions' own tables beside DBOS's, their schema version and migrations, and the records the
store reads them into. JSON, never pickle.

The durable format has its own version (`SCHEMA_VERSION`, kept in ``minions_meta``), apart from
the package's: upgrading minions changes nothing stored unless the format changes, and then the
store migrates itself when a worker or a submission opens it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa

__all__: list[str] = []

SCHEMA_VERSION = 3
"""1: the first durable runs. 2: leases with an epoch (fencing), attempts, the log's head
(`last_seq`), request hashes of idempotency keys, loop item checkpoints, worker incarnations;
every id column is TEXT (Postgres refused ids over 200 characters). 3: reruns (a run's
parent, the step it reran from, its plan); the step cache."""

Status = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]
STATUSES: tuple[Status, ...] = ("queued", "running", "waiting", "completed", "failed", "cancelled")
ACTIVE: tuple[Status, ...] = ("queued", "running", "waiting")
"""A run in one of these has not ended: a worker runs it, or will."""
HELD: tuple[Status, ...] = ("running", "waiting")
"""A run in one of these is held by a worker's lease."""
TERMINAL = frozenset({"completed", "failed", "cancelled"})

metadata = sa.MetaData()

meta_table = sa.Table(
    "minions_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
runs_table = sa.Table(
    "minions_runs",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("recipe_id", sa.Text, nullable=False, index=True),
    sa.Column("recipe_yaml", sa.Text, nullable=False),
    sa.Column("recipe_path", sa.Text, nullable=True),
    sa.Column("recipe_hash", sa.Text, nullable=False),
    sa.Column("inputs", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("output", sa.Text, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("usage", sa.Text, nullable=True),
    sa.Column("idempotency_key", sa.Text, nullable=True, unique=True),
    sa.Column("request_hash", sa.Text, nullable=True),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, default=False),
    sa.Column("executor_id", sa.Text, nullable=True),
    sa.Column("starts", sa.Integer, nullable=False, default=0),
    # The lifecycle (schema 2): who holds the run, under which epoch (every write of the
    # holder names it, so a holder that lost the run writes nothing), until when; which
    # attempt (DBOS workflow) is current; the number of the last stored event.
    sa.Column("holder", sa.Text, nullable=True),
    sa.Column("epoch", sa.Integer, nullable=False, default=0),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("attempt", sa.Integer, nullable=False, default=1),
    sa.Column("recoveries", sa.Integer, nullable=False, default=0),
    sa.Column("last_seq", sa.Integer, nullable=False, default=0),
    # A rerun (schema 3): the run it reran, the step it reran from, and its plan (JSON: the
    # steps it reuses from the parent, outputs set by hand, the steps changed and why).
    sa.Column("parent_run_id", sa.Text, nullable=True),
    sa.Column("from_step", sa.Text, nullable=True),
    sa.Column("rerun", sa.Text, nullable=True),
)
steps_table = sa.Table(
    "minions_steps",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("step_id", sa.Text, primary_key=True),
    sa.Column("visit", sa.Integer, primary_key=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("execution", sa.Text, nullable=False),
    sa.Column("routing", sa.Text, nullable=True),
    sa.Column("saved_at", sa.Float, nullable=False),
    # A loop item's checkpoint: its step id is the execution's name, ``step[index]``.
    sa.Column("item", sa.Integer, nullable=True),
)
events_table = sa.Table(
    "minions_events",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("step_id", sa.Text, nullable=True),
    sa.Column("data", sa.Text, nullable=False),
)
approvals_table = sa.Table(
    "minions_approvals",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("call_id", sa.Text, primary_key=True),
    sa.Column("step_id", sa.Text, nullable=False),
    sa.Column("tool", sa.Text, nullable=False),
    sa.Column("arguments", sa.Text, nullable=False),
    sa.Column("requested_at", sa.Float, nullable=False),
    sa.Column("decided_at", sa.Float, nullable=True),
    sa.Column("approved", sa.Boolean, nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
)
workers_table = sa.Table(
    "minions_workers",
    metadata,
    sa.Column("executor_id", sa.Text, primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("stopped_at", sa.Float, nullable=True),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("runs", sa.Text, nullable=False, default="[]"),
    sa.Column("incarnation", sa.Text, nullable=True),
    sa.Column("host", sa.Text, nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
)
step_cache_table = sa.Table(
    "minions_step_cache",
    metadata,
    # Schema 3: the step cache of durable runs, shared by every worker of the store.
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("step_id", sa.Text, nullable=False),
    sa.Column("output", sa.Text, nullable=False),
    sa.Column("next_step", sa.Text, nullable=True),
    sa.Column("usage", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
OURS = frozenset(t.name for t in metadata.sorted_tables)


def _to_2(db: sa.Connection) -> None:
    """Schema 1 -> 2: the lifecycle columns, loop items, worker incarnations, TEXT ids."""
    postgres = db.dialect.name == "postgresql"
    added = {
        "minions_runs": [
            "request_hash TEXT",
            "holder TEXT",
            "epoch INTEGER NOT NULL DEFAULT 0",
            "lease_until FLOAT",
            "attempt INTEGER NOT NULL DEFAULT 1",
            "recoveries INTEGER NOT NULL DEFAULT 0",
            "last_seq INTEGER NOT NULL DEFAULT 0",
        ],
        "minions_steps": ["item INTEGER"],
        "minions_workers": ["incarnation TEXT", "host TEXT", "pid INTEGER"],
    }
    for table, columns in added.items():
        for column in columns:
            db.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN {column}"))
    db.execute(
        sa.text(
            "UPDATE minions_runs SET last_seq = COALESCE((SELECT MAX(e.seq) FROM minions_events e "
            "WHERE e.run_id = minions_runs.run_id), 0)"
        )
    )
    if postgres:  # SQLite never enforced the lengths
        for known in metadata.sorted_tables:
            for col in known.columns:
                if isinstance(col.type, sa.Text) and known.name != "minions_meta":
                    db.execute(
                        sa.text(f"ALTER TABLE {known.name} ALTER COLUMN {col.name} TYPE TEXT")
                    )


def _to_3_rerun(db: sa.Connection) -> None:
    """Schema 2 -> 3 (reruns): a run's parent, the step it reran from, its plan."""
    for column in ("parent_run_id TEXT", "from_step TEXT", "rerun TEXT"):
        db.execute(sa.text(f"ALTER TABLE minions_runs ADD COLUMN {column}"))


def _to_3(db: sa.Connection) -> None:
    """Schema 2 -> 3."""
    _to_3_rerun(db)


MIGRATIONS: dict[int, Any] = {1: _to_2, 2: _to_3}
"""Schema version n -> n+1 upgrades, each a function of a connection."""


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """A finished step execution as stored: what `minions runs show` lists."""

    step_id: str
    visit: int
    status: str
    output: Any = None
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    attempts: int = 1
    items: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    duration: float | None = None
    reused_from: str | None = None
    """For a step a rerun reused (status ``reused``): the run that executed it."""
    reused_usage: dict[str, int] = field(default_factory=dict)
    """For a reused step: the usage of its original execution (its own `usage` is zero)."""


@dataclass(frozen=True, kw_only=True)
class ApprovalRecord:
    """A call that waits (or waited) for a person's decision."""

    call_id: str
    step_id: str
    tool: str
    arguments: dict[str, Any]
    requested_at: float
    decided_at: float | None = None
    approved: bool | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A run as stored.

    Attributes:
        attempt: 1, then one more each time the run was resumed or taken over from a worker
            that died.
        executor_id: the worker that runs it (or ran it last).
    """

    run_id: str
    recipe_id: str
    status: str
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    recipe_path: str | None = None
    recipe_hash: str = ""
    executor_id: str | None = None
    cancel_requested: bool = False
    attempt: int = 1
    steps: tuple[StepRecord, ...] = ()
    approvals: tuple[ApprovalRecord, ...] = ()
    parent_run_id: str | None = None
    """For a rerun: the run it reran."""
    from_step: str | None = None
    """For a rerun: the step it reran from."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True, kw_only=True)
class WorkerRecord:
    """A worker as its heartbeats tell of it."""

    executor_id: str
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    version: str
    runs: list[str]
    alive: bool = False
    """It beat within the dead-worker timeout and did not stop."""
