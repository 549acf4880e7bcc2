"""minions' own tables beside DBOS's (but the API keys', which `_keys` makes), their schema
version and migrations, and the statuses of a run. JSON, never pickle: what a table stores,
and the SQL that writes it, is its room's: `_runs` and `_leases` the runs' (a client's
changes; a holder's, under its lease), `_events`, `_checkpoints` the steps', `_approvals`,
`_workers`, `_cache` the step cache's, `_schedules` the schedules' and their late slots',
`_endpoints` the endpoints' five, `_evals`, `_audit`, `_notify` the notifications', `_db`
this meta table. The rules over several rooms (`_decisions`, `_project_limits`, `_prune`)
write through the rooms' functions, in their own transactions; a holder's commit
(`_leases.append`) inserts its events and its step's checkpoint with the run, in one
statement, in the columns of `_events` and `_checkpoints`. Reads that count or join across
rooms (`_fleet`, `_usage`, `_decisions`' due calls, `_project_limits`' room) read the tables.

The durable format has its own version (`SCHEMA_VERSION`, kept in ``minions_meta``), apart from
the package's: upgrading minions changes nothing stored unless the format changes, and then the
store migrates itself when a worker or a submission opens it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from minions._fold import RUN_STATUSES, RunStatus
from minions._fold import TERMINAL as TERMINAL

__all__: list[str] = []

SCHEMA_VERSION = 14

Status = RunStatus
STATUSES = RUN_STATUSES
ACTIVE: tuple[Status, ...] = tuple(s for s in STATUSES if s not in TERMINAL)
"""A run in one of these (``queued``, ``running``, ``waiting``) has not ended: a worker runs
it, or will."""
HELD: tuple[Status, ...] = tuple(s for s in ACTIVE if s != "queued")
"""A run in one of these (``running``, ``waiting``) is held by a worker's lease (unless it is
parked: `waiting` with no holder, its execution ended until a decision queues it again)."""
ACTIVE_SQL = ", ".join(f"'{status}'" for status in ACTIVE)
"""`ACTIVE` as an SQL list, for the statements written out (``status IN (...)``)."""

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
    # Looked up by status through `ix_minions_runs_status_finished` (schema 14: an index of
    # the status alone was written at every status change, and served no look the other
    # does not).
    sa.Column("status", sa.Text, nullable=False),
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
    sa.Column("schedule", sa.Text, nullable=True),
    sa.Column("slot", sa.Float, nullable=True),
    # A rerun (schema 3): the run it reran, the step it reran from, and its plan (JSON: the
    # steps it reuses from the parent, outputs set by hand, the steps changed and why).
    sa.Column("parent_run_id", sa.Text, nullable=True),
    sa.Column("from_step", sa.Text, nullable=True),
    sa.Column("rerun", sa.Text, nullable=True),
    # Actors (schema 5): who queued the current attempt (submitted, reran, resumed it), who
    # asked for its cancel.
    sa.Column("queued_by", sa.Text, nullable=True),
    sa.Column("cancelled_by", sa.Text, nullable=True),
    # Its project (schema 7): a key sees only its projects' runs. `parked`: why a queued run
    # waits with no attempt queued (its project is at its limits), until a worker queues it.
    sa.Column("project", sa.Text, nullable=False, server_default="default", index=True),
    sa.Column("parked", sa.Text, nullable=True),
    # Schema 12: when its current holder claimed it (its progress is counted from then, when
    # no event came since: a run resumed after a long wait is not stuck as it starts).
    sa.Column("claimed_at", sa.Float, nullable=True),
    # Schema 12: the runs that ended with a status since a time (the notifier's failed runs,
    # each look) read without going through every run that ever ended so.
    sa.Index("ix_minions_runs_status_finished", "status", "finished_at"),
)
schedule_index = sa.Index(
    "ix_minions_runs_schedule",
    runs_table.c.schedule,
    sqlite_where=runs_table.c.schedule.is_not(None),
    postgresql_where=runs_table.c.schedule.is_not(None),
)
"""Schema 14: only the runs a schedule fired (a submitted run's insert writes no page of it)."""
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
    # Deadlines (schema 8): when the undecided call times out and what happens then
    # (`reject` the call, or `fail` the run), when it is escalated and when that was done.
    sa.Column("due_at", sa.Float, nullable=True),
    sa.Column("on_timeout", sa.Text, nullable=True),
    sa.Column("escalate_at", sa.Float, nullable=True),
    sa.Column("escalated_at", sa.Float, nullable=True),
    # Schema 13: the state of the step that waits at this call, kept when its run parked, so
    # that it goes on at the call (JSON, minions.runs._approvals.keep; NULL: none kept).
    sa.Column("resume", sa.Text, nullable=True),
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
    # Schema 11: the runs it runs at a time (its own `--concurrency`; NULL: a worker of an
    # older minions).
    sa.Column("places", sa.Integer, nullable=True),
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
    # Schema 6: what a slot does while runs of the schedule are active (skip, buffer_one,
    # allow), and lateness: `late` when the latest tick that moved the cursor fired a slot
    # late or skipped one (`late_at`: when, `late_reason`: why), `late_slots` how many in all.
    sa.Column("overlap", sa.Text, nullable=False, default="skip"),
    sa.Column("late", sa.Boolean, nullable=False, default=False),
    sa.Column("late_slots", sa.Integer, nullable=False, default=0),
    sa.Column("late_at", sa.Float, nullable=True),
    sa.Column("late_reason", sa.Text, nullable=True),
    # Its project (schema 7): its runs' too.
    sa.Column("project", sa.Text, nullable=False, server_default="default"),
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
    # Schema 9: the pause's run (the one told 429), when it was set, and the seconds the
    # endpoint asked for (the pause is at most the limits' `max_pause`).
    sa.Column("paused_by", sa.Text, nullable=True),
    sa.Column("paused_at", sa.Float, nullable=True),
    sa.Column("pause_asked", sa.Float, nullable=True),
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
    # Schema 9: why each refused feature is refused, since when, on which runs' evidence
    # (JSON: feature -> {cause, since, runs, detail}).
    sa.Column("evidence", sa.Text, nullable=True),
)
capability_strikes_table = sa.Table(
    "minions_capability_strikes",
    metadata,
    # Schema 9: a run whose answers ignored an output mode (prose, twice in a row): the mode
    # is demoted for every run once enough distinct runs did (`Limits.demote_after_runs`).
    sa.Column("base_url", sa.Text, primary_key=True),
    sa.Column("model", sa.Text, primary_key=True),
    sa.Column("mode", sa.Text, primary_key=True),
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
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
    # Schema 4: the run that made it (pruned with it), its recipe (`minions cache`).
    sa.Column("run_id", sa.Text, nullable=True, index=True),
    sa.Column("recipe_id", sa.Text, nullable=True, index=True),
)
evals_table = sa.Table(
    "minions_evals",
    metadata,
    # The evals run on the store's workers (`minions eval --durable`) and their reports
    # (minions.runs._evals). `open_key` is the eval's fingerprint while it has not finished
    # (unique: an eval started again with the same dataset resumes it), NULL after.
    sa.Column("eval_id", sa.Text, primary_key=True),
    sa.Column("fingerprint", sa.Text, nullable=False),
    sa.Column("open_key", sa.Text, nullable=True, unique=True),
    sa.Column("dataset", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("summary", sa.Text, nullable=True),
    sa.Column("report", sa.Text, nullable=True),
    # Its project (schema 7): its case runs' too.
    sa.Column("project", sa.Text, nullable=False, server_default="default"),
)
audit_table = sa.Table(
    "minions_audit",
    metadata,
    # Schema 10: the audit log (minions.runs._audit): one row per state change, written in the
    # change's transaction; kept by its own retention horizon.
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False, index=True),
    sa.Column("actor", sa.Text, nullable=True, index=True),
    sa.Column("address", sa.Text, nullable=True),
    sa.Column("action", sa.Text, nullable=False, index=True),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("project", sa.Text, nullable=False, default="default", index=True),
    sa.Column("detail", sa.Text, nullable=True),
)
notifications_table = sa.Table(
    "minions_notifications",
    metadata,
    # Schema 11: the outbox of notifications (minions.runs._notify). One row per thing told
    # to one target: its key (the target, the kind, what it is about) makes a thing found by
    # several processes, or found again, told once. `next_at` is when it is sent next (a
    # sender claims it by moving it on); `delivered_at` set: done; `failed_at` set: given up.
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("target", sa.Text, nullable=False, index=True),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("next_at", sa.Float, nullable=False, index=True),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("delivered_at", sa.Float, nullable=True),
    sa.Column("failed_at", sa.Float, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("last_attempt_at", sa.Float, nullable=True),
)
schedule_late_table = sa.Table(
    "minions_schedule_late",
    metadata,
    # Schema 12: each time a tick flagged a schedule late (minions.runs._schedules), written in
    # the tick's transaction: a slot fired over the grace after its time (`why` ``late``, its
    # run), or slots skipped (`why` ``skipped``: `slots` of them, `first_slot` to `slot`);
    # `reason` is the schedule's `late_reason`. What notifications tell (``schedule_late``),
    # kept a week (`minions.runs._schedules.LATE_KEPT`).
    sa.Column("schedule", sa.Text, primary_key=True),
    sa.Column("slot", sa.Float, primary_key=True),
    sa.Column("why", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("slots", sa.Integer, nullable=False),
    sa.Column("first_slot", sa.Float, nullable=False),
    sa.Column("run_id", sa.Text, nullable=True),
    sa.Column("recipe_id", sa.Text, nullable=False),
    sa.Column("at", sa.Float, nullable=False, index=True),
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
    """Schema 3 -> 4: a step cache entry's run and recipe. The entries of schema 3 are
    dropped: their keys named no recipe, workspace or tool origin (a table made by
    ``create_all`` after this has the columns already)."""
    if "minions_step_cache" not in sa.inspect(db).get_table_names():
        return
    db.execute(sa.text("DELETE FROM minions_step_cache"))
    _add_columns(db, "minions_step_cache", ["run_id TEXT", "recipe_id TEXT"])
    for column in ("run_id", "recipe_id"):
        db.execute(
            sa.text(
                f"CREATE INDEX IF NOT EXISTS ix_minions_step_cache_{column} "
                f"ON minions_step_cache ({column})"
            )
        )


def _to_5(db: sa.Connection) -> None:
    """Schema 4 -> 5: actors (a table made by an earlier step of this migration, which
    ``create_all`` makes after it, gets them then)."""
    made = set(sa.inspect(db).get_table_names())
    for table, columns in (
        ("minions_runs", ["queued_by TEXT", "cancelled_by TEXT"]),
        ("minions_approvals", ["decided_by TEXT"]),
        ("minions_schedules", ["changed_by TEXT"]),
    ):
        if table in made:
            _add_columns(db, table, columns)


def _to_6(db: sa.Connection) -> None:
    """Schema 5 -> 6: a schedule's overlap policy and lateness. Schedules stored before keep
    what they did (`allow`: a slot fires whatever runs of it are active); new ones default
    to `skip`."""
    if "minions_schedules" in sa.inspect(db).get_table_names():
        _add_columns(
            db,
            "minions_schedules",
            [
                "overlap TEXT NOT NULL DEFAULT 'allow'",
                "late BOOLEAN NOT NULL DEFAULT FALSE",
                "late_slots INTEGER NOT NULL DEFAULT 0",
                "late_at FLOAT",
                "late_reason TEXT",
            ],
        )


def _to_7(db: sa.Connection) -> None:
    """Schema 6 -> 7: projects. Every run, schedule and eval stored before belongs to
    ``default`` (a table made by ``create_all`` after this has the column already)."""
    made = set(sa.inspect(db).get_table_names())
    column = "project TEXT NOT NULL DEFAULT 'default'"
    for table in ("minions_runs", "minions_schedules", "minions_evals"):
        if table in made:
            _add_columns(db, table, [column])
    if "minions_runs" in made:
        _add_columns(db, "minions_runs", ["parked TEXT"])
        db.execute(
            sa.text("CREATE INDEX IF NOT EXISTS ix_minions_runs_project ON minions_runs (project)")
        )


def _to_8(db: sa.Connection) -> None:
    """Schema 7 -> 8: approvals' deadlines and escalations (runs parked while they wait
    need no column: a `waiting` run without a holder is parked)."""
    if "minions_approvals" in set(sa.inspect(db).get_table_names()):
        _add_columns(
            db,
            "minions_approvals",
            ["due_at FLOAT", "on_timeout TEXT", "escalate_at FLOAT", "escalated_at FLOAT"],
        )


def _to_9(db: sa.Connection) -> None:
    """Schema 8 -> 9: an endpoint pause's run, moment and asked seconds (the pauses of
    before, unbounded and unattributed, are lifted); a lesson's evidence (the strikes'
    table is made by ``create_all``)."""
    made = set(sa.inspect(db).get_table_names())
    if "minions_endpoint_gates" in made:
        _add_columns(
            db,
            "minions_endpoint_gates",
            ["paused_by TEXT", "paused_at FLOAT", "pause_asked FLOAT"],
        )
        db.execute(sa.text("UPDATE minions_endpoint_gates SET paused_until = 0"))
    if "minions_capabilities" in made:
        _add_columns(db, "minions_capabilities", ["evidence TEXT"])


def _to_10(db: sa.Connection) -> None:
    """Schema 9 -> 10: the audit log's table (empty: what happened before was not audited)."""
    audit_table.create(db, checkfirst=True)


def _to_11(db: sa.Connection) -> None:
    """Schema 10 -> 11: each worker's own places (the notifications' outbox is made by
    ``create_all``)."""
    if "minions_workers" in set(sa.inspect(db).get_table_names()):
        _add_columns(db, "minions_workers", ["places INTEGER"])


def _to_12(db: sa.Connection) -> None:
    """Schema 11 -> 12: when a run's holder claimed it, an index of the runs by status and end
    (the table of schedules' late slots is made by ``create_all``)."""
    if "minions_runs" in set(sa.inspect(db).get_table_names()):
        _add_columns(db, "minions_runs", ["claimed_at FLOAT"])
        db.execute(
            sa.text(
                "CREATE INDEX IF NOT EXISTS ix_minions_runs_status_finished "
                "ON minions_runs (status, finished_at)"
            )
        )


def _to_13(db: sa.Connection) -> None:
    """Schema 12 -> 13: the state a parked run's waiting step keeps at its call."""
    if "minions_approvals" in set(sa.inspect(db).get_table_names()):
        _add_columns(db, "minions_approvals", ["resume TEXT"])


def _to_14(db: sa.Connection) -> None:
    """Schema 13 -> 14: fewer index pages written per run. The index of the runs by status
    alone goes (the one by status and end, schema 12, serves every look by status); the index
    by schedule keeps only the runs a schedule fired."""
    if "minions_runs" in set(sa.inspect(db).get_table_names()):
        db.execute(sa.text("DROP INDEX IF EXISTS ix_minions_runs_status"))
        db.execute(sa.text("DROP INDEX IF EXISTS ix_minions_runs_schedule"))
        schedule_index.create(db)


MIGRATIONS: dict[int, Any] = {
    1: _to_2,
    2: _to_3,
    3: _to_4,
    4: _to_5,
    5: _to_6,
    6: _to_7,
    7: _to_8,
    8: _to_9,
    9: _to_10,
    10: _to_11,
    11: _to_12,
    12: _to_13,
    13: _to_14,
}
"""Schema version n -> n+1 upgrades, each a function of a connection."""
