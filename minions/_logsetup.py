"""The log of a minions process that is a server (`serve`, `worker`: they set it up, at the
edge; the library never does): one stream (stderr), one format for every record, whoever
writes it (minions through structlog; uvicorn, DBOS, SQLAlchemy, asyncio through the standard
library's logging, folded in with structlog's `ProcessorFormatter`):

* ``console``: lines for people; ``json``: one JSON object per line for machines (a
  traceback is the ``exception`` field, never a line of its own);
* tracebacks without local variables (which hold tokens and requests);
* every secret the process knows redacted from every record, now and in the future, since it
  is done where records are made and rendered;
* a run store outage said once when it goes and once when it is back (with how many lines
  about it were held back), not once per failed poll of every thread.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, TextIO
from urllib.parse import urlsplit

__all__: list[str] = []

LogFormat = Literal["console", "json"]
FORMATS: Final = ("console", "json")
FORMAT_ENV: Final = "MINIONS_LOG_FORMAT"
"""The environment's choice of format when no ``--log-format`` is given."""

REDACTED = "[redacted]"
SECRET_NAMES = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
"""Environment variables whose values are secrets (``OPENAI_API_KEY``, ``MINIONS_API_TOKEN``,
``PGPASSWORD``...)."""
MIN_SECRET = 6
"""A shorter value is not redacted (it would blank out common words and numbers)."""


def log_format(given: str | None, environ: Mapping[str, str] = os.environ) -> LogFormat:
    """The format asked for: `given` (``--log-format``), else ``MINIONS_LOG_FORMAT``, else
    ``console``.

    Raises:
        ValueError: not a format (the message names the choices).
    """
    chosen = (given or environ.get(FORMAT_ENV) or "console").strip().lower()
    if chosen == "json":
        return "json"
    if chosen == "console":
        return "console"
    where = "--log-format" if given else FORMAT_ENV
    raise ValueError(f"{where}: {chosen!r} is not a log format (use console or json)")


def secrets_of(
    token: str | None, environ: Mapping[str, str], database_url: str | None = None
) -> list[str]:
    """The secrets a process knows: its API token, the values of its environment's
    secret-named variables, its database's password."""
    found = [token or "", *(v for k, v in environ.items() if SECRET_NAMES.search(k))]
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


# -- a store outage, once ------------------------------------------------------------------------

_STORE_ERRORS = re.compile(
    r"OperationalError|InterfaceError|connection (?:refused|failed|is closed|reset)|"
    r"server closed the connection|terminating connection|could not connect|"
    r"the database system is (?:starting up|shutting down)|database is locked|"
    r"run store (?:unavailable|cannot be used)",
    re.IGNORECASE,
)


class StoreOutage(logging.Filter):
    """Says a run store outage once when it goes and once when it is back.

    The first record about the store failing (minions' "run store unavailable", or any
    library's record whose message or traceback is a database connection error) goes
    through, as one line (its traceback left out: it is the same each time); the others are
    held back and counted until a record says the store is back ("run store back"), which
    goes through with how many were held back. A second "back" (another part of the process
    noticing too) is held back as well.
    """

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        event = _event_of(record)
        if event.startswith("run store back"):
            if not self.down:
                return False
            self.down = False
            _set_field(record, "held_back", self.held)
            self.held = 0
            return True
        if not _about_a_store_failure(record, event):
            return True
        if self.down:
            self.held += 1
            return False
        self.down = True
        if not event.startswith("run store unavailable"):
            _set_event(record, f"run store unavailable: {_first_line(event, record)}")
        _drop_traceback(record)
        return True


_outage: StoreOutage | None = None
"""The filter of the process's log, once a server command set it up."""


def outage_said() -> bool:
    """The process's log said the run store went (any part of the process, a library's
    listener too) and nothing has said it is back yet."""
    return _outage is not None and _outage.down


def _event_of(record: logging.LogRecord) -> str:
    if isinstance(record.msg, dict):
        return str(record.msg.get("event", ""))
    return str(record.msg)


