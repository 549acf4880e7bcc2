"""Logging through structlog, as a library should: never configured here, and quiet unless the
application configured structlog (unconfigured structlog prints everything to stdout)."""

from __future__ import annotations

import sys
from typing import Any

__all__: list[str] = []


def configured_logger(name: str = "minions") -> Any | None:
    """structlog's logger when the application configured structlog, else ``None``."""
    structlog = sys.modules.get("structlog")
    if structlog is None or not structlog.is_configured():
        return None
    return structlog.get_logger(name)


def info(event: str, **fields: Any) -> None:
    """Log `event` at info level, only where the application configured structlog."""
    logger = configured_logger()
    if logger is not None:
        logger.info(event, **fields)


def loud_logger(name: str = "minions") -> Any:
    """A logger for what must be seen even when the application configured nothing: structlog's
    logger when it is configured, else structlog's default rendering on stderr.

    Unconfigured structlog prints to stdout, which may carry a program's output (`minions run`
    prints the run's output there); stdlib logging's last-resort handler writes to stderr too.
    """
    import structlog

    if structlog.is_configured():
        return structlog.get_logger(name)
    return structlog.wrap_logger(structlog.PrintLogger(sys.stderr))


def warn(event: str, **fields: Any) -> None:
    """Log `event` as a warning: through structlog, configured or not (a warning is worth
    printing; on stderr when the application configured nothing)."""
    loud_logger().warning(event, **fields)
