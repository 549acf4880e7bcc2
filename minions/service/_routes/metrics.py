"""``/metrics`` (``minions serve --metrics``): the Prometheus text exposition of this
process's metrics and of the store's gauges, computed at each scrape from a few cheap reads
(`RunStore.fleet`), off the event loop. A store that cannot be read makes
``minions_store_up 0`` and leaves its gauges out; the process's metrics are still served."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minions.service._access import Scraper
from minions.service._deps import WholeStore
from minions.service._ready import READY_TIMEOUT

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from minions.runs import FleetState

__all__: list[str] = []

router = APIRouter()

MAX_SCHEDULES: Final = 500
"""Schedules given a lag series at most (the first by name): a label's values stay bounded."""


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
async def metrics(_: Scraper, request: Request, runs: WholeStore) -> Response:
    """The metrics of this process and the store's gauges, in Prometheus's text format."""
    state: FleetState | None
    try:
        async with asyncio.timeout(READY_TIMEOUT):
            state = await runs.fleet()
    except Exception:  # down, refusing, slow: said by minions_store_up
        state = None
    exported = request.app.state.metrics
    body = await asyncio.to_thread(exported.exposition, fleet_families(state))
    return Response(body, media_type=exported.content_type)


def fleet_families(state: FleetState | None) -> list[Metric]:
    """The store's gauges (`FleetState`) as Prometheus metric families."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    up = GaugeMetricFamily("minions_store_up", "1 when the run store answered this scrape, else 0.")
    up.add_metric([], 0 if state is None else 1)
    if state is None:
        return [up]

    def gauge(name: str, text: str, value: float) -> Any:
        family = GaugeMetricFamily(name, text)
        family.add_metric([], value)
        return family

    found = [
        up,
        gauge("minions_runs_queued", "Runs waiting for a worker.", state.queued),
        gauge(
            "minions_runs_oldest_queued_seconds",
            "Seconds the oldest queued run has waited for a worker (0: none queued).",
            state.oldest_queued_age,
        ),
        gauge("minions_runs_running", "Runs a worker runs now.", state.running),
        gauge(
            "minions_runs_waiting_approval",
            "Runs waiting for a person's approval.",
            state.waiting,
        ),
        gauge(
            "minions_workers_alive",
            "Workers that beat within the dead-worker timeout.",
            state.workers_alive,
        ),
        gauge(
            "minions_workers_dead",
            "Workers that stopped beating without stopping (killed, frozen, cut off).",
            state.workers_dead,
        ),
    ]
    lag = GaugeMetricFamily(
        "minions_schedule_lag_seconds",
        "Seconds the schedule's next slot is overdue (0: not due yet); paused ones are left out.",
        labels=["schedule"],
    )
    for name, seconds in list(state.schedule_lag().items())[:MAX_SCHEDULES]:
        lag.add_metric([name], seconds)
    found.append(lag)
    late = GaugeMetricFamily(
        "minions_schedule_late",
        "1 when the schedule's latest slots fired over a minute late or were skipped (overlap, "
        "catch-up, backlog), else 0; paused ones are left out.",
        labels=["schedule"],
    )
    late_slots = CounterMetricFamily(
        "minions_schedule_late_slots",
        "Slots of the schedule that fired over a minute late or were skipped, since it was "
        "added; paused ones are left out.",
        labels=["schedule"],
    )
    for schedule in state.schedules[:MAX_SCHEDULES]:
        late.add_metric([schedule.name], 1 if schedule.late else 0)
        late_slots.add_metric([schedule.name], schedule.late_slots)
    found += [late, late_slots]
    per_endpoint = (
        (
            "minions_endpoint_calls_in_flight",
            "Calls holding a place under the limits.",
            "in_flight",
        ),
        (
            "minions_endpoint_waiting_workers",
            "Workers whose first caller waits in the store's line for a place.",
            "waiting",
        ),
        (
            "minions_endpoint_requests_last_minute",
            "Calls started within the last minute.",
            "requests",
        ),
        (
            "minions_endpoint_tokens_last_minute",
            "Tokens of the calls started within the last minute.",
            "tokens",
        ),
    )
    for name, text, field in per_endpoint:
        family = GaugeMetricFamily(name, f"{text} By limited endpoint.", labels=["endpoint"])
        for load in state.endpoints:
            family.add_metric([load.endpoint], getattr(load, field))
        found.append(family)
    paused = GaugeMetricFamily(
        "minions_endpoint_paused_seconds",
        "Seconds a 429's Retry-After still holds every call to the endpoint (0: none).",
        labels=["endpoint"],
    )
    for load in state.endpoints:
        paused.add_metric([load.endpoint], max(0.0, load.paused_until - state.at))
    found.append(paused)
    return found
