"""One step with tools and structured output, offline.

Run it with ``make demo`` or ``python examples/step_with_tools.py``. Offline it uses a
`ScriptedModel`; set ``MINIONS_MODEL`` (for example ``ollama:llama3.2:3b``) to use a real model.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel, Field

from minions import DefaultStep, tool
from minions.events import Event, ModelCallCompleted, ToolCallCompleted
from minions.testing import ScriptedModel

PRICES = {"apple": 0.5, "bread": 2.25, "cheese": 4.0}


@tool
def price(item: str) -> float:
    """Look up the unit price of a grocery item.

    Args:
        item: the item's name, e.g. "apple".
    """
    if item not in PRICES:
        raise ValueError(f"no price for {item!r}; known items: {', '.join(PRICES)}")
    return PRICES[item]


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


class Bill(BaseModel):
    total: float = Field(description="What the whole basket costs.")
    most_expensive: str = Field(description="The item that costs the most in the basket.")


def offline_model() -> ScriptedModel:
    return ScriptedModel(
        [
            [("price", {"item": "apple"}), ("price", {"item": "cheese"})],
            [("multiply", {"a": 0.5, "b": 6}), ("multiply", {"a": 4.0, "b": 2})],
            '```json\n{"total": 11.0, "most_expensive": "cheese"}\n```',
        ]
    )


def show(event: Event) -> None:
    """Print tool results and token counts as they happen."""
    if isinstance(event, ToolCallCompleted):
        print(f"  tool {event.name} ({event.call_id}) -> {event.content}")
    elif isinstance(event, ModelCallCompleted):
        usage = event.usage
        print(f"  model call {event.turn}: {usage.prompt_tokens}+{usage.completion_tokens} tokens")


async def main() -> None:
    model = os.environ.get("MINIONS_MODEL") or offline_model()
    step = DefaultStep(
        "bill",
        goal="The basket holds 6 apples and 2 cheeses. What is the total, and which item costs "
        "the most in the basket?",
        system="You are a careful cashier. Use the tools for every price and product.",
        tools=[price, multiply],
        output=Bill,
    )
    print(f"step {step.id!r}")
    async with step.stream(model=model) as stream:  # the step's events as they happen
        async for event in stream:
            show(event)
    execution = stream.execution  # a StepExecution[Bill]
    print(f"status: {execution.status.value}")
    if execution.ok:
        bill = execution.result()
        print(f"output: {bill!r} (most expensive: {bill.most_expensive})")
    else:
        print(f"error: {execution.error}")
    print(
        f"{execution.turns} model calls, {len(execution.tool_calls)} tool calls, "
        f"{execution.usage.total_tokens} tokens"
    )
    raise SystemExit(0 if execution.ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
