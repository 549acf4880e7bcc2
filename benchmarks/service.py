"""SERVICE — the run service over HTTP (`minions serve`), on SQLite and on Postgres.

- `submit_to_first_event_ms`: POST /runs, then the run's event stream opened at once, until
  its first event arrives (a five-step chain of instant tool steps; the in-process worker).
  2 warm-ups, 20 timed, one after the other.
- `delivery_ms` p50 / p99: 100 SSE clients at once on loopback (10 runs of a five-step chain
  whose steps take 0.2 s each, 10 clients per run); for every event that was stored after the
  client connected, the time from its commit (stamped by `_stamped_serve.py` in the server)
  to its arrival at the client. Also from the event's creation (which includes the worker's
  batching of events, one commit per 50 ms at most while a step runs).
- `runs_per_s`: N five-step runs of instant tool steps submitted through POST /runs (16 at a
  time), served by `minions serve --no-worker` and two `minions worker` (4 runs at a time
  each, W6b's 8); wall time from the first submission to the last run completed. The same
  with the runs submitted straight to the store (`RunStore.submit`, W6b's way) as the
  baseline: `api_overhead` = 1 - api / direct.

    python benchmarks/service.py [--runs N]      # N defaults to 1,000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx2
from _common import emit, mark_imported, summary

mark_imported()

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' Postgres cluster and processes

from runs_helpers import stop_process  # noqa: E402

TOKEN = "bench-token"
METRICS = os.environ.get("MINIONS_BENCH_METRICS") == "1"
"""Serve with --metrics and workers with --metrics-port, /metrics scraped once a second."""
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
TOOLS = '''\
import asyncio

from minions import tool


@tool(run_in_thread=False)
async def mark(run: str, step: str, seconds: float = 0.0) -> str:
    """Say (run, step), after `seconds`."""
    if seconds:
        await asyncio.sleep(seconds)
    return f"{run}:{step}"
'''


def chain(recipe_id: str, seconds: float) -> str:
    lines = [f"id: {recipe_id}", "tools: [tools]", "inputs: {tag: {type: string}}", "steps:"]
    previous = None
    for step in ("one", "two", "three", "four", "five"):
        depends = f", depends_on: [{previous}]" if previous else ""
        lines.append(
            f"  - {{id: {step}{depends}, tool: mark, "
            f'params: {{run: "{{{{ inputs.tag }}}}", step: {step}, seconds: {seconds}}}}}'
        )
        previous = step
    return "\n".join(lines) + "\n"


def recipes(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    (folder / "fast.yaml").write_text(chain("fast", 0.0))
    (folder / "slow.yaml").write_text(chain("slow", 0.2))
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serve(folder: Path, url: str, *args: str) -> Iterator[tuple[str, Path]]:
    """`minions serve` (stamping its commits); yields its URL and the stamps file."""
    port = free_port()
    stamps = folder / f"stamps-{port}.txt"
    env = {**os.environ, "MINIONS_API_TOKEN": TOKEN, "MINIONS_STAMPS": str(stamps)}
    log = (folder / f"serve-{port}.log").open("w")
    command = [sys.executable, str(HERE / "_stamped_serve.py"), "serve", "--port", str(port),
               "--database-url", url, "--recipes", str(folder / "recipes"), *args,
               *(["--metrics"] if METRICS else [])]  # fmt: skip
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx2.get(base + "/health").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {(folder / log.name).read_text()}")
            time.sleep(0.05)
        stop = threading.Event()
        if METRICS:  # scraped once a second, as Prometheus would

            def scrape() -> None:
                while not stop.wait(1.0):
                    httpx2.get(base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})

            threading.Thread(target=scrape, daemon=True).start()
        yield base, stamps
        stop.set()
    finally:
        stop_process(process)
        log.close()


@contextmanager
def worker(folder: Path, url: str, name: str, stamps: Path | None = None) -> Iterator[None]:
    """`minions worker` (stamping its commits into `stamps` when given)."""
    log = (folder / f"worker-{name}.log").open("w")
    program = [str(HERE / "_stamped_serve.py")] if stamps is not None else ["-m", "minions"]
    command = [sys.executable, *program, "worker", "--database-url", url,
               "--executor-id", name, "--concurrency", "4",
               *(["--metrics-port", "0"] if METRICS else [])]  # fmt: skip
    env = {**os.environ, "MINIONS_STAMPS": str(stamps)} if stamps is not None else None
    process = subprocess.Popen(command, cwd=folder, stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 60
        while "running queued runs" not in (folder / f"worker-{name}.log").read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((folder / f"worker-{name}.log").read_text())
            time.sleep(0.05)
        yield
    finally:
        stop_process(process)
        log.close()


async def sse(client: httpx2.AsyncClient, run_id: str, on_open: Any = None) -> Any:
    """Yields (arrival time, event) for each stored event of the run's stream."""
    async with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
        if on_open is not None:
            on_open()
        data = None
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
            elif line == "" and data is not None:
                event = json.loads(data)
                data = None
                if event["kind"] != "token_delta":
                    yield time.time(), event


