"""Durations as people write them in options and files: one grammar for all of them (the
retention of runs, `runs prune --older-than`, a step's ``cache.ttl``, the limits file, a
schedule's ``every``), with one bound.

A duration is a number of seconds (``90``, ``1.5``; in YAML or JSON, a number too), or a
number with a unit, ``s``, ``m``, ``h``, ``d`` or ``w``, or a sum of them (``1h30m``). It is
longer than nothing and at most `LONGEST`: a longer one is an error that says so, rather than
a date past what a computer's clock holds.
"""

from __future__ import annotations

import math
import re

__all__: list[str] = []

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
LONGEST = 3650 * 86400.0
"""The longest duration minions takes: 3650 days (ten years)."""
_LONGEST = "3650d (ten years)"
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_GRAMMAR = (
    "give a positive duration: seconds, or a number and a unit, s, m, h, d or w "
    "(90, 90s, 5m, 12h, 30d, 2w, 1h30m)"
)


class TooLongError(ValueError):
    """A duration longer than `LONGEST`."""


def duration_seconds(value: float | str, *, whole: bool = False, zero: bool = False) -> float:
    """The seconds of duration `value` (see the module's docstring). `whole`: a whole number
    of seconds, at least one. `zero`: no time at all is a duration too.

    Raises:
        ValueError: `value` is not such a duration (the message names it).
        TooLongError: it is longer than `LONGEST` (the message names it and the limit).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a duration: {_GRAMMAR}")
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        else:
            parts = _PART.findall(text)
            if not text or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"{value!r} is not a duration: {_GRAMMAR}")
            seconds = sum(float(n) * UNITS[u] for n, u in parts)
    else:
        seconds = float(value)
    if math.isnan(seconds) or seconds < 0 or (seconds == 0 and not zero):
        raise ValueError(f"{value!r} is not a duration: {_GRAMMAR}")
    if seconds > LONGEST:
        raise TooLongError(
            f"{value!r} is longer than {_LONGEST}, the longest duration minions takes"
        )
    if whole and seconds != int(seconds):
        raise ValueError(f"{value!r} is not a whole number of seconds")
    return seconds


def spoken(seconds: float) -> str:
    """A duration as the grammar writes it, largest units first (``2h``, ``1h30m``, ``45s``,
    ``1.5s``): what a message says of a duration given in it."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    left = round(seconds)
    parts = []
    for unit in ("w", "d", "h", "m", "s"):
        size = int(UNITS[unit])
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def since(value: str, *, now: float) -> float:
    """The moment `value` names (Unix seconds): a duration back from `now` (``24h``,
    ``7d``), or an ISO 8601 date or time (``2026-11-01``, ``2026-11-01T09:00:00+01:00``; UTC
    when it names no offset).

    Raises:
        ValueError: `value` is neither (the message names it and both forms).
    """
    import datetime

    try:
        return now - duration_seconds(value)
    except TooLongError:
        raise
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"{value!r} is neither a duration back from now (24h, 7d, 2w) nor an ISO 8601 "
            "date or time (2026-11-01, 2026-11-01T09:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()
