"""The evals room: evals run on the store's workers (``minions eval --durable``), blocking
(`RunStore` reaches it through ``AsyncDatabase.apply``): an eval opened (or found again, to
resume it), its report kept once it finished, the kept evals listed and read, and pruned with
the runs (`minions.runs._prune` asks it).

The store keeps a report as JSON it does not read (the `EvalReport` of `minions.evals`, a
layer above), with a small summary for listings.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import sqlalchemy as sa

from minions.runs import _audit
from minions.runs._tables import evals_table

if TYPE_CHECKING:
    from minions.runs._db import Database

__all__ = ["EvalRecord", "OpenedEval"]

MAX_REPORT_BYTES = 16 * 1024 * 1024
"""The largest report kept (its JSON): a report is bounded by its case runs, so this is an
eval of tens of thousands of them."""
BATCH = 500
"""Evals deleted per transaction when pruning."""

table = evals_table
_LISTED = [c for c in table.c if c.name != "report"]

EvalStatus = Literal["running", "finished"]


@dataclass(frozen=True, kw_only=True)
class EvalRecord:
    """An eval run on the store's workers (``minions eval --durable``), and its report once
    it finished.

    Attributes:
        fingerprint: what makes it the same eval (its dataset and recipes): an eval started
            again with the same one resumes it until it finished.
        total: its case runs.
        status: ``running`` until its report is kept, then ``finished``.
        summary: a few numbers of the report, for a listing (plain JSON data).
        report: the report (plain JSON data; ``None`` until finished, and in listings).
    """

    eval_id: str
    fingerprint: str
    dataset: str
    target: str
    total: int
    status: EvalStatus
    created_at: float
    finished_at: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None
    project: str = "default"
    """Its project, and its case runs'."""


class OpenedEval(NamedTuple):
    """What `RunStore.open_eval` returns: the eval, and whether it resumes. Read it by
    name, or unpack it as a pair (``record, resumed = await store.open_eval(...)``).

    Attributes:
        record: the eval: the unfinished one of its fingerprint, else a new one.
        resumed: True when it is the unfinished one (an eval started again with the same
            dataset and recipes, whose case runs already submitted are found, not
            submitted twice); False when this call made it.
    """

    record: EvalRecord
    resumed: bool


def open_eval(
    database: Database,
    *,
    eval_id: str,
    fingerprint: str,
    dataset: str,
    target: str,
    total: int,
    now: float,
    project: str = "default",
    audit: Mapping[str, Any] | None = None,
) -> OpenedEval:
    """The unfinished eval of `fingerprint`, resumed, else a new one (`eval_id`).
    Of callers opening one fingerprint at once, one makes it and the others find it.
    `audit`: the entry of a new one (``eval.start``), written in the transaction that
    makes it (an eval resumed changes nothing)."""
    values = {
        "eval_id": eval_id,
        "fingerprint": fingerprint,
        "open_key": fingerprint,
        "dataset": dataset,
        "target": target,
        "total": total,
        "status": "running",
        "created_at": now,
        "project": project,
    }
    with database.begin() as db:
        db.execute(database.insert_ignoring_conflicts(table, values))
        row = db.execute(sa.select(*_LISTED).where(table.c.open_key == fingerprint)).one()
        if row.eval_id == eval_id:
            _audit.write(db, audit, project=row.project)
    return OpenedEval(_record(row), resumed=row.eval_id != eval_id)


def finish_eval(
    database: Database,
    eval_id: str,
    *,
    report: Mapping[str, Any],
    summary: Mapping[str, Any],
    dataset: str,
    target: str,
    total: int,
    now: float,
    project: str = "default",
    audit: Mapping[str, Any] | None = None,
) -> None:
    """Keep the eval's report: it is finished (an eval started again with its fingerprint is a
    new one). An eval pruned meanwhile is kept again (in `project`). `audit`: its entry
    (``eval.finish``), written in the same transaction.

    Raises:
        ValueError: the report's JSON is over `MAX_REPORT_BYTES`.
    """
    text = json.dumps(report, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) > MAX_REPORT_BYTES:
        raise ValueError(
            f"the report of eval {eval_id} is {len(text.encode()):,} bytes of JSON: over the "
            f"{MAX_REPORT_BYTES:,} a store keeps"
        )
    values = {
        "open_key": None,
        "status": "finished",
        "finished_at": now,
        "summary": json.dumps(summary, ensure_ascii=False),
        "report": text,
    }
    with database.begin() as db:
        updated = db.execute(
            table.update().where(table.c.eval_id == eval_id).values(**values)
        ).rowcount
        if not updated:
            db.execute(
                table.insert().values(
                    eval_id=eval_id, fingerprint="", dataset=dataset, target=target,
                    total=total, created_at=now, project=project, **values,
                )
            )  # fmt: skip
        _audit.write(db, audit, project=project)


def listed(
    database: Database,
    *,
    limit: int,
    before: tuple[float, str] | None = None,
    projects: tuple[str, ...] | None = None,
) -> list[EvalRecord]:
    """Evals, newest first, without their reports; `before`: the created_at and eval id of a
    page's last one; `projects`: of these projects only."""
    query = sa.select(*_LISTED)
    if projects is not None:
        query = query.where(table.c.project.in_(projects))
    if before is not None:
        at, eval_id = before
        query = query.where(
            sa.or_(
                table.c.created_at < at,
                sa.and_(table.c.created_at == at, table.c.eval_id < eval_id),
            )
        )
    query = query.order_by(table.c.created_at.desc(), table.c.eval_id.desc()).limit(limit)
    with database.read() as db:
        return [_record(row) for row in db.execute(query).all()]


def get(database: Database, eval_id: str) -> EvalRecord | None:
    """The eval with its report, or None."""
    with database.read() as db:
        row = db.execute(sa.select(table).where(table.c.eval_id == eval_id)).first()
    if row is None:
        return None
    record = _record(row)
    if row.report is None:
        return record
    return dataclasses.replace(record, report=json.loads(row.report))


def prune(database: Database, *, before: float, keep: int | None, dry_run: bool) -> int:
    """Delete the evals finished before `before` (and the unfinished ones started before it:
    no process resumed them since), but the newest `keep`. How many (would go)."""
    last = sa.func.coalesce(table.c.finished_at, table.c.created_at)
    query = sa.select(table.c.eval_id).where(last < before).order_by(last.desc())
    if keep:
        query = query.offset(keep)
    with database.read() as db:
        ids = [row.eval_id for row in db.execute(query).all()]
    if dry_run or not ids:
        return len(ids)
    deleted = 0
    for start in range(0, len(ids), BATCH):
        with database.begin() as db:
            deleted += db.execute(
                table.delete().where(table.c.eval_id.in_(ids[start : start + BATCH]))
            ).rowcount
    return deleted


def _record(row: Any) -> EvalRecord:
    return EvalRecord(
        eval_id=row.eval_id,
        fingerprint=row.fingerprint,
        dataset=row.dataset,
        target=row.target,
        total=row.total,
        status=row.status,
        created_at=row.created_at,
        finished_at=row.finished_at,
        summary=json.loads(row.summary) if row.summary else {},
        project=row.project,
    )