async def submit(client: httpx2.AsyncClient, recipe: str, tag: str) -> str:
    response = await client.post("/runs", json={"recipe": recipe, "inputs": {"tag": tag}})
    response.raise_for_status()
    run_id: str = response.json()["run_id"]
    return run_id


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def first_event(base: str) -> list[float]:
    times = []
    async with httpx2.AsyncClient(base_url=base, headers=HEADERS, timeout=60) as client:
        for i in range(22):
            started = time.perf_counter()
            run_id = await submit(client, "fast", f"f{i}")
            first = None
            async for _, _event in sse(client, run_id):
                if first is None:
                    first = time.perf_counter() - started
            if i >= 2:
                assert first is not None
                times.append(first * 1000)
    return times


async def delivery(base: str, stamps: Path, clients: int = 100, runs: int = 10) -> dict[str, Any]:
    # The clients' own heap (httpx, this script) is not what is measured: a full collection
    # walking it would stall every client's loop at once.
    gc.collect()
    gc.freeze()
    limits = httpx2.Limits(max_connections=clients + 20, max_keepalive_connections=clients + 20)
    async with httpx2.AsyncClient(
        base_url=base, headers=HEADERS, timeout=120, limits=limits
    ) as client:
        run_ids = [await submit(client, "slow", f"d{i}") for i in range(runs)]
        received: list[tuple[str, int, float, float, float]] = []

        async def follow(run_id: str) -> None:
            opened = [0.0]

            def on_open() -> None:
                opened[0] = time.time()

            async for arrived, event in sse(client, run_id, on_open):
                received.append((run_id, event["seq"], arrived, event["timestamp"], opened[0]))

        await asyncio.gather(*(follow(run_ids[i % runs]) for i in range(clients)))
    stored = {}
    for line in await asyncio.to_thread(lambda: stamps.read_text().splitlines()):
        run_id, seq, at = line.split()
        stored[(run_id, int(seq))] = float(at)
    from_commit = []
    from_creation = []
    for run_id, seq, arrived, created, opened in received:
        committed = stored.get((run_id, seq))
        if committed is None or committed < opened:
            continue  # replayed, not delivered live
        from_commit.append((arrived - committed) * 1000)
        from_creation.append((arrived - created) * 1000)
    return {
        "from_commit": from_commit,
        "from_creation": from_creation,
        "events": len(received),
    }


async def throughput(base: str | None, url: str, n: int, recipe: Path) -> float:
    """Runs per second, submitting through the API (`base`) or straight to the store."""
    gate = asyncio.Semaphore(16)
    started = time.perf_counter()
    if base is not None:
        async with httpx2.AsyncClient(base_url=base, headers=HEADERS, timeout=120) as client:

            async def one(i: int) -> None:
                async with gate:
                    await submit(client, "fast", f"t{i}")

            await asyncio.gather(*(one(i) for i in range(n)))
    else:
        from minions.runs import RunStore

        store = RunStore(url, create=True)

        async def direct(i: int) -> None:
            async with gate:
                await store.submit(recipe, {"tag": f"t{i}"})

        await asyncio.gather(*(direct(i) for i in range(n)))
        store.close()
    from minions.runs import RunStore

    store = RunStore(url)
    try:
        while True:
            done = len(await store.list_runs(status="completed", limit=n + 1))
            if done >= n:
                break
            failed = await store.list_runs(status="failed", limit=1)
            if failed:
                raise RuntimeError(f"a run failed: {failed[0].error}")
            await asyncio.sleep(0.1)
    finally:
        store.close()
    return n / (time.perf_counter() - started)


