"""``/runs/{run_id}/events``: a run's events as JSON pages, and as Server-Sent Events (with
the states of its steps the server folds from them, when asked)."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi import Path as PathParam
from fastapi.responses import Response, StreamingResponse

from minions.events import event_to_json
from minions.service._access import Reader
from minions.service._deps import Config, Runs, Streams
from minions.service._errors import ERRORS, Refused
from minions.service._models import Ticket
from minions.service._stream import EventStream
from minions.service._tickets import Tickets

__all__: list[str] = []

router = APIRouter(responses=ERRORS)

SEQ = re.compile(r"[0-9]{1,19}")
MAX_SEQ = 2**62
"""Sequence numbers and positions above this are refused (the databases hold 64 bits)."""
SSE_MESSAGE = {
    "type": "object",
    "description": "One message of the stream.",
    "properties": {
        "id": {"type": "string", "description": "The event's sequence number (none: a delta)."},
        "event": {"type": "string", "description": "The event's kind."},
        "data": {"type": "string", "description": "The event, as JSON (as in `/events`)."},
    },
    "required": ["event", "data"],
}
RunId = Annotated[str, PathParam(description="The run's id.", max_length=200)]
After = Annotated[int, Query(ge=0, le=MAX_SEQ, description="A sequence number.")]


@router.get("/runs/{run_id}/events", response_model=list[dict[str, Any]])
async def events(
    caller: Reader,
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
            "content": {"text/event-stream": {"schema": SSE_MESSAGE}},
        },
        204: {"description": "The run has ended and the client has its every event."},
    },
)
async def stream(
    caller: Reader,
    run_id: RunId,
    runs: Runs,
    config: Config,
    streams: Streams,
    after: After = 0,
    last_event_id: Annotated[
        str | None, Header(description="Resume after this sequence number.", max_length=40)
    ] = None,
    ticket: Annotated[
        str | None,
        Query(
            description="Instead of the token (for a browser's EventSource): a ticket from "
            "`POST /runs/{run_id}/events/ticket`.",
            max_length=100,
        ),
    ] = None,
    states: Annotated[
        bool,
        Query(
            description="Also send the run's step states (as `GET /runs/{run_id}/steps` "
            "gives them) in messages of type `states` (no `id:`): every execution first, "
            "then after each event the executions it changed."
        ),
    ] = False,
) -> Response:
    """The run's events as Server-Sent Events: stored ones after `after` (or the
    `Last-Event-ID` header), then new ones and token deltas live, ending after the run's
    terminal event. A client that has the run's every event already (its position is at or
    past the end of a run that has ended) gets `204 No Content`, which tells a browser's
    `EventSource` not to come back. A stream opened with a named key ends, with a message
    of type `revoked`, when the key is revoked; one whose follow fails on the server (a
    damaged store), with a message of type `unavailable` (resume from the last id)."""
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not SEQ.fullmatch(text) or int(text) > MAX_SEQ:
            raise Refused(400, "`Last-Event-ID` must be an event's sequence number")
        after = int(text)
    record = await runs.get(run_id)
    if record.terminal and not await runs.events(run_id, after=after, limit=1):
        return Response(status_code=204)
    folded = await runs.step_states(record) if states else None
    key = None
    if caller.revocable:
        key_id = caller.key_id

        async def works() -> bool:
            return await runs.key_by_id(key_id) is not None

        key = (caller.name, works)
    return EventStream(
        runs,
        run_id,
        after=after,
        heartbeat=config.heartbeat,
        count=streams,
        states=folded,
        key=key,
    )


@router.post("/runs/{run_id}/events/ticket", response_model=Ticket)
async def ticket(caller: Reader, run_id: RunId, runs: Runs, config: Config) -> Ticket:
    """A ticket that opens this run's event stream for a short while without the token
    (`GET /runs/{run_id}/events/stream?ticket=...`): for a browser's `EventSource`, which
    cannot send an `Authorization` header. The long-lived token never goes in a URL."""
    await runs.get(run_id)
    value, expires = Tickets(config.token).issue(run_id, key_id=caller.key_id, now=time.time())
    return Ticket(ticket=value, expires_at=expires)
