"""The console: one page and its static files (no token needed to load them; everything they
show comes from the API, with the token)."""

from __future__ import annotations

from importlib import resources
from pathlib import PurePath

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from minions.service._errors import Refused

__all__: list[str] = []

router = APIRouter(include_in_schema=False)
CONSOLE = resources.files("minions.service") / "console"
TYPES = {".js": "text/javascript", ".css": "text/css"}
FILES = frozenset(
    item.name
    for item in CONSOLE.iterdir()
    if item.is_file() and PurePath(item.name).suffix in TYPES
)
"""The console's files (served without the token; any other name needs it)."""


@router.get("/", response_class=HTMLResponse)
async def index() -> HTMLResponse:
    return HTMLResponse(CONSOLE.joinpath("index.html").read_text(encoding="utf-8"))


@router.get("/console/{name}")
async def asset(name: str) -> Response:
    if name not in FILES:
        raise Refused(404, f"no console file {name!r}")
    media_type = TYPES[PurePath(name).suffix]
    return Response(CONSOLE.joinpath(name).read_bytes(), media_type=media_type)
