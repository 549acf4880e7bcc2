"""W6b's peer: LangGraph on Postgres, measured on this machine beside minions' own W6b.

200 runs of a 5-step chain, at most 8 at a time (LangGraph has no queue: `asyncio.gather`
over the runs behind a semaphore, in one process), each step one call of a fake chat model
answering "ok" at once (W1's shape: step i's prompt is "step i: {the step before's output}"),
each run a fresh thread checkpointed by `AsyncPostgresSaver` with `durability="sync"` (a
step's checkpoint is written before the next step starts, as minions' are) over a pool of 8
connections. `runs_per_s` = 200 / wall time; 1 warm-up, 5 timed. Postgres is a throwaway
cluster on 127.0.0.1 (the tests' helper), or `--url` one.

Not part of minions' suite: it needs LangGraph, which minions does not depend on.

    python -m venv /tmp/lg && /tmp/lg/bin/pip install langgraph langgraph-checkpoint-postgres \
        "psycopg[binary,pool]"
    /tmp/lg/bin/python benchmarks/peers/w6b_langgraph.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # _common (no minions needed)
sys.path.insert(0, str(HERE.parents[1] / "tests"))  # the throwaway Postgres cluster

from _common import emit, mark_imported, summary  # noqa: E402

mark_imported()

RUNS, CONCURRENCY, STEPS = 200, 8, 5


class State(TypedDict, total=False):
    outputs: dict[str, str]


class Ok(GenericFakeChatModel):
    """Answers "ok" at once, forever (GenericFakeChatModel takes its answers from an iterator)."""


def model() -> Ok:
    def answers() -> Any:
        while True:
            yield AIMessage(content="ok")

    return Ok(messages=answers())


def graph(checkpointer: AsyncPostgresSaver) -> Any:
    chat = model()
    builder = StateGraph(State)

    def node(i: int) -> Any:
        async def step(state: State) -> State:
            before = state.get("outputs", {})
            goal = "start" if i == 0 else f"step {i}: {before[f'step_{i - 1}']}"
            reply = await chat.ainvoke([HumanMessage(content=goal)])
            return {"outputs": {**before, f"step_{i}": str(reply.content)}}

        return step

    for i in range(STEPS):
        builder.add_node(f"step_{i}", node(i))
        builder.add_edge(START if i == 0 else f"step_{i - 1}", f"step_{i}")
    builder.add_edge(f"step_{STEPS - 1}", END)
    return builder.compile(checkpointer=checkpointer)


async def measure(url: str) -> list[float]:
    async with AsyncConnectionPool(
        url,
        min_size=CONCURRENCY,
        max_size=CONCURRENCY,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    ) as pool:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        app = graph(saver)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def run() -> None:
            async with gate:
                config = {"configurable": {"thread_id": uuid.uuid4().hex}}
                out = await app.ainvoke({"outputs": {}}, config, durability="sync")
                if len(out["outputs"]) != STEPS:
                    raise SystemExit(f"a run ended with {out}")

        async def batch() -> float:
            started = time.perf_counter()
            await asyncio.gather(*(run() for _ in range(RUNS)))
            return time.perf_counter() - started

        await batch()  # warm-up
        return [RUNS / await batch() for _ in range(5)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a Postgres URL (default: a throwaway cluster)")
    args = parser.parse_args()
    if args.url:
        rates = asyncio.run(measure(args.url))
    else:
        from postgres import cluster

        with cluster() as url:
            rates = asyncio.run(measure(url))
    emit(
        "W6b",
        "postgres",
        primary="runs_per_s",
        metrics={"runs_per_s": summary(rates, "runs/s", digits=1)},
        extra={"runs": RUNS, "steps": STEPS, "concurrency": CONCURRENCY},
        anchor=("langgraph", version("langgraph")),
    )


if __name__ == "__main__":
    main()
