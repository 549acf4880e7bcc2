"""Shared helpers for the benchmark workloads of ../shared/benchmarks/WORKLOADS.md.

Each workload is a script that prints one JSON line per variant on stdout.
"""

from __future__ import annotations

import asyncio
import gc
import json
import platform
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

RSS_AFTER_IMPORT_MIB: float = 0.0


def _rss_mib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def mark_imported() -> None:
    """Call after the imports a workload needs, to record `rss_after_import_mib`."""
    global RSS_AFTER_IMPORT_MIB
    RSS_AFTER_IMPORT_MIB = _rss_mib()


def summary(values: list[float], unit: str, *, digits: int = 3) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
        "unit": unit,
    }


def server_xacts(url: str) -> int:
    """The transactions a Postgres server counted for the database so far."""
    import psycopg

    with psycopg.connect(url) as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        row = connection.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def emit(
    workload: str,
    variant: str,
    *,
    primary: str,
    metrics: dict[str, dict[str, Any]],
    headline: bool = True,
    extra: dict[str, Any] | None = None,
    anchor: tuple[str, str] | None = None,
) -> None:
    """Print the workload's JSON line; `anchor`: (name, version) of a peer measured instead
    of minions."""
    if anchor is None:
        import minions

        anchor = ("minions", minions.__version__)
    line = {
        "anchor": anchor[0],
        "anchor_version": anchor[1],
        "workload": workload,
        "variant": variant,
        "headline": headline,
        "primary": primary,
        "metrics": metrics,
        "peak_rss_mib": round(_rss_mib(), 1),
        "rss_after_import_mib": round(RSS_AFTER_IMPORT_MIB, 1),
        "python": platform.python_version(),
        "extra": extra or {},
    }
    print(json.dumps(line), flush=True)


def time_async(fn: Callable[[], Awaitable[Any]], *, warmups: int, repetitions: int) -> list[float]:
    """Seconds per repetition of `await fn()`, after untimed warm-ups, with `gc.collect()`
    before each repetition (outside the timed region). Runs in one event loop."""

    async def run() -> list[float]:
        for _ in range(warmups):
            await fn()
        times = []
        for _ in range(repetitions):
            gc.collect()
            started = time.perf_counter()
            await fn()
            times.append(time.perf_counter() - started)
        return times

    return asyncio.run(run())


def time_sync(fn: Callable[[], Any], *, warmups: int, repetitions: int) -> list[float]:
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repetitions):
        gc.collect()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def fail(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(1)
