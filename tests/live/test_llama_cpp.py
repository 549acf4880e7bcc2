"""The provider against real llama.cpp servers and real small models (`make test-live`).

These assert mechanics (statuses, output modes, roles, usage), not the tiny models' wisdom.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from minions import (
    AgentContext,
    CompletionDecision,
    DefaultStep,
    ExecutionConfig,
    MessageBundle,
    OutputInstructions,
    StepCompletionChain,
    StepCompletionLink,
    StepExecution,
    StepExecutor,
    StepStatus,
    tool,
)
from minions import events as ev
from minions.models import OpenAIChatModel

from .conftest import LiveServer

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]


class City(BaseModel):
    name: str = Field(description="The city's name.")
    country: str = Field(description="The country it is in.")


class Verdict(BaseModel):
    ok: bool


def model_of(server: LiveServer, *, max_tokens: int = 256, stream: bool = False) -> OpenAIChatModel:
    # Greedy decoding and a fixed seed: the same answers run after run.
    settings = {"temperature": 0, "seed": 1, "max_tokens": max_tokens}
    return OpenAIChatModel(
        server.model, base_url=server.base_url, timeout=180, stream=stream, settings=settings
    )


async def test_structured_output_without_tools_on_the_json_schema_rung(
    smollm2: LiveServer,
) -> None:
    events: list[ev.Event] = []
    model = model_of(smollm2, stream=True)
    context = AgentContext(model=model, listeners=[events.append])
    step = DefaultStep(
        "city",
        MessageBundle(system="You answer with facts.", goal="Which city is the Eiffel Tower in?"),
        output=OutputInstructions(City),
    )
    execution = await StepExecutor(step, context).execute()

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert isinstance(execution.output, City)
    assert [call.output_mode for call in execution.model_calls] == ["json_schema"]
    # Streaming with usage: the text came as deltas, and the server reported the tokens.
    assert [e for e in events if isinstance(e, ev.TokenDelta)]
    assert execution.usage.unknown_calls == 0
    assert execution.usage.prompt_tokens > 0
    assert execution.usage.completion_tokens > 0


class OnceMore(StepCompletionLink):
    """Re-asks the first answer once, whatever it is: a retry on demand."""

    name = "once_more"

    def check(self, execution: StepExecution, context: AgentContext) -> CompletionDecision | None:
        if not execution.decisions:
            return CompletionDecision.reask("Check your answer once more and answer again.")
        return None


async def test_a_retry_passes_a_chat_template_that_requires_alternating_roles(
    gemma_strict: LiveServer,
) -> None:
    # Gemma's official template raises on two user messages in a row: the re-ask's note must
    # join the goal's message.
    chain = StepCompletionChain.default().add_first(OnceMore())
    step = DefaultStep(
        "verdict", "Is water wet?", output=OutputInstructions(Verdict), completion=chain
    )
    execution = await StepExecutor(step, AgentContext(model=model_of(gemma_strict))).execute()

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert len(execution.model_calls) == 2
    assert [call.output_mode for call in execution.model_calls] == ["json_schema"] * 2
    assert execution.decisions[0].kind == "reask"
    assert execution.usage.unknown_calls == 0


@tool
def get_forecast(city: str) -> dict[str, str]:
    """Tomorrow's forecast for a city."""
    return {"city": city, "sky": "rain"}


class Advice(BaseModel):
    umbrella: bool = Field(description="Whether to take an umbrella.")


async def test_tools_the_server_ignores_move_the_ladder_down(gemma_strict: LiveServer) -> None:
    # Gemma's template has no tool support: llama.cpp drops `tools` without an error. The
    # forced output tool goes unanswered twice, the tool rung is demoted, and since the endpoint
    # cannot call tools at all, native JSON (a grammar on llama.cpp) gives a validated output.
    events: list[ev.Event] = []
    model = model_of(gemma_strict, max_tokens=64)
    context = AgentContext(
        model=model,
        tools=[get_forecast],
        config=ExecutionConfig(max_output_retries=4),
        listeners=[events.append],
    )
    step = DefaultStep(
        "pack",
        "I am in Oslo tomorrow. Should I take an umbrella?",
        tools={"get_forecast"},
        output=OutputInstructions(Advice),
    )
    execution = await StepExecutor(step, context).execute()

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert isinstance(execution.output, Advice)
    assert [e.mode for e in events if isinstance(e, ev.OutputModeDemoted)] == ["tool"]
    assert model.rejected == {"tool", "tools"}
    modes = [call.output_mode for call in execution.model_calls]
    assert modes == ["tool", "tool", "json_schema"]
    assert execution.usage.unknown_calls == 0


@pytest.mark.parametrize("example", ["activity_monitor", "research_assistant"])
def test_the_examples_run_end_to_end_with_honest_usage(
    smollm2: LiveServer, example: str, tmp_path: Path
) -> None:
    recipe = ROOT / "examples" / example / "recipe.yaml"
    model = f"openai-compatible:{smollm2.model}@{smollm2.base_url}"
    done = subprocess.run(
        [sys.executable, "-m", "minions.cli", "run", str(recipe), "--model", model, "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "OPENAI_API_KEY": "local"},
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # completed, or failed cleanly
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    assert result["status"] in ("completed", "failed")
    assert result["usage"]["unknown_calls"] == 0
    assert result["usage"]["calls"] >= 1
    assert all(step["status"] in ("completed", "failed", "skipped") for step in result["steps"])
