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

from minions._fold import RUN_STATUSES, RunStatus
from minions._fold import TERMINAL as TERMINAL

__all__: list[str] = []

SCHEMA_VERSION = 4
"""1: the first durable runs. 2: leases with an epoch (fencing), attempts, the log's head
(`last_seq`), request hashes of idempotency keys, loop item checkpoints, worker incarnations;
every id column is TEXT (Postgres refused ids over 200 characters). 3: schedules, the
schedule of a run, how far pruning went; reruns (a run's parent, the step it reran from, its
plan); the step cache. 4: actors (who queued a run's attempt, who cancelled it, who decided
an approval, who changed a schedule last); the API keys' table (made on first use)."""

Status = RunStatus
STATUSES = RUN_STATUSES
ACTIVE: tuple[Status, ...] = ("queued", "running", "waiting")
"""A run in one of these has not ended: a worker runs it, or will."""
HELD: tuple[Status, ...] = ("running", "waiting")
"""A run in one of these is held by a worker's lease."""

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
    # The schedule that fired it, and for which slot (schema 3).
    sa.Column("schedule", sa.Text, nullable=True, index=True),
    sa.Column("slot", sa.Float, nullable=True),
    # A rerun (schema 3): the run it reran, the step it reran from, and its plan (JSON: the
    # steps it reuses from the parent, outputs set by hand, the steps changed and why).
    sa.Column("parent_run_id", sa.Text, nullable=True),
    sa.Column("from_step", sa.Text, nullable=True),
    sa.Column("rerun", sa.Text, nullable=True),
    # Actors (schema 4): who queued the current attempt (submitted, reran, resumed it), who
    # asked for its cancel.
    sa.Column("queued_by", sa.Text, nullable=True),
    sa.Column("cancelled_by", sa.Text, nullable=True),
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
    sa.Column("decided_by", sa.Text, nullable=True),
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
schedules_table = sa.Table(
    "minions_schedules",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("recipe_id", sa.Text, nullable=False),
    sa.Column("recipe_yaml", sa.Text, nullable=False),
    sa.Column("recipe_path", sa.Text, nullable=True),
    sa.Column("recipe_hash", sa.Text, nullable=False),
    sa.Column("request_hash", sa.Text, nullable=False),
    sa.Column("inputs", sa.Text, nullable=False),
    sa.Column("cron", sa.Text, nullable=True),
    sa.Column("every", sa.Integer, nullable=True),
    sa.Column("timezone", sa.Text, nullable=False),
    sa.Column("catch_up", sa.Text, nullable=False),
    sa.Column("paused", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", sa.Float, nullable=False),
    # Every slot up to `cursor` was fired or skipped; `next_at` is the first slot after it
    # (what a worker's tick looks for). `version` moves on with every change made by a
    # person (pause, resume, add again): a tick that read the schedule before writes nothing.
    sa.Column("cursor", sa.Float, nullable=False),
    sa.Column("next_at", sa.Float, nullable=False, index=True),
    sa.Column("version", sa.Integer, nullable=False, default=1),
    sa.Column("last_slot", sa.Float, nullable=True),
    sa.Column("last_fired_at", sa.Float, nullable=True),
    sa.Column("last_run_id", sa.Text, nullable=True),
    sa.Column("fired", sa.Integer, nullable=False, default=0),
    sa.Column("changed_by", sa.Text, nullable=True),
)
# Limits per model endpoint, over every worker of the store (minions.runs._endpoints). Tables
# only added (no column of an older one changes): a store of this schema version that lacks
# them gets them, empty, when it is opened.
endpoint_gates_table = sa.Table(
    "minions_endpoint_gates",
    metadata,
    # One row per entry of the limits (its `match`): the row every taker of a place locks
    # first, so takers of one endpoint take turns; and a 429's pause.
    sa.Column("endpoint", sa.Text, primary_key=True),
    sa.Column("paused_until", sa.Float, nullable=False, default=0.0),
)
endpoint_calls_table = sa.Table(
    "minions_endpoint_calls",
    metadata,
    # A call under an entry: in flight while `lease_until` is set (renewed by its worker's
    # heartbeat, so a killed process frees its places), then counted in the window only.
    sa.Column("call_id", sa.Text, primary_key=True),
    sa.Column("endpoint", sa.Text, nullable=False, index=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
    sa.Column("lease_until", sa.Float, nullable=True),
)
endpoint_waiters_table = sa.Table(
    "minions_endpoint_waiters",
    metadata,
    # The callers waiting for a place, first come first served over every worker; a waiter
    # not seen for a while (its process died) leaves the line.
    sa.Column("endpoint", sa.Text, primary_key=True),
    sa.Column("ticket", sa.Text, primary_key=True),
    sa.Column("since", sa.Float, nullable=False),
    sa.Column("seen_at", sa.Float, nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
)
capabilities_table = sa.Table(
    "minions_capabilities",
    metadata,
    # What an endpoint taught the structured-output ladder (see CapabilityMemory).
    sa.Column("base_url", sa.Text, primary_key=True),
    sa.Column("model", sa.Text, primary_key=True),
    sa.Column("rejected", sa.Text, nullable=False),
    sa.Column("worked", sa.Text, nullable=True),
    sa.Column("learned_at", sa.Float, nullable=False),
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


def _add_columns(db: sa.Connection, table: str, columns: list[str]) -> None:
    """``ALTER TABLE table ADD COLUMN`` each of `columns` ("name TYPE") it does not have yet
    (a store some of whose columns were added by hand, or by a test)."""
    have = {c["name"] for c in sa.inspect(db).get_columns(table)}
    for column in columns:
        if column.split()[0] not in have:
            db.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN {column}"))


def _to_3_schedules(db: sa.Connection) -> None:
    """The schedule of a run and its slot (the schedules table is made by ``create_all``)."""
    _add_columns(db, "minions_runs", ["schedule TEXT", "slot FLOAT"])
    db.execute(
        sa.text("CREATE INDEX IF NOT EXISTS ix_minions_runs_schedule ON minions_runs (schedule)")
    )


def _to_3_rerun(db: sa.Connection) -> None:
    """Reruns: a run's parent, the step it reran from, its plan (the step cache's table is
    made by ``create_all``)."""
    _add_columns(db, "minions_runs", ["parent_run_id TEXT", "from_step TEXT", "rerun TEXT"])


def _to_3(db: sa.Connection) -> None:
    """Schema 2 -> 3: schedules, reruns, the step cache."""
    _to_3_schedules(db)
    _to_3_rerun(db)


def _to_4(db: sa.Connection) -> None:
    """Schema 3 -> 4: actors (a table made by an earlier step of this migration, which
    ``create_all`` makes after it, gets them then)."""
    made = set(sa.inspect(db).get_table_names())
    for table, columns in (
        ("minions_runs", ["queued_by TEXT", "cancelled_by TEXT"]),
        ("minions_approvals", ["decided_by TEXT"]),
        ("minions_schedules", ["changed_by TEXT"]),
    ):
        if table in made:
            _add_columns(db, table, columns)


MIGRATIONS: dict[int, Any] = {1: _to_2, 2: _to_3, 3: _to_4}
"""Schema version n -> n+1 upgrades, each a function of a connection."""


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """A finished step execution as stored: what `minions runs show` lists.

    Attributes:
        attempts: the model calls' first attempts (a retried call counts once).
        items: how many loop items the step ran (0: not a loop).
        started_at: when the step started (Unix seconds; ``None`` for a skipped step).
        finished_at: when it ended.
        model_calls: the model calls it made, retries included.
        tool_calls: the tool calls it made.
        loop_items: its loop items' executions, in item order (``step[0]``, ``step[1]``...).
    """

    step_id: str
    visit: int
    status: str
    output: Any = None
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    attempts: int = 1
    items: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    model_calls: int = 0
    tool_calls: int = 0
    loop_items: tuple[StepRecord, ...] = ()
    duration: float | None = None
    reused_from: str | None = None
    """For a step a rerun reused (status ``reused``): the run that executed it."""
    reused_usage: dict[str, int] = field(default_factory=dict)
    """For a reused step: the usage of its original execution (its own `usage` is zero)."""


@dataclass(frozen=True, kw_only=True)
class RunFilter:
    """Which runs a listing gives: each field given narrows it (all of them at once).

    Attributes:
        created_after: created at or after this time (Unix seconds).
        created_before: created before this time.
        id_prefix: run ids that start with this.
        schedule: fired by this schedule.
    """

    status: str | None = None
    recipe: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    id_prefix: str | None = None
    schedule: str | None = None


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
    decided_by: str | None = None
    """Who decided: a key's name, ``token``, ``cli:USER`` (None: undecided, or not known)."""


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A run as stored.

    Attributes:
        attempt: 1, then one more each time the run was resumed, taken over from a worker
            that died, or handed back by a busy worker to one with a place free.
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
    schedule: str | None = None
    """The schedule that fired it (None: submitted)."""
    slot: float | None = None
    """The slot of `schedule` it was fired for (a Unix time)."""
    steps: tuple[StepRecord, ...] = ()
    approvals: tuple[ApprovalRecord, ...] = ()
    parent_run_id: str | None = None
    """For a rerun: the run it reran."""
    from_step: str | None = None
    """For a rerun: the step it reran from."""
    queued_by: str | None = None
    """Who queued its current attempt (submitted, reran or resumed it): a key's name,
    ``token``, ``cli:USER``, ``schedule:NAME`` (None: a worker's takeover, or not known)."""
    cancelled_by: str | None = None
    """Who asked for its cancel."""

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


CatchUp = Literal["none", "one", "all"]


@dataclass(frozen=True, kw_only=True)
class ScheduleRecord:
    """A schedule as stored: a recipe snapshotted when it was added, run at each slot.

    Attributes:
        cron: its cron expression (or None, and `every` is set).
        every: seconds between slots, which are multiples of it since 1970-01-01 UTC.
        catch_up: what slots missed while no worker ran do: ``none`` (skipped; a slot over
            a minute late too), ``one`` (the latest fires), ``all`` (each fires, in order).
        next_at: the next slot (a Unix time).
        last_slot: the slot that fired last; `last_run_id` its run.
        fired: how many runs it fired.
    """

    name: str
    recipe_id: str
    inputs: dict[str, Any]
    cron: str | None
    every: int | None
    timezone: str
    catch_up: CatchUp
    paused: bool
    created_at: float
    next_at: float
    last_slot: float | None = None
    last_fired_at: float | None = None
    last_run_id: str | None = None
    fired: int = 0
    recipe_path: str | None = None
    recipe_hash: str = ""
    changed_by: str | None = None
    """Who added it, or paused or resumed it last."""

    @property
    def timing(self) -> str:
        """``cron EXPR [TZ]`` or ``every Ns``, as shown."""
        if self.cron is not None:
            zone = "" if self.timezone == "UTC" else f" ({self.timezone})"
            return f"cron {self.cron}{zone}"
        return f"every {self.every}s"


@dataclass(frozen=True, kw_only=True)
class PruneResult:
    """What a prune deleted (or, in a dry run, would delete).

    Attributes:
        runs: finished runs deleted, with their steps, events, approvals and DBOS workflows.
        before: runs that finished before this moment (a Unix time) were eligible.
        statuses: the statuses pruned.
        dry_run: nothing was deleted.
        bytes_before: the SQLite file's size before (None on Postgres).
        bytes_after: and after, once the freed pages went back to the file system.
    """

    runs: int
    before: float
    statuses: tuple[str, ...]
    dry_run: bool = False
    bytes_before: int | None = None
    bytes_after: int | None = None


@dataclass(frozen=True, kw_only=True)
class History:
    """How far the stored history goes back.

    Attributes:
        oldest_at: when the oldest stored run was created (None: no run).
        pruned_before: runs that finished before this were pruned (None: never pruned).
        pruned_at: when that prune ran.
    """

    oldest_at: float | None
    pruned_before: float | None = None
    pruned_at: float | None = None
    pruned_by: str | None = None
    """Who ran that prune (a key's name, ``token``, ``cli:USER``; None: not known)."""


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
