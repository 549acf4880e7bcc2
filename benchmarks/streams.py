"""STREAMS — token deltas across processes: a worker's `DeltaPublisher` (the code a
`minions worker` runs) in one process, a follower (`RunStore.follow`, what an API process's
SSE stream and `minions runs events --follow` read) in another, on SQLite (FIFOs beside the
file) and Postgres (NOTIFY).

- `paced` (1,000 deltas a second of 4 characters, 10 s: ten runs streaming 100 tokens a
  second): `latency_ms_p50` / `p99`, from a delta's emission in the publisher to its
  arrival in the follower's loop, for the first delta of each batch (the one that waited
  longest for its batch: an upper bound for the others); `publisher_queries_per_s`, the
  statements the publisher sends to the store (Postgres: one NOTIFY statement per batch;
  SQLite: none, FIFO writes); on Postgres `server_xacts_per_s`, every transaction the server
  counted meanwhile (the follower's own once-a-second look included).
- `flood` (as many deltas as one publisher thread takes, 5 s): `deltas_per_s` received by the
  follower (characters / 4: batches arrive merged), and `received_ratio`, what reached the
  follower of what was emitted (deltas are dropped, not queued without bound, when the
  transport cannot keep up).
- `alone` (the `paced` stream, 5 s, with nobody following): `unfollowed_queries_per_s`, the
  statements the publisher sends then (0: deltas of a run nobody follows are not sent), and
  on Postgres `unfollowed_server_xacts_per_s`.

On Postgres the publisher's process listens for the followers' notes as a worker does (the
same `Listener`), so it learns who follows the way a worker learns it.

    python benchmarks/streams.py [--only sqlite|postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from _common import emit, mark_imported, server_xacts, summary

mark_imported()

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' Postgres cluster
TEXT = "tok "


def publish(url: str, run_id: str, rate: float, seconds: float) -> None:
    """The publisher's process: deltas at `rate` a second (0: as fast as it can)."""
    from minions.events import TokenDelta
    from minions.runs._streams import DeltaPublisher
    from minions.runs._wake import Listener

    publisher = DeltaPublisher(url)
    listener = Listener(
        url, lambda _: None, heard=publisher.listening, greeting=publisher.greeting
    )  # as a worker's: who follows
    listener.start()
    publisher.start()
    emitted = 0
    begun = time.monotonic()
    while (now := time.monotonic()) - begun < seconds:
        if rate and emitted >= (now - begun) * rate:
            time.sleep(0.001)
            continue
        publisher.publish(TokenDelta(run_id=run_id, seq=0, timestamp=time.time(), text=TEXT))
        emitted += 1
    publisher.stop()
    listener.stop()
    said = {"emitted": emitted, "batches": publisher.batches, "dropped": publisher.dropped}
    print(json.dumps({**said, "seconds": time.monotonic() - begun}), flush=True)


async def follow(url: str, run_id: str, rate: float, seconds: float) -> dict[str, float]:
    from minions.runs import RunStore

    latencies: list[float] = []
    chars = 0
    store = RunStore(url)
    follower = store.follow(run_id)

    async def read() -> None:
        nonlocal chars
        async for event in follower:
            if event.kind == "token_delta":
                latencies.append((time.time() - event.timestamp) * 1000)
                chars += len(event.text)  # type: ignore[attr-defined]

    reading = asyncio.create_task(read())
    await asyncio.sleep(1.0)  # the follower listens
    said, xacts = await publishing(url, run_id, rate, seconds, after=2.0)
    reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    store.close()
    latencies.sort()
    return {
        "emitted": said["emitted"],
        "received": chars / len(TEXT),
        "batches": said["batches"],
        "dropped": said["dropped"],
        "seconds": said["seconds"],
        "xacts": xacts,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
        if latencies
        else float("nan"),
    }


async def publishing(
    url: str, run_id: str, rate: float, seconds: float, *, after: float = 0.0
) -> tuple[dict[str, float], float]:
    """The publisher's process, to its end (and `after` seconds more: its last batch on its
    way, and read): what it said, and the transactions the server counted meanwhile."""
    postgres = url.startswith("postgresql")
    before = server_xacts(url) if postgres else 0
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "publish", url, run_id, str(rate), str(seconds),
        stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    await asyncio.sleep(after)
    xacts = (server_xacts(url) - before) if postgres else 0
    said: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return said, xacts


async def alone(url: str, run_id: str, rate: float, seconds: float) -> dict[str, float]:
    """The publisher with nobody following: what it sends then."""
    said, xacts = await publishing(url, run_id, rate, seconds)
    return {"batches": said["batches"], "seconds": said["seconds"], "xacts": xacts}


def measure(variant: str, url: str) -> None:
    from minions.runs import RunStore

    with tempfile.TemporaryDirectory(prefix="minions-streams-") as name:
        recipe = Path(name) / "recipe.yaml"
        recipe.write_text("id: s\nsteps:\n  - {id: one, goal: Say hi.}\n")

        async def queued() -> str:
            async with RunStore(url, create=True) as store:
                run_id, _ = await store.submit(recipe)  # no worker: it stays queued
                return run_id

        run_id = asyncio.run(queued())
        paced = asyncio.run(follow(url, run_id, 1000, 10))
        flood = asyncio.run(follow(url, run_id, 0, 5))
        unfollowed = asyncio.run(alone(url, run_id, 1000, 5))
    window = paced["seconds"]
    metrics = {
        "latency_ms_p50": summary([paced["p50"]], "ms"),
        "latency_ms_p99": summary([paced["p99"]], "ms"),
        "publisher_queries_per_s": summary(
            [paced["batches"] / window if variant == "postgres" else 0.0], "1/s"
        ),
        "deltas_per_s": summary([flood["received"] / flood["seconds"]], "1/s", digits=0),
        "received_ratio": summary([flood["received"] / flood["emitted"]], "x"),
        "unfollowed_queries_per_s": summary(
            [unfollowed["batches"] / unfollowed["seconds"] if variant == "postgres" else 0.0],
            "1/s",
        ),
    }
    if variant == "postgres":
        metrics["server_xacts_per_s"] = summary([paced["xacts"] / window], "1/s")
        metrics["unfollowed_server_xacts_per_s"] = summary(
            [unfollowed["xacts"] / unfollowed["seconds"]], "1/s"
        )
    emit(
        "STREAMS",
        variant,
        primary="deltas_per_s",
        metrics=metrics,
        extra={
            "paced_received_ratio": round(paced["received"] / paced["emitted"], 4),
            "paced_batches_per_s": round(paced["batches"] / window, 1),
            "flood_emitted_per_s": round(flood["emitted"] / flood["seconds"]),
            "flood_batches_per_s": round(flood["batches"] / flood["seconds"], 1),
            "flood_dropped_by_publisher": flood["dropped"],
        },
    )


def main() -> None:
    if sys.argv[1:2] == ["publish"]:
        url, run_id, rate, seconds = sys.argv[2:6]
        publish(url, run_id, float(rate), float(seconds))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    args = parser.parse_args()
    with ExitStack() as stack:
        if args.only in (None, "sqlite"):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            measure("sqlite", f"sqlite:///{folder / 'minions.db'}")
        if args.only in (None, "postgres"):
            from postgres import cluster

            measure("postgres", stack.enter_context(cluster()))


if __name__ == "__main__":
    os.environ.setdefault("MINIONS_MODEL", "test")
    main()