def database(kind: str, folder: Path, name: str, stack: ExitStack) -> str:
    if kind == "sqlite":
        return f"sqlite:///{folder / name / 'minions.db'}"
    from postgres import cluster, fresh_database

    if "postgres" not in _CLUSTER:
        _CLUSTER["postgres"] = stack.enter_context(cluster())
    return str(fresh_database(_CLUSTER["postgres"], name))


_CLUSTER: dict[str, str] = {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--only", choices=["sqlite", "postgres"], default=None)
    parser.add_argument("--skip", choices=["latency", "throughput"], default=None)
    options = parser.parse_args()
    kinds = [options.only] if options.only else ["sqlite", "postgres"]
    with ExitStack() as stack:
        for kind in kinds:
            folder = Path(tempfile.mkdtemp(prefix=f"minions-bench-service-{kind}-"))
            recipes(folder / "recipes")
            if options.skip != "latency":
                latency(kind, folder, stack)
                latency(kind, folder, stack, separate=True)
            if options.skip != "throughput":
                throughput_variants(kind, folder, stack, options.runs)


def latency(kind: str, folder: Path, stack: ExitStack, *, separate: bool = False) -> None:
    """With the worker in the API's process, or (`separate`) in a process of its own."""
    url = database(kind, folder, "latency_separate" if separate else "latency", stack)
    with ExitStack() as processes:
        base, stamps = processes.enter_context(
            serve(folder, url, *(["--no-worker"] if separate else []))
        )
        if separate:
            processes.enter_context(worker(folder, url, "latency-w1", stamps))
        first = asyncio.run(first_event(base))
        delivered = asyncio.run(delivery(base, stamps))
    commit = delivered["from_commit"]
    creation = delivered["from_creation"]
    emit(
        "SERVICE",
        f"latency-{kind}" + ("-separate-worker" if separate else ""),
        primary="delivery_p99_ms",
        metrics={
            "submit_to_first_event_ms": summary(first, "ms", digits=1),
            "delivery_p50_ms": {"value": round(percentile(commit, 50), 1), "unit": "ms"},
            "delivery_p99_ms": {"value": round(percentile(commit, 99), 1), "unit": "ms"},
            "from_creation_p50_ms": {
                "value": round(percentile(creation, 50), 1),
                "unit": "ms",
            },
            "from_creation_p99_ms": {
                "value": round(percentile(creation, 99), 1),
                "unit": "ms",
            },
        },
        extra={"clients": 100, "live_events": len(commit), "events": delivered["events"]},
    )


def throughput_variants(kind: str, folder: Path, stack: ExitStack, runs: int) -> None:
    rates = {}
    for how in ("api", "direct"):
        url = database(kind, folder, f"throughput_{how}", stack)
        with ExitStack() as processes:
            base, _ = processes.enter_context(serve(folder, url, "--no-worker"))
            processes.enter_context(worker(folder, url, f"{how}-w1"))
            processes.enter_context(worker(folder, url, f"{how}-w2"))
            rates[how] = asyncio.run(
                throughput(
                    base if how == "api" else None,
                    url,
                    runs,
                    folder / "recipes" / "fast.yaml",
                )
            )
    emit(
        "SERVICE",
        f"throughput-{kind}",
        primary="runs_per_s",
        metrics={
            "runs_per_s": {"value": round(rates["api"], 1), "unit": "runs/s"},
            "direct_runs_per_s": {"value": round(rates["direct"], 1), "unit": "runs/s"},
            "api_overhead": {
                "value": round(1 - rates["api"] / rates["direct"], 3),
                "unit": "fraction",
            },
        },
        extra={"runs": runs, "workers": 2, "concurrency_per_worker": 4},
    )


if __name__ == "__main__":
    main()
