"""The log of a service process (`serve` sets it up: the process is the server's): lines on
stderr, tracebacks without local variables (which hold tokens and requests, and took a
second each to render), and every secret the process knows redacted from every line,
whoever writes it: minions (structlog), uvicorn, DBOS, SQLAlchemy, asyncio (the standard
library's logging), now and in the future, since it is done where records are made."""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

__all__: list[str] = []

REDACTED = "[redacted]"
SECRET_NAMES = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
"""Environment variables whose values are secrets (``OPENAI_API_KEY``, ``MINIONS_API_TOKEN``,
``PGPASSWORD``...)."""
MIN_SECRET = 6
"""A shorter value is not redacted (it would blank out common words and numbers)."""


def secrets_of(
    token: str, environ: Mapping[str, str], database_url: str | None = None
) -> list[str]:
    """The secrets a service process knows: its token, the values of its environment's
    secret-named variables, its database's password."""
    found = [token, *(v for k, v in environ.items() if SECRET_NAMES.search(k))]
    if database_url:
        try:
            password = urlsplit(database_url).password
        except ValueError:
            password = None
        if password:
            found.append(password)
    return [s.strip() for s in found if len(s.strip()) >= MIN_SECRET]


class Redactor:
    """Replaces each of some secrets in a text with ``[redacted]`` (one regular expression,
    longest secrets first, so one inside another goes whole)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        ordered = sorted(set(secrets), key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern is not None else text


def install(redact: Redactor) -> None:
    """Set up the process's logging: structlog's warnings and errors on stderr, rendered
    without colours or local variables and redacted; every standard logging record redacted
    as it is made (its message merged, its traceback formatted without local variables)."""
    import structlog

    renderer = structlog.dev.ConsoleRenderer(
        colors=False, exception_formatter=structlog.dev.plain_traceback
    )

    def render(logger: Any, name: str, event: structlog.typing.EventDict) -> str:
        return redact(renderer(logger, name, event))

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            structlog.dev.set_exc_info,
            structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
            render,
        ],
        # Warnings and errors, as uvicorn's: a run's events (info) are in the run store.
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        redact_record(record, redact)
        return record

    logging.setLogRecordFactory(factory)


def redact_record(record: logging.LogRecord, redact: Redactor) -> None:
    """Merge a record's message, format its traceback (without local variables) and redact
    both, so that no handler or formatter sees a secret."""
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: the handler would have said so
        message = f"{record.msg!s} {record.args!r}"
    record.msg, record.args = redact(message), None
    if record.exc_info and record.exc_info[1] is not None:
        text = "".join(traceback.format_exception(record.exc_info[1], limit=50))
        record.exc_text = redact(text.rstrip("\n"))
        # The exception stays known to the loggers' filters (a worker's says a run that
        # failed normally in one line), its traceback text only to handlers.
        record.exc_value = record.exc_info[1]
        record.exc_info = None
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
