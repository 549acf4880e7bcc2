"""The events table: each run's events as stored, numbered once, in order, without a gap.

An event is stored as its JSON (long results and outputs as previews, `stored_event`); token
deltas never are. The holder of a run writes its events with its other writes, in one commit
(`minions.runs._leases.append`); whoever ends a run nobody runs writes its terminal event
(`minions.runs._runs.end_unheld`). Followers read them (`minions.runs._log`). Every reader
of a stored event reads it with `decoded`: a row that holds no event names its run and number.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import pydantic
import sqlalchemy as sa

from minions._fold import TERMINAL_KINDS
from minions._item import ItemId
from minions._text import stored_event
from minions.events import Event, RunFailed, StepReused, event_from_json, event_to_json
from minions.runs._db import DamagedStoreError
from minions.runs._tables import events_table

if TYPE_CHECKING:
    from minions.runs._db import Database

__all__: list[str] = []


class EventRow(NamedTuple):
    """An event as stored: its number, kind, step id and JSON.

    A tuple on purpose: the holder's commit, which the step loop waits on, hands the rows
    straight to the database driver (`driver_rows`, in `COLUMNS` order after the run's id),
    with no conversion per event. Outside this module it is read by name only.
    """

    seq: int
    kind: str
    step_id: str | None
    data: str


COLUMNS = f"(run_id, {', '.join(EventRow._fields)})"
"""The columns of a stored event, as the holder's commit writes them (its own SQL)."""


def driver_rows(run_id: str, rows: Sequence[EventRow]) -> list[tuple[Any, ...]]:
    """The run's `rows` as the driver takes them, in `COLUMNS` order (the holder's commit)."""
    return [(run_id, *row) for row in rows]


def row_of(event: Event) -> EventRow:
    """An event as the store keeps it (long results and outputs as previews)."""
    return EventRow(event.seq, event.kind, event.step_id, event_to_json(stored_event(event)))


def run_failed_row(run_id: str, error: str, actor: str | None = None) -> Callable[[int], EventRow]:
    """The terminal event of a run ended by someone other than its holder (`actor`, when a
    person), once its number is known."""

    def make(seq: int) -> EventRow:
        failed = RunFailed(run_id=run_id, seq=seq, timestamp=time.time(), error=error, actor=actor)
        return row_of(failed)

    return make


# -- reads ---------------------------------------------------------------------------------------


def decoded(run_id: str, seq: int, data: str | bytes) -> Event:
    """Stored event number `seq` of the run, typed: the one decoder of the events table's rows.

    Raises:
        DamagedStoreError: the row holds no event this minions reads (not JSON, a kind it does
            not know, a field of the wrong type): the message names the run and the number.
    """
    try:
        return event_from_json(data)
    except pydantic.ValidationError as exc:
        raise DamagedStoreError(f"event {seq} of run {run_id!r}: {_problem(exc)}") from None


def _problem(exc: pydantic.ValidationError) -> str:
    """What is wrong with a stored event's row, in a line (pydantic's first problem; never
    what the row holds)."""
    problems = exc.errors(include_url=False, include_input=False)
    if not problems:
        return "not an event"
    first = problems[0]
    if first["type"] == "json_invalid":
        return f"not JSON ({first.get('ctx', {}).get('error', first['msg'])})"
    if first["type"] == "union_tag_invalid":
        said = f"its kind {first.get('ctx', {}).get('tag')!r} is not one this minions knows"
    elif first["type"] == "union_tag_not_found":
        said = "it has no kind"
    else:
        where = ".".join(str(p) for p in first["loc"][1:])  # after the kind
        said = f"{where}: {first['msg']}" if where else first["msg"]
    more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
    return f"not an event ({said[:200]}{more})"


def after(
    database: Database, run_id: str, *, after: int = 0, limit: int | None = None
) -> list[Event]:
    """The run's stored events after number `after`, in order."""
    query = (
        sa.select(events_table.c.seq, events_table.c.data)
        .where(events_table.c.run_id == run_id, events_table.c.seq > after)
        .order_by(events_table.c.seq)
    )
    if limit is not None:
        query = query.limit(limit)
    with database.read() as db:
        return [decoded(run_id, row.seq, row.data) for row in db.execute(query)]


def of_step(database: Database, run_id: str, step_id: str) -> list[Event]:
    """The stored events of one step of the run (every visit) and of its loop items
    (``step[0]``, ``step[1]``...), in order."""
    query = (
        sa.select(events_table.c.seq, events_table.c.data)
        .where(
            events_table.c.run_id == run_id,
            sa.or_(
                events_table.c.step_id == step_id,
                events_table.c.step_id.startswith(ItemId(step_id).items_prefix, autoescape=True),
            ),
        )
        .order_by(events_table.c.seq)
    )
    with database.read() as db:
        return [decoded(run_id, row.seq, row.data) for row in db.execute(query)]


def readable(database: Database, run_id: str) -> Iterator[Event]:
    """The run's stored events in order, streamed (memory bounded), leaving out any this
    minions cannot decode (a damaged row, or a kind a newer minions wrote): for a reader
    that must go on with what the others say (the notifier)."""
    query = (
        sa.select(events_table.c.seq, events_table.c.data)
        .where(events_table.c.run_id == run_id)
        .order_by(events_table.c.seq)
    )
    with database.stream() as db:
        for row in db.execute(query):
            try:
                yield decoded(run_id, row.seq, row.data)
            except DamagedStoreError:
                continue


def started(database: Database, run_id: str) -> bool:
    """Whether the run's log says it started (a run handed back before it started has other
    events only)."""
    with database.read() as db:
        return (
            db.execute(
                sa.select(events_table.c.seq)
                .where(events_table.c.run_id == run_id, events_table.c.kind == "run_started")
                .limit(1)
            ).first()
            is not None
        )


def ended_after(db: sa.Connection, run_id: str, seq: int) -> bool:
    """Whether the run's log says it ended after event `seq` (in the caller's transaction)."""
    table = events_table.c
    return (
        db.execute(
            sa.select(table.seq)
            .where(table.run_id == run_id, table.seq > seq, table.kind.in_(sorted(TERMINAL_KINDS)))
            .limit(1)
        ).first()
        is not None
    )


def reuses_said(database: Database, run_id: str) -> set[tuple[str, int]]:
    """The steps and loop items (name, visit) a rerun said it reused (its stored
    ``step_reused`` events)."""
    with database.read() as db:
        rows = db.execute(
            sa.select(events_table.c.seq, events_table.c.step_id, events_table.c.data).where(
                events_table.c.run_id == run_id, events_table.c.kind == "step_reused"
            )
        )
        said = [(r.step_id, decoded(run_id, r.seq, r.data)) for r in rows]
    return {(step, e.visit) for step, e in said if isinstance(e, StepReused)}


# -- in a caller's transaction -------------------------------------------------------------------


def insert(db: sa.Connection, run_id: str, rows: Sequence[EventRow]) -> None:
    """Store `rows` of the run (in the caller's transaction)."""
    db.execute(
        events_table.insert(),
        [
            {"run_id": run_id, "seq": r.seq, "kind": r.kind, "step_id": r.step_id, "data": r.data}
            for r in rows
        ],
    )


def notify(database: Database, db: sa.Connection, run_id: str) -> None:
    """Wake the run's followers at the commit of the caller's transaction (Postgres
    NOTIFY; followers of an SQLite store poll)."""
    if database.postgres:
        db.execute(sa.text("SELECT pg_notify('minions_events', :run)"), {"run": run_id})


def forget(db: sa.Connection, run_ids: Sequence[str]) -> None:
    """Delete the events of these runs (pruning, in the caller's transaction)."""
    db.execute(events_table.delete().where(events_table.c.run_id.in_(list(run_ids))))
