"""``/runs/{run_id}/events``: a run's events as JSON pages, and as Server-Sent Events."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi import Path as PathParam
from fastapi.responses import Response, StreamingResponse

from minions.events import event_to_json
from minions.service._deps import Config, Runs
from minions.service._errors import ERRORS, Refused
from minions.service._stream import sse_events

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

SEQ = re.compile(r"[0-9]{1,19}")
MAX_SEQ = 2**62
"""Sequence numbers and positions above this are refused (the databases hold 64 bits)."""
RunId = Annotated[str, PathParam(description="The run's id.", max_length=200)]
After = Annotated[int, Query(ge=0, le=MAX_SEQ, description="A sequence number.")]


@router.get("/runs/{run_id}/events", response_model=list[dict[str, Any]])
async def events(
    run_id: RunId,
    runs: Runs,
    after: After = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> Response:
    """The run's stored events after `after`, in order, at most `limit` (page on with the
    last one's `seq`)."""
    found = await runs.events(run_id, after=after, limit=limit)
    body = "[" + ",".join(event_to_json(e) for e in found) + "]"
    return Response(body, media_type="application/json")


@router.get(
    "/runs/{run_id}/events/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-Sent Events: `id:` is the sequence number.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
    },
)
async def stream(
    run_id: RunId,
    runs: Runs,
    config: Config,
    after: After = 0,
    last_event_id: Annotated[str | None, Header(description="Resume after this.")] = None,
) -> StreamingResponse:
    """The run's events as Server-Sent Events: stored ones after `after` (or the
    `Last-Event-ID` header), then new ones and token deltas live, ending after the run's
    terminal event."""
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not SEQ.fullmatch(text) or int(text) > MAX_SEQ:
            raise Refused(400, "`Last-Event-ID` must be an event's sequence number")
        after = int(text)
    await runs.get(run_id)
    return StreamingResponse(
        sse_events(runs, run_id, after=after, heartbeat=config.heartbeat),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
