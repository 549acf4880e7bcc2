"""MCP — W2's tool loop with the tools served by an MCP server.

One run of a one-step recipe: connect to the server (start it, for stdio), list its tools,
one step whose first reply asks for k of W2's tools (``get_weather``, ``get_time``, ``add``,
repeated), run one after the other (`sequential_tool_calls`), and whose second reply is
"done", then close. The same with the three tools as Python functions is the baseline.
`us_per_tool_call` = (T(k=31) - T(k=1)) / 30: both runs make two model calls, so the
difference is thirty tool calls, each a round trip to the server. `ms_per_run_k1` is mostly
the cost of connecting and closing (for stdio: starting and stopping a Python process).

Variants: ``python tools`` (no MCP), ``in-process MCPServer`` (the SDK's direct dispatch, no
transport), ``stdio child`` (a real process, JSON-RPC over pipes).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from _common import emit, mark_imported, summary, time_async

from minions import AgentExecutor, AgentRecipe, DefaultStep, ExecutionConfig, Prompt, tool
from minions.testing import FunctionModel, Reply
from minions.tools import MCPStdioServer

sys.path.insert(0, str(Path(__file__).parent))
from _mcp_server import server as in_process

mark_imported()

CALLS = [("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "UTC"}), ("add", {"a": 1, "b": 2})]


@tool
def get_weather(city: str) -> dict[str, Any]:
    """Weather in a city."""
    return {"city": city, "temp_c": 21}


@tool
def get_time(tz: str) -> dict[str, Any]:
    """Time in a time zone."""
    return {"tz": tz, "time": "12:00"}


@tool
def add(a: int, b: int) -> dict[str, Any]:
    """Add two integers."""
    return {"sum": a + b}


def model(k: int, prefix: str) -> FunctionModel:
    calls = [(prefix + name, args) for name, args in (CALLS * 11)[:k]]

    def reply(prompt: Prompt) -> Reply:
        if prompt.messages[-1].role == "tool":
            return "done"
        return calls

    return FunctionModel(reply)


def measure(variant: str, servers: dict[str, Any], reps: int) -> None:
    prefix = "b_" if servers else ""
    tools = ["b.*"] if servers else ["get_weather", "get_time", "add"]
    recipe = AgentRecipe(
        id="mcp",
        steps=[DefaultStep("use", "Use the tools.", tools=tools)],
        mcp_servers=servers,
    )
    medians: dict[int, float] = {}
    metrics: dict[str, dict[str, Any]] = {}
    for k in (1, 31):
        executor = AgentExecutor(
            model=model(k, prefix),
            tools=[] if servers else [get_weather, get_time, add],
            config=ExecutionConfig(sequential_tool_calls=True),
        )

        async def once(executor: AgentExecutor = executor) -> None:
            result = await executor.execute(recipe)
            if not result.ok:
                raise SystemExit(f"{variant}: {result.error}")

        times = time_async(once, warmups=1 if reps < 10 else 2, repetitions=reps)
        metrics[f"ms_per_run_k{k}"] = summary([t * 1000 for t in times], "ms")
        medians[k] = metrics[f"ms_per_run_k{k}"]["median"]
    metrics["us_per_tool_call"] = {
        "median": round((medians[31] - medians[1]) * 1000 / 30, 1),
        "unit": "us",
        "n": reps,
    }
    emit("MCP", variant, primary="us_per_tool_call", metrics=metrics, headline=bool(servers))


def main() -> None:
    measure("python tools", {}, 20)
    measure("in-process MCPServer", {"b": in_process}, 20)
    stdio = MCPStdioServer(
        command=sys.executable, args=[str(Path(__file__).parent / "_mcp_server.py")]
    )
    measure("stdio child", {"b": stdio}, 5)


if __name__ == "__main__":
    main()
