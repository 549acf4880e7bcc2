"""The console: one page and its static files (no token needed to load them; everything they
show comes from the API, with the token)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from minions.service._errors import Refused

__all__: list[str] = []

router = APIRouter(include_in_schema=False)
CONSOLE = resources.files("minions.service") / "console"
TYPES = {".js": "text/javascript", ".css": "text/css"}


@router.get("/", response_class=HTMLResponse)
async def index() -> HTMLResponse:
    return HTMLResponse(CONSOLE.joinpath("index.html").read_text(encoding="utf-8"))


@router.get("/console/{name}")
async def asset(name: str) -> Response:
    suffix = Path(name).suffix
    if "/" in name or suffix not in TYPES or not CONSOLE.joinpath(name).is_file():
        raise Refused(404, f"no console file {name!r}")
    return Response(CONSOLE.joinpath(name).read_bytes(), media_type=TYPES[suffix])
