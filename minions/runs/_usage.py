"""Totals: the tokens and cost of a store's model calls by day, recipe, schedule, model and
project (`RunStore.usage`, ``GET /usage``, ``minions usage``), and the usage so far of a run that
has not ended.

What a call cost is read from its events (a ``model_call_started`` names the model and its
endpoint; the ``model_call_completed`` or ``model_call_failed`` of the same turn and attempt
says its tokens), so a running run counts as far as its stored events go, and every
attempt's tokens count, retries included. The price is the `genai-prices` package's table:
a model it does not know, an endpoint it does not know (a server of your own), or a call
whose server said no usage is priced as *unknown*, never as 0.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal, get_args

import sqlalchemy as sa

from minions.events import ModelCallCompleted, ModelCallFailed, ModelCallStarted
from minions.runs import _events as events
from minions.runs._db import Database
from minions.runs._tables import events_table, runs_table

__all__ = ["UsageReport", "UsageRow"]

Group = Literal["day", "recipe", "schedule", "model", "project"]
GROUPS: tuple[Group, ...] = get_args(Group)
"""What totals may be grouped by."""
ENDS = ("model_call_completed", "model_call_failed")
"""The kinds of event that end a model call attempt (and say its tokens)."""
KINDS = ("model_call_started", *ENDS)
_USAGE = ("prompt_tokens", "completion_tokens", "calls", "unknown_calls")


@dataclass(frozen=True, kw_only=True)
class UsageRow:
    """The model calls of one group (or of all, as a report's total).

    Attributes:
        day: the calls' day (UTC, ``YYYY-MM-DD``), when grouped by day.
        recipe: their runs' recipe, when grouped by recipe.
        schedule: the schedule that fired their runs (``None``: runs submitted by hand),
            when grouped by schedule.
        model: the model asked, when grouped by model.
        project: their runs' project, when grouped by project.
        prompt_tokens: tokens of the prompts the servers reported.
        completion_tokens: tokens of the answers.
        calls: model call attempts (retries included).
        unknown_calls: attempts whose server reported no usage (their tokens are unknown).
        cost: US dollars of the attempts the price table prices (``None``: none of them).
        unpriced_calls: attempts not in `cost`: their model or endpoint is not in the price
            table, or their tokens are unknown.
    """

    day: str | None = None
    recipe: str | None = None
    schedule: str | None = None
    model: str | None = None
    project: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    unknown_calls: int = 0
    cost: float | None = None
    unpriced_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, kw_only=True)
class UsageReport:
    """Totals of the model calls made in a span of time.

    Attributes:
        since: the span's start (Unix seconds).
        until: its end (when it was read).
        group_by: what the rows are grouped by, in order.
        rows: one per group, ordered by the groups' values.
        total: every call of the span.
        prices: where the prices come from (the price table's package and version).
    """

    since: float
    until: float
    group_by: tuple[Group, ...]
    rows: tuple[UsageRow, ...]
    total: UsageRow
    prices: str


@dataclass
class _Sum:
    prompt: int = 0
    completion: int = 0
    calls: int = 0
    unknown: int = 0
    cost: Decimal = field(default_factory=Decimal)
    priced: int = 0
    unpriced: int = 0

    def add(self, other: _Sum) -> None:
        self.prompt += other.prompt
        self.completion += other.completion
        self.calls += other.calls
        self.unknown += other.unknown
        self.cost += other.cost
        self.priced += other.priced
        self.unpriced += other.unpriced

    def row(self, **keys: str | None) -> UsageRow:
        return UsageRow(
            **keys,
            prompt_tokens=self.prompt,
            completion_tokens=self.completion,
            calls=self.calls,
            unknown_calls=self.unknown,
            cost=float(self.cost) if self.priced else None,
            unpriced_calls=self.unpriced,
        )


def prices_source() -> str:
    """The price table's package and version."""
    from genai_prices import __version__

    return f"genai-prices {__version__}"


@lru_cache(maxsize=1024)
def _unit_prices(model: str, endpoint: str) -> tuple[Decimal, Decimal] | None:
    """Dollars per prompt token and per answer token of `model` at `endpoint` (None: the
    table does not know them). An endpoint the table does not know is a server of the
    user's own: its calls are not priced as another provider's, even for a model of the
    same name."""
    from genai_prices import Usage, calc_price

    from minions.models._internal import PROVIDERS

    provider, colon, name = model.partition(":")
    if colon and provider in PROVIDERS:
        model = name  # minions' model string (`openai:gpt-4o`): the table names the model
    million = 1_000_000
    try:
        found = calc_price(
            Usage(input_tokens=million, output_tokens=million),
            model_ref=model,
            provider_api_url=endpoint or None,
        )
    except LookupError:
        return None
    return found.input_price / million, found.output_price / million


def price(model: str, endpoint: str, prompt: int, completion: int) -> Decimal | None:
    """What `prompt` and `completion` tokens of `model` at `endpoint` cost (None: unknown)."""
    unit = _unit_prices(model, endpoint)
    if unit is None:
        return None
    return unit[0] * prompt + unit[1] * completion


Ended = ModelCallCompleted | ModelCallFailed


def _calls(rows: Iterable[Any]) -> Iterable[tuple[Any, ModelCallStarted | None, Ended]]:
    """Each ended model call attempt of the rows (a run's events in order, read by the one
    decoder of stored events, `events.decoded`): its run's row, its start (``None``: not
    read) and its end."""
    run: str | None = None
    started: dict[tuple[str | None, int, int], ModelCallStarted] = {}
    for row in rows:
        if row.run_id != run:
            run, started = row.run_id, {}
        event = events.decoded(row.run_id, row.seq, row.data)
        if isinstance(event, ModelCallStarted):
            started[(event.step_id, event.turn, event.attempt)] = event
        elif isinstance(event, Ended):
            yield row, started.pop((event.step_id, event.turn, event.attempt), None), event


def _sum_of(start: ModelCallStarted | None, end: Ended) -> _Sum:
    usage = end.usage
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    calls, unknown = max(1, usage.calls), usage.unknown_calls
    one = _Sum(prompt=prompt, completion=completion, calls=calls, unknown=unknown)
    model, endpoint = (start.model, start.endpoint) if start is not None else ("", "")
    cost = None if unknown else price(model, endpoint, prompt, completion)
    if cost is None:
        one.unpriced = calls
    else:
        one.cost, one.priced = cost, calls
    return one


def _events(
    since: float,
    until: float,
    run_ids: Sequence[str] | None,
    projects: Collection[str] | None = None,
    kinds: Sequence[str] = KINDS,
) -> Any:
    e, r = events_table, runs_table
    query = (
        sa.select(
            e.c.run_id,
            e.c.seq,
            e.c.kind,
            e.c.step_id,
            e.c.data,
            r.c.recipe_id,
            r.c.schedule,
            r.c.project,
        )
        .join(r, r.c.run_id == e.c.run_id)
        .where(e.c.kind.in_(kinds))
        .order_by(e.c.run_id, e.c.seq)
    )
    if projects is not None:
        query = query.where(r.c.project.in_(sorted(projects)))
    if run_ids is not None:
        return query.where(e.c.run_id.in_(list(run_ids)))
    return query.where(
        r.c.created_at <= until, sa.or_(r.c.finished_at.is_(None), r.c.finished_at >= since)
    )


def report(
    database: Database,
    *,
    since: float,
    until: float,
    group_by: Sequence[Group],
    projects: Collection[str] | None = None,
) -> UsageReport:
    """The totals of the calls that ended between `since` and `until`, grouped by
    `group_by` (each of `GROUPS` at most once; none: the total only), of the runs of
    `projects` (None: every run). The events of the
    runs that were not finished before `since` are read in a stream (memory bounded by the
    number of groups)."""
    groups: dict[tuple[str | None, ...], _Sum] = {}
    total = _Sum()
    with database.stream() as db:
        rows = db.execute(_events(since, until, None, projects))
        for row, start, end in _calls(rows):
            at = end.timestamp
            if not since <= at <= until:
                continue
            one = _sum_of(start, end)
            values = {
                "day": datetime.datetime.fromtimestamp(at, datetime.UTC).date().isoformat(),
                "recipe": row.recipe_id,
                "schedule": row.schedule,
                "model": (start.model if start is not None else "") or None,
                "project": row.project,
            }
            if group_by:
                key = tuple(values[g] for g in group_by)
                groups.setdefault(key, _Sum()).add(one)
            total.add(one)
    ordered = sorted(groups.items(), key=lambda kv: tuple((v is None, v or "") for v in kv[0]))
    return UsageReport(
        since=since,
        until=until,
        group_by=tuple(group_by),
        rows=tuple(s.row(**dict(zip(group_by, key, strict=True))) for key, s in ordered),
        total=total.row(),
        prices=prices_source(),
    )


def so_far(database: Database, run_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """The usage of each of these runs as far as its stored events go (for runs that have
    not ended: the run's usage is written when it ends)."""
    found: dict[str, dict[str, int]] = {}
    if not run_ids:
        return found
    with database.read() as db:
        # Only the ends: they say the tokens (the starts, with their messages, are not read).
        rows = db.execute(_events(0.0, 0.0, run_ids, kinds=ENDS))
        for row, _start, end in _calls(rows):
            mine = found.setdefault(row.run_id, {})
            for name in _USAGE:
                mine[name] = mine.get(name, 0) + getattr(end.usage, name)
    return found
