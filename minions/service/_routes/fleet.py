"""The fleet: ``/workers``, ``/endpoints/status``, ``/queue``, ``/usage`` and
``/notifications`` (what the console's Workers, Endpoints, Queue and Usage views show)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from minions._duration import since as since_of
from minions.service._access import Reader
from minions.service._deps import InProject, Runs
from minions.service._errors import ERRORS, Refused
from minions.service._models import (
    DeliveryOut,
    EndpointStatusOut,
    QueueOut,
    UsageOut,
    WorkerOut,
)

__all__: list[str] = []

router = APIRouter(responses=ERRORS)


@router.get("/workers", response_model=list[WorkerOut])
async def workers(caller: Reader, runs: InProject) -> list[WorkerOut]:
    """The workers of the store: alive, stopped or dead (kept a day after their last
    heartbeat), their places (own concurrency), the runs each holds now (of the caller's
    projects, or of the one `project` named), version and last heartbeat."""
    return [WorkerOut.model_validate(w) for w in await runs.workers()]


@router.get("/endpoints/status", response_model=list[EndpointStatusOut])
async def endpoints(caller: Reader, runs: Runs) -> list[EndpointStatusOut]:
    """The model endpoints: each limited one's load over every worker (in flight, waiting,
    requests and tokens of the last minute, a 429's pause), and the output mode each model
    taught."""
    return [EndpointStatusOut.model_validate(e) for e in await runs.endpoint_status()]


@router.get("/queue", response_model=QueueOut)
async def queue(
    caller: Reader,
    runs: InProject,
    limit: Annotated[int, Query(ge=1, le=500, description="The oldest queued runs listed.")] = 20,
) -> QueueOut:
    """The backlog of the caller's projects (or of the one `project` named): runs queued
    (per recipe, the oldest first), running, and waiting for a person."""
    return QueueOut.model_validate(await runs.queue(limit=limit))


@router.get("/usage", response_model=UsageOut)
async def usage(
    caller: Reader,
    runs: InProject,
    since: Annotated[
        str,
        Query(
            max_length=64,
            description="From when: a duration back from now (24h, 7d) or an ISO 8601 date "
            "or time (UTC unless it says).",
        ),
    ] = "7d",
    group_by: Annotated[
        str,
        Query(
            max_length=64,
            description="Comma-separated, in order: day (UTC), recipe, schedule, model, "
            "project; empty: the total only.",
        ),
    ] = "day",
) -> UsageOut:
    """Tokens and cost of the model calls of the caller's projects' runs (an admin's: every
    project; or of the one `project` named) that ended since `since`, grouped; cost from the
    price table, unknown prices counted apart (``unpriced_calls``), never as 0."""
    now = time.time()
    try:
        start = since_of(since, now=now)
    except ValueError as exc:
        raise Refused(422, f"since: {exc}", "invalid_request") from None
    groups = [g.strip() for g in group_by.split(",") if g.strip()]
    try:
        report = await runs.usage(since=start, until=now, group_by=groups)
    except ValueError as exc:
        raise Refused(400, f"`group_by`: {exc}", "invalid_request") from None
    return UsageOut.model_validate(report)


@router.get("/notifications", response_model=list[DeliveryOut])
async def notifications(caller: Reader, runs: Runs) -> list[DeliveryOut]:
    """How notifications (``--notify`` of serve and workers) fared per target: delivered,
    pending, given up, the last error."""
    return [DeliveryOut.model_validate(d) for d in await runs.notifications()]
