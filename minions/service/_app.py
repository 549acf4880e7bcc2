"""The FastAPI application: runs, their events (JSON pages and Server-Sent Events), recipes,
workers, health, and the console page; bearer-token auth, a body size limit, and errors as
``{"error": {"type", "message"}}`` with no traceback ever sent."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import structlog
from fastapi import FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minions._version import __version__
from minions.errors import MinionsError, RecipeError, RunStateError, StoreError, UnknownRunError
from minions.runs import RunRecord, RunStore
from minions.runs._runner import LiveHub
from minions.runs._store import Store
from minions.service._feeds import Feeds
from minions.service._models import (
    ApprovalRequest,
    ErrorBody,
    GraphNode,
    Health,
    RecipeOut,
    RunOut,
    RunPage,
    RunSummary,
    Status,
    SubmitRequest,
    Submitted,
    WorkerOut,
)
from minions.service._recipes import RecipeCatalog, check_inline, problem_text
from minions.service._stream import sse_events

__all__ = ["ServiceConfig", "create_app"]

log = structlog.get_logger(__name__)

MAX_SEQ = 2**62
"""Sequence numbers and positions above this are refused (the databases hold 64 bits)."""
RunId = Annotated[str, PathParam(description="The run's id.", max_length=200)]
PUBLIC_PATHS = frozenset({"/health", "/", "/favicon.ico"})
PUBLIC_PREFIX = "/console/"


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """What a service process serves.

    Attributes:
        token: the bearer token every request but ``/health`` (and the console's static page)
            must carry.
        database_url: the run store (see `minions.runs.database_url`).
        recipes: the folder of the recipes clients may run by id (None: none).
        allow_inline_recipes: accept recipe YAML in a submission; it may still name only
            built-in tools and tools modules of `recipes`.
        max_body_bytes: a larger request body is refused with 413.
        heartbeat: seconds of silence after which an event stream sends a comment line.
        poll: seconds between a followed run's reads of the store when nothing woke it.
    """

    token: str
    database_url: str | None = None
    recipes: Path | None = None
    allow_inline_recipes: bool = False
    max_body_bytes: int = 1 << 20
    heartbeat: float = 15.0
    poll: float = 0.1


ERROR_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    422: "invalid_request",
    500: "internal_error",
    503: "unavailable",
}


def error(status: int, message: str, kind: str | None = None) -> JSONResponse:
    body = {"error": {"type": kind or ERROR_TYPES.get(status, "error"), "message": message}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _Guard:
    """Bearer-token auth and the body size limit, before any route runs (an unknown path
    without a token is a 401, not a 404: nothing is told to strangers)."""

    def __init__(self, app: Any, *, token: str, max_body: int) -> None:
        self.app = app
        self.token = token.encode()
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIX):
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            scheme, _, credentials = given.partition(b" ")
            if not given:
                message = "this endpoint needs an Authorization: Bearer <token> header"
                await error(401, message)(scope, receive, send)
                return
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credentials.strip(), self.token
            ):
                await error(401, "the bearer token is wrong")(scope, receive, send)
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._body(scope, receive)
            if body is None:
                message = f"the request body is larger than {self.max_body} bytes"
                await error(413, message)(scope, receive, send)
                return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": ERROR_TYPES[status]}
    for status in (400, 401, 403, 404, 409, 413, 422)
}


def _summary(record: RunRecord) -> RunSummary:
    return RunSummary(
        run_id=record.run_id,
        recipe=record.recipe_id,
        status=record.status,
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        usage=record.usage,
        error=record.error,
        executor_id=record.executor_id,
    )


def _graph(recipe_yaml: str) -> list[GraphNode]:
    from minions.recipes._loader import parse_spec

    try:
        spec, _ = parse_spec(recipe_yaml)
    except RecipeError:
        return []
    nodes = []
    for step in spec.steps:
        kind = (
            "tool"
            if step.tool
            else "recipe"
            if step.recipe
            else "analysis"
            if step.analyze
            else "agent"
        )
        nodes.append(
            GraphNode(
                id=step.id,
                kind=kind,
                depends_on=list(step.depends_on),
                next=[n.step for n in step.next],
            )
        )
    return nodes


def _cursor(record: RunSummary) -> str:
    raw = json.dumps([record.created_at, record.run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _position(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, run_id = json.loads(raw)
        if not isinstance(run_id, str) or not isinstance(created, int | float):
            raise ValueError
        return float(created), run_id
    except (ValueError, TypeError, UnicodeDecodeError):
        raise _Refused(
            400, "`cursor` is not a cursor this server gave (pass next_cursor as it came)"
        ) from None


def create_app(config: ServiceConfig, *, hub: LiveHub | None = None) -> FastAPI:
    """The service's ASGI application over the run store of `config`.

    Args:
        config: what to serve.
        hub: the live events of a worker in this process (token deltas reach the streams
            only through it).
    """
    catalog = RecipeCatalog(config.recipes)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runs = RunStore(config.database_url, create=True)
        store = Store(runs.url)
        feeds = Feeds(store, hub=hub, poll=config.poll)
        await feeds.start()
        await asyncio.to_thread(catalog.scan)
        state.update(runs=runs, store=store, feeds=feeds)
        try:
            yield
        finally:
            await feeds.stop()
            store.close()
            runs.close()

    app = FastAPI(
        title="minions",
        version=__version__,
        description="Durable runs of minions recipes: submit, watch, cancel, resume, approve.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )

    def runs() -> RunStore:
        found: RunStore = state["runs"]
        return found

    # -- errors ------------------------------------------------------------------------------

    @app.exception_handler(_Refused)
    async def refused(request: Request, exc: _Refused) -> JSONResponse:
        return error(exc.status, exc.message, exc.kind)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no endpoint {request.method} {request.url.path}"
        return error(exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for item in exc.errors():
            where = ".".join(str(p) for p in item.get("loc", ()))
            if item.get("type") == "json_invalid":
                return error(400, "the body is not valid JSON", "invalid_json")
            problems.append(f"{where}: {item.get('msg', 'invalid')}")
        return error(422, "; ".join(problems) or "invalid request")

    @app.exception_handler(MinionsError)
    async def minions_error(request: Request, exc: MinionsError) -> JSONResponse:
        if isinstance(exc, UnknownRunError):
            return error(404, str(exc), "unknown_run")
        if isinstance(exc, RunStateError):
            return error(409, str(exc), "wrong_state")
        if isinstance(exc, RecipeError):
            kind = "invalid_inputs" if exc.what == "inputs" else "invalid_recipe"
            return error(400, problem_text(exc), kind)
        if isinstance(exc, StoreError):
            log.error("run store error", error=str(exc))
            return error(503, "the run store cannot be used now; see the server's log")
        return error(400, str(exc))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed", path=request.url.path)
        return error(500, "the server failed on this request; see its log")

    # -- runs --------------------------------------------------------------------------------

    @app.post("/runs", status_code=201, response_model=Submitted, responses=ERRORS)
    async def submit(body: SubmitRequest) -> Submitted:
        """Queue a run (the same run again for a repeated `idempotency_key`)."""
        store = runs()
        if (body.recipe is None) == (body.recipe_yaml is None):
            raise _Refused(400, "give either `recipe` (a recipe id) or `recipe_yaml`")
        if body.recipe_yaml is not None:
            if not config.allow_inline_recipes:
                raise _Refused(
                    403,
                    "`recipe_yaml`: this server takes no inline recipes (start it with "
                    "--allow-inline-recipes); submit a recipe id from GET /recipes",
                )
            check_inline(body.recipe_yaml, catalog.folder)
            run_id, created = await store.submit_yaml(
                body.recipe_yaml,
                body.inputs,
                base=catalog.folder or Path.cwd(),
                idempotency_key=body.idempotency_key,
            )
        else:
            assert body.recipe is not None
            entry = await asyncio.to_thread(catalog.find, body.recipe)
            if entry is None:
                known = ", ".join(sorted(catalog.scan())) or "none"
                raise _Refused(
                    400,
                    f"`recipe`: no recipe {body.recipe!r} here; known: {known}",
                    "unknown_recipe",
                )
            run_id, created = await store.submit(
                entry.path, body.inputs, idempotency_key=body.idempotency_key
            )
        if created:  # just stored as queued: no need to read it back
            return Submitted(run_id=run_id, status="queued", created=True)
        record = await store.get(run_id)
        return Submitted(run_id=run_id, status=record.status, created=False)

    @app.get("/runs", response_model=RunPage, responses=ERRORS)
    async def list_runs(
        status: Annotated[Status | None, Query(description="Only runs in this status.")] = None,
        recipe: Annotated[str | None, Query(description="Only runs of this recipe id.")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(description="`next_cursor` of a page.")] = None,
    ) -> RunPage:
        """Runs, newest first, a page at a time."""
        before = _position(cursor) if cursor else None
        records = await runs().list_runs(status=status, recipe=recipe, limit=limit, before=before)
        summaries = [_summary(r) for r in records]
        more = len(summaries) == limit
        return RunPage(runs=summaries, next_cursor=_cursor(summaries[-1]) if more else None)

    @app.get("/runs/{run_id}", response_model=RunOut, responses=ERRORS)
    async def get_run(run_id: RunId) -> RunOut:
        """A run: status, finished steps, approvals, usage, output, error, and its recipe's
        steps as a graph."""
        store = runs()
        record = await store.get(run_id)
        graph = _graph(await store.recipe_yaml(run_id))
        data = dataclasses.asdict(record)
        return RunOut(
            **_summary(record).model_dump(),
            inputs=record.inputs,
            output=record.output,
            steps=data["steps"],
            approvals=data["approvals"],
            graph=graph,
        )

    @app.post("/runs/{run_id}/cancel", response_model=RunOut, responses=ERRORS)
    async def cancel(run_id: RunId) -> RunOut:
        """Cancel a run: a queued one at once, a running one at its next step boundary."""
        await runs().cancel(run_id, wait=5.0)
        return await get_run(run_id)

    @app.post("/runs/{run_id}/resume", response_model=RunOut, responses=ERRORS)
    async def resume(run_id: RunId) -> RunOut:
        """Queue a failed or cancelled run again, from its last completed step."""
        await runs().resume(run_id)
        return await get_run(run_id)

    @app.post("/runs/{run_id}/approvals/{call_id:path}", response_model=RunOut, responses=ERRORS)
    async def approve(
        run_id: RunId,
        call_id: Annotated[str, PathParam(description="The call's id.", max_length=500)],
        body: ApprovalRequest,
    ) -> RunOut:
        """Approve or reject a call the run waits for."""
        await runs().approve(run_id, call_id, approved=body.approve, reason=body.reason)
        return await get_run(run_id)

    # -- events ------------------------------------------------------------------------------

    @app.get("/runs/{run_id}/events", response_model=list[dict[str, Any]], responses=ERRORS)
    async def events(
        run_id: RunId,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="A sequence number.")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    ) -> list[dict[str, Any]]:
        """The run's stored events after `after`, in order, at most `limit` (page on with
        the last one's `seq`)."""
        return await runs().events(run_id, after=after, limit=limit)

    @app.get(
        "/runs/{run_id}/events/stream",
        response_class=StreamingResponse,
        responses={
            **ERRORS,
            200: {
                "description": "Server-Sent Events: `id:` is the sequence number.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
        },
    )
    async def stream(
        run_id: RunId,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="A sequence number.")] = 0,
        last_event_id: Annotated[str | None, Header(description="Resume after this.")] = None,
    ) -> StreamingResponse:
        """The run's events as Server-Sent Events: stored ones after `after` (or the
        `Last-Event-ID` header), then new ones and token deltas live, ending after the run's
        terminal event."""
        if last_event_id is not None and last_event_id.strip():
            text = last_event_id.strip()
            if not text.isdigit() or int(text) > MAX_SEQ:
                raise _Refused(400, "`Last-Event-ID` must be an event's sequence number")
            after = int(text)
        await runs().get(run_id)
        return StreamingResponse(
            sse_events(
                state["store"], state["feeds"], run_id, after=after, heartbeat=config.heartbeat
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # -- the rest ----------------------------------------------------------------------------

    @app.get("/recipes", response_model=list[RecipeOut], responses=ERRORS)
    async def recipes() -> list[RecipeOut]:
        """The recipes of the server's folder: ids, descriptions, input schemas."""
        entries = await asyncio.to_thread(catalog.scan)
        folder = catalog.folder
        assert folder is not None or not entries
        return [
            RecipeOut(
                id=e.id,
                description=e.description,
                file=str(e.path.relative_to(folder)) if folder else e.path.name,
                inputs=e.inputs,
            )
            for e in entries.values()
        ]

    @app.get("/workers", response_model=list[WorkerOut], responses=ERRORS)
    async def workers() -> list[WorkerOut]:
        """The workers of the store: ids, heartbeats, runs in hand."""
        from minions.runs._durable import DEAD_AFTER

        now = time.time()
        return [
            WorkerOut(
                **dataclasses.asdict(w),
                alive=w.stopped_at is None and now - w.heartbeat_at <= DEAD_AFTER,
            )
            for w in await runs().workers()
        ]

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        """Up (no token needed)."""
        return Health(status="ok", version=__version__)

    console = resources.files("minions.service") / "console"

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(console.joinpath("index.html").read_text(encoding="utf-8"))

    @app.get("/console/{name}", include_in_schema=False)
    async def asset(name: str) -> Any:
        from fastapi.responses import Response

        types = {".js": "text/javascript", ".css": "text/css"}
        suffix = Path(name).suffix
        if "/" in name or suffix not in types or not console.joinpath(name).is_file():
            raise _Refused(404, f"no console file {name!r}")
        return Response(console.joinpath(name).read_bytes(), media_type=types[suffix])

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}
            }
            for path, operations in schema["paths"].items():
                for operation in operations.values():
                    if path != "/health":
                        operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(_Guard, token=config.token, max_body=config.max_body_bytes)
    return app
