"""Errors as the API answers them: ``{"error": {"type", "message"}}`` with a status, one table
from minions' errors to both, and never a traceback (nor anything of the server's) sent."""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minions.errors import (
    DiffTooLargeError,
    IdempotencyConflictError,
    InputError,
    KeyExistsError,
    MinionsError,
    RecipeError,
    RerunError,
    RunStateError,
    ScheduleExistsError,
    StoreError,
    UnknownKeyError,
    UnknownProjectError,
    UnknownRunError,
    UnknownScheduleError,
    UnknownStepError,
)
from minions.service._models import ErrorBody
from minions.service._recipes import problem_text

__all__: list[str] = []

log = structlog.get_logger(__name__)

ERROR_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "body_too_large",
    422: "invalid_request",
    500: "internal_error",
    503: "unavailable",
}

ERROR_TABLE: tuple[tuple[type[MinionsError], int, str], ...] = (
    (UnknownRunError, 404, "unknown_run"),
    (UnknownScheduleError, 404, "unknown_schedule"),
    (UnknownStepError, 404, "unknown_step"),
    (ScheduleExistsError, 409, "schedule_exists"),
    (UnknownKeyError, 404, "unknown_key"),
    (UnknownProjectError, 404, "unknown_project"),
    (KeyExistsError, 409, "key_exists"),
    (RunStateError, 409, "wrong_state"),
    (IdempotencyConflictError, 409, "idempotency_conflict"),
    (InputError, 400, "invalid_inputs"),
    (RerunError, 400, "invalid_rerun"),
    (DiffTooLargeError, 422, "diff_too_large"),
    (RecipeError, 400, "invalid_recipe"),
    (StoreError, 503, "unavailable"),
    (MinionsError, 400, "bad_request"),
)
"""Each of minions' errors a request may meet, its status and type: the first entry the error
is an instance of answers."""

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": ERROR_TYPES[status]}
    for status in (400, 401, 403, 404, 408, 409, 413, 422, 503)
}
"""The error answers every route documents."""


def error(status: int, message: str, kind: str | None = None, **extra: Any) -> JSONResponse:
    body = {"error": {"type": kind or ERROR_TYPES.get(status, "error"), "message": message}}
    body["error"].update(extra)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


class Refused(Exception):
    """A request refused by a route, with its status, message and type."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def install(app: FastAPI) -> None:
    """The app's error handlers."""

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
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
        status, kind = next((s, k) for t, s, k in ERROR_TABLE if isinstance(exc, t))
        if isinstance(exc, StoreError):
            log.error("run store error", path=request.url.path, error=str(exc))
            return error(503, "the run store cannot be used now; see the server's log", kind)
        if isinstance(exc, RunStateError) and exc.status is not None:
            return error(status, str(exc), kind, state=exc.status)
        return error(status, problem_text(exc), kind)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        # Only what fails outside the guard's barrier comes here (the barrier logs the
        # rest): the server logs it as it re-raises.
        return error(500, "the server failed on this request; see its log")