def _about_a_store_failure(record: logging.LogRecord, event: str) -> bool:
    if event.startswith("run store unavailable"):
        return True
    if record.levelno < logging.WARNING:
        return False
    text = event + " " + (record.exc_text or "")
    if isinstance(record.msg, dict):
        fields = record.msg
        text += f" {fields.get('error', '')} {fields.get('exception', '')}"
        found = fields.get("exc_info")
        if found is True:
            found = sys.exc_info()[1]  # still the logging call's: filters run inside it
        elif isinstance(found, tuple):
            found = found[1]
        if isinstance(found, BaseException):
            text += f" {type(found).__name__} {found}"
    return _STORE_ERRORS.search(text) is not None


def _first_line(event: str, record: logging.LogRecord) -> str:
    lines = [line for line in event.splitlines() if line.strip()]
    if not lines and record.exc_text:
        lines = record.exc_text.splitlines()[-1:]
    return lines[0].strip()[:300] if lines else "?"


def _set_event(record: logging.LogRecord, event: str) -> None:
    if isinstance(record.msg, dict):
        record.msg = {**record.msg, "event": event}
    else:
        record.msg, record.args = event, None


def _set_field(record: logging.LogRecord, name: str, value: Any) -> None:
    if isinstance(record.msg, dict):
        record.msg = {**record.msg, name: value}
    else:
        setattr(record, name, value)


def _drop_traceback(record: logging.LogRecord) -> None:
    record.exc_info, record.exc_text = None, None
    if isinstance(record.msg, dict):
        record.msg = {k: v for k, v in record.msg.items() if k not in ("exc_info", "exception")}


# -- the setup -----------------------------------------------------------------------------------


def install(
    redact: Redactor,
    *,
    format: LogFormat = "console",
    level: int = logging.WARNING,
    stream: TextIO | None = None,
) -> None:
    """Set up the process's logging (see the module's docstring): structlog's records and the
    standard library's, at `level` and above, in `format`, on `stream` (stderr), redacted."""
    import structlog
    from structlog.typing import EventDict

    timestamper = structlog.processors.TimeStamper(
        fmt="iso" if format == "json" else "%Y-%m-%d %H:%M:%S", utc=format == "json"
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        timestamper,
    ]

    def foreign_traceback(logger: Any, name: str, event: EventDict) -> EventDict:
        # A standard record's traceback was formatted (and redacted) as it was made.
        record = event.get("_record")
        if record is not None and record.exc_text and "exception" not in event:
            event["exception"] = record.exc_text
        extra = getattr(record, "held_back", None) if record is not None else None
        if extra is not None:
            event["held_back"] = extra
        return event

    def redacted(logger: Any, name: str, event: EventDict) -> EventDict:
        return {key: _redact_value(value, redact) for key, value in event.items()}

    renderer: Any
    if format == "json":
        renderer = structlog.processors.JSONRenderer(default=str)
    else:
        console = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )

        def renderer(logger: Any, name: str, event: EventDict) -> str:
            return redact(console(logger, name, event))

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, foreign_traceback],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.StackInfoRenderer(),
            # Tracebacks as plain text (no local variables), in their record's field.
            structlog.processors.format_exc_info,
            redacted,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter)
    global _outage
    _outage = StoreOutage()
    handler.addFilter(_outage)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    # DBOS adds a handler of its own (its format, on stderr) unless its logger has one.
    dbos = logging.getLogger("dbos")
    dbos.handlers = [handler]
    dbos.propagate = False
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.dev.set_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    make = logging.getLogRecordFactory()
    if getattr(make, "minions_redacts", False):
        make = make.made_by  # type: ignore[attr-defined]  # installed before: not twice

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if not isinstance(record.msg, dict):  # structlog's are redacted as they are rendered
            redact_record(record, redact)
        return record

    factory.minions_redacts = True  # type: ignore[attr-defined]
    factory.made_by = make  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _redact_value(value: Any, redact: Redactor) -> Any:
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(json.dumps(value, default=str) if isinstance(value, dict | list) else str(value))


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
