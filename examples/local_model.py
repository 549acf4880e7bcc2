"""A step with a tool and structured output on a local model, streaming its tokens.

Offline (the default), the model is served by `FakeOpenAIServer`: a real OpenAI-compatible
HTTP server on 127.0.0.1 answering from a function, so the whole provider path runs (the
`openai` client, instructor, the structured-output ladder, retries) with no model installed::

    python examples/local_model.py

Against a real endpoint, name the model in ``MINIONS_MODEL``::

    ollama pull llama3.2:3b
    MINIONS_MODEL=ollama:llama3.2:3b python examples/local_model.py
    MINIONS_MODEL=vllm:Qwen/Qwen2.5-3B-Instruct python examples/local_model.py
    MINIONS_MODEL=openai:gpt-4o-mini OPENAI_API_KEY=sk-... python examples/local_model.py

See docs/local-models.md for the model strings and settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, Field

from minions import (
    AgentContext,
    DefaultStep,
    ExecutionConfig,
    MessageBundle,
    Model,
    OutputInstructions,
    StepExecutor,
    StepStatus,
    tool,
)
from minions.events import (
    ModelCallCompleted,
    ModelCallFailed,
    RetryScheduled,
    TokenDelta,
    ToolCallCompleted,
)
from minions.models import infer_model
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

FORECASTS = {"oslo": ("rain", 9), "lisbon": ("sun", 24), "paris": ("clouds", 16)}


@tool
def get_forecast(city: str) -> dict[str, Any]:
    """Tomorrow's weather forecast for a city.

    Args:
        city: the city's name, e.g. "Oslo".
    """
    sky, celsius = FORECASTS.get(city.strip().lower(), ("unknown", 0))
    return {"city": city, "sky": sky, "celsius": celsius}


class Advice(BaseModel):
    """What to pack for tomorrow."""

    city: str = Field(description="The city the advice is for.")
    umbrella: bool = Field(description="Whether to take an umbrella.")
    advice: str = Field(description="One short sentence of advice.")


def fake_reply(request: FakeRequest) -> Any:
    """How the offline model answers: ask for the forecast, then give the advice.

    `FakeReply.structured` takes whatever shape the request asks for (here a call to the
    `Advice` output tool offered next to `get_forecast`)."""
    if request.last_message.get("role") != "tool":
        return FakeReply(
            content="Let me look up the forecast for Oslo.",
            tool_calls=(("get_forecast", {"city": "Oslo"}),),
        )
    return FakeReply.structured(
        Advice(city="Oslo", umbrella=True, advice="Rain and 9 °C: take an umbrella and a coat.")
    )


class Console:
    """An event listener printing tokens as they stream, and tool results, retries and model
    calls as they happen."""

    def __init__(self) -> None:
        self.streaming = False

    def end_line(self) -> None:
        """End a streamed line still open (before printing a result or a failure)."""
        if self.streaming:
            print()
            self.streaming = False

    def __call__(self, event: object) -> None:
        if isinstance(event, TokenDelta):
            print(event.text, end="", flush=True)
            self.streaming = True
            return
        if self.streaming and isinstance(
            event, ToolCallCompleted | RetryScheduled | ModelCallCompleted | ModelCallFailed
        ):
            print()  # end the streamed line before anything else
            self.streaming = False
        if isinstance(event, ToolCallCompleted):
            print(f"  tool {event.name} -> {event.content}")
        elif isinstance(event, RetryScheduled):
            print(f"  retry ({event.target}) in {event.delay:.2f}s: {event.reason}")
        elif isinstance(event, ModelCallFailed):
            print(f"  model call {event.turn} (attempt {event.attempt}) failed: {event.error}")
        elif isinstance(event, ModelCallCompleted):
            mode = f", output mode {event.output_mode}" if event.output_mode else ""
            tokens = event.usage.prompt_tokens + event.usage.completion_tokens
            print(f"  model call {event.turn}: {tokens} tokens{mode}")


@contextlib.asynccontextmanager
async def chosen_model() -> AsyncIterator[Model]:
    """The model from `MINIONS_MODEL`, else one served by a local `FakeOpenAIServer`."""
    spec = os.environ.get("MINIONS_MODEL")
    if spec:
        # Small local models can be slow to load: a generous timeout, and streamed tokens.
        yield infer_model(spec, stream=True, timeout=120.0)
        return
    async with FakeOpenAIServer(fake_reply) as server:
        print(f"(offline: FakeOpenAIServer at {server.url}; set MINIONS_MODEL for a real model)")
        yield server.model(stream=True)


async def main() -> int:
    step = DefaultStep(
        "pack",
        MessageBundle(
            system="You help travellers pack. Use the tools; do not guess the weather.",
            goal="I am in Oslo tomorrow. Should I take an umbrella?",
        ),
        tools={"get_forecast"},
        output=OutputInstructions(Advice),
    )
    console = Console()
    async with chosen_model() as model:
        context = AgentContext(
            model=model,
            tools=[get_forecast],
            config=ExecutionConfig(model_call_timeout=180.0, max_model_retries=2),
            listeners=[console],
        )
        print(f"step {step.id!r} on {model!r}")
        execution = await StepExecutor(step, context).execute()
    console.end_line()

    if execution.status is not StepStatus.COMPLETED:
        print(f"the step failed: {execution.error}", file=sys.stderr)
        return 1
    advice = execution.output
    modes = [call.output_mode for call in execution.model_calls if call.output_mode]
    print(f"output ({modes[-1] if modes else 'text'}): {advice!r}")
    print(f"{execution.turns} model calls, {execution.usage.total_tokens} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
