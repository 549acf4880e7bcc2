"""The operating options of the long-running commands (`serve`, `worker`): ``--log-format``
(and ``MINIONS_LOG_FORMAT``), and the worker's ``--metrics-port`` / ``--health-port`` with
their hosts (see docs/operations.md)."""

from __future__ import annotations

import logging
import os
from typing import Annotated, Any

import typer

from minions import _logsetup
from minions.cli._errors import UsageError

__all__: list[str] = []

LogFormatOption = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        metavar="json|console",
        help="How the process logs, on stderr: console (lines for people) or json (one object "
        "per line; a traceback is a field). Default: $MINIONS_LOG_FORMAT, else console.",
        show_default=False,
    ),
]


def chosen_log_format(given: str | None) -> _logsetup.LogFormat:
    """The format of `--log-format` (or the environment's).

    Raises:
        UsageError: not a format.
    """
    try:
        return _logsetup.log_format(given, os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def set_up_logging(
    format: _logsetup.LogFormat,
    *,
    database_url: str | None,
    token: str | None = None,
    minions_info: bool = False,
) -> None:
    """The log of a server process: stderr, `format`, the token, the environment's secrets
    and the database's password redacted; warnings and errors, and minions' own info lines
    too when `minions_info` (a worker's: runs taken over, handed back, pruned, schedules
    fired)."""
    redact = _logsetup.Redactor(_logsetup.secrets_of(token, os.environ, database_url))
    _logsetup.install(redact, format=format)
    if minions_info:
        logging.getLogger("minions").setLevel(logging.INFO)


def say(err: Any, format: _logsetup.LogFormat, text: str, **fields: Any) -> None:
    """A line for the operator on stderr: printed as it is for people, or as a JSON log
    record (info, logger ``minions.cli``), so that a JSON log stays JSON line by line."""
    if format == "console":
        err.print(text, markup=False)
        return
    import structlog

    logging.getLogger("minions.cli").setLevel(logging.INFO)
    structlog.get_logger("minions.cli").info(text, **fields)
