"""Durable runs: submit a recipe run to a store, let workers execute it, follow its events,
cancel, resume, approve.

`minions.runs` owns the run lifecycle. A run is stored and queued in one transaction; each
attempt of it (a resume, a takeover from a worker that died) is one DBOS workflow; a worker
holds a run by a lease whose epoch fences out every earlier holder; each finished step and
loop item is a checkpoint, so a run goes on after a crash from its last one; its events are
numbered once, without a gap. Schedules run a recipe at each slot of a cron expression or an
interval, each slot once however many workers run; `RunStore.prune` deletes old finished
runs. The store is SQLite by default (``sqlite:///./.minions/minions.db``, or
``MINIONS_DATABASE_URL``) and Postgres for several machines (``postgresql://...``). See
docs/runs.md and docs/schedules.md.

    store = RunStore()                               # MINIONS_DATABASE_URL or the default
    submitted = await store.submit("recipe.yaml", {"n": 3})   # Submitted(run_id, created)
    async for event in store.follow(submitted.run_id):  # stored events, then live ones
        print(event.seq, event.kind)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minions.runs import _extra  # noqa: F401 (first: it names a missing package)
from minions.runs._approvals import ApprovalRecord
from minions.runs._audit import AUDIT_ACTIONS, Actor, AuditEntry
from minions.runs._cache import CacheEntry
from minions.runs._checkpoints import StepRecord
from minions.runs._diff import RunDiff, StepDiff
from minions.runs._endpoints import EndpointPause, EndpointRecord, Lesson
from minions.runs._evals import EvalRecord, OpenedEval
from minions.runs._fleet import (
    EndpointLoad,
    EndpointStatus,
    FleetState,
    QueuedRecipe,
    QueuedRun,
    QueueState,
    ScheduleState,
)
from minions.runs._keys import ROLES, KeyRecord, NewKey, Role
from minions.runs._log import EventLog, LiveHub
from minions.runs._notify import Delivery, Notifier, NotifyTarget
from minions.runs._projects import Scope, ScopedRuns
from minions.runs._prune import History, PruneResult, Retention
from minions.runs._runs import RerunPlan, RunRecord, Submitted
from minions.runs._schedules import ScheduleRecord
from minions.runs._snapshot import RecipeNode
from minions.runs._steps import StepDetail
from minions.runs._store import RunFilters, RunStore, database_url
from minions.runs._tables import STATUSES
from minions.runs._usage import UsageReport, UsageRow
from minions.runs._workers import WorkerRecord

if TYPE_CHECKING:
    from minions.runs._worker import Worker, WorkerConflictError

__all__ = [
    "AUDIT_ACTIONS",
    "ROLES",
    "STATUSES",
    "Actor",
    "ApprovalRecord",
    "AuditEntry",
    "CacheEntry",
    "Delivery",
    "EndpointLoad",
    "EndpointPause",
    "EndpointRecord",
    "EndpointStatus",
    "EvalRecord",
    "EventLog",
    "FleetState",
    "KeyRecord",
    "NewKey",
    "History",
    "Lesson",
    "LiveHub",
    "Notifier",
    "NotifyTarget",
    "OpenedEval",
    "PruneResult",
    "QueueState",
    "QueuedRecipe",
    "QueuedRun",
    "RecipeNode",
    "Role",
    "RerunPlan",
    "Retention",
    "RunDiff",
    "RunFilters",
    "RunRecord",
    "RunStore",
    "ScheduleRecord",
    "ScheduleState",
    "Scope",
    "ScopedRuns",
    "StepDetail",
    "StepDiff",
    "StepRecord",
    "Submitted",
    "UsageReport",
    "UsageRow",
    "Worker",
    "WorkerConflictError",
    "WorkerRecord",
    "database_url",
]


def __getattr__(name: str) -> Any:
    # A worker needs DBOS, which is heavy to import: only code that runs one pays for it.
    if name in ("Worker", "WorkerConflictError"):
        from minions.runs import _worker

        return getattr(_worker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
