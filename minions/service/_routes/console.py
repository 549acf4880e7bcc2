"""The console: one page and its static files, ES modules and a style sheet (no token needed
to load them; everything they show comes from the API, with the token), and ``names.js``, the
names the console shares with the server, written from the server's own lists:
`RUN_STATUSES` and `TERMINAL_STATUSES` (a run's statuses, and those of a run that has ended:
`minions._fold`), `EXECUTION_STATUSES` and `ENDED_STATUSES` (an execution's, and those of one
that has ended), `EVENT_KINDS` (every kind of event, `minions.events`) and `TERMINAL_KINDS`
(those that end a run's log), and `AUDIT_ACTIONS` (`minions.runs`)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import PurePath
from typing import get_args

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from minions._fold import ENDED, EXECUTION_STATUSES, RUN_STATUSES, TERMINAL, TERMINAL_KINDS
from minions.events import Event
from minions.runs import AUDIT_ACTIONS
from minions.service._access import Public
from minions.service._errors import Refused

__all__: list[str] = []

router = APIRouter(include_in_schema=False)
CONSOLE = resources.files("minions.service") / "console"
TYPES = {".js": "text/javascript", ".css": "text/css"}
NAMES = "names.js"
"""Written by the server (`names`), not a file."""
FILES = frozenset(
    {
        NAMES,
        *(
            item.name
            for item in CONSOLE.iterdir()
            if item.is_file() and PurePath(item.name).suffix in TYPES
        ),
    }
)
"""The console's files (served without the token; any other name needs it)."""


@cache
def names() -> bytes:
    """``names.js``: the statuses and event kinds, as the server spells them."""
    kinds = [kind().kind for kind in get_args(Event)]
    lists = {
        "RUN_STATUSES": list(RUN_STATUSES),
        "TERMINAL_STATUSES": sorted(TERMINAL),
        "EXECUTION_STATUSES": list(EXECUTION_STATUSES),
        "ENDED_STATUSES": sorted(ENDED),
        "EVENT_KINDS": kinds,
        "TERMINAL_KINDS": sorted(TERMINAL_KINDS),
        "AUDIT_ACTIONS": list(AUDIT_ACTIONS),
    }
    lines = [f"export const {name} = {json.dumps(value)};" for name, value in lists.items()]
    head = "// Written by the server from its own lists (minions._fold, .events, .runs).\n"
    return (head + "\n".join(lines) + "\n").encode()


@router.get("/", response_class=HTMLResponse)
async def index(anyone: Public) -> HTMLResponse:
    return HTMLResponse(CONSOLE.joinpath("index.html").read_text(encoding="utf-8"))


@router.get("/console/{name}")
async def asset(anyone: Public, name: str) -> Response:
    if name not in FILES:
        raise Refused(404, f"no console file {name!r}")
    media_type = TYPES[PurePath(name).suffix]
    body = names() if name == NAMES else CONSOLE.joinpath(name).read_bytes()
    return Response(body, media_type=media_type)
