"""`FallbackModel` against a real llama.cpp server: a dead endpoint first (a closed port), then
the real one (`make test-live`)."""

from __future__ import annotations

import socket

import pytest
from pydantic import BaseModel, Field

from minions import (
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    ExecutionConfig,
    OutputInstructions,
    StepStatus,
)
from minions.models import FallbackModel, OpenAIChatModel
from minions.recipes import parse_recipe

from .conftest import LiveServer

pytestmark = pytest.mark.live

FAST = ExecutionConfig(max_model_retries=1, retry_initial_delay=0.05, retry_max_delay=0.1)


class City(BaseModel):
    name: str = Field(description="The city's name.")
    country: str = Field(description="The country it is in.")


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def test_a_dead_endpoint_then_the_real_server(smollm2: LiveServer) -> None:
    dead = dead_url()
    settings = {"temperature": 0, "seed": 1, "max_tokens": 128}
    down = OpenAIChatModel("smollm2", base_url=dead, provider="down", timeout=10)
    real = OpenAIChatModel(smollm2.model, base_url=smollm2.base_url, timeout=180, settings=settings)
    step = DefaultStep("city", "Name a city in France.", output=OutputInstructions(City))
    recipe = AgentRecipe(id="live", steps=[step])
    result = AgentExecutor(model=FallbackModel(down, real), config=FAST).execute_sync(recipe)
    execution = result.step("city")
    assert execution.status is StepStatus.COMPLETED, execution.error
    assert isinstance(execution.output, City)
    calls = execution.model_calls
    assert [(c.model, c.endpoint, c.ok) for c in calls[:2]] == [
        ("down:smollm2", dead, False),
        ("down:smollm2", dead, False),
    ]
    assert all(c.endpoint == smollm2.base_url.rstrip("/") for c in calls[2:])
    assert calls[-1].ok
    assert calls[-1].output_mode == "json_schema"
    # What the real server taught the ladder is its model's, not the dead one's.
    assert real.output_mode == "json_schema"
    assert down.output_mode is None
    assert down.rejected == frozenset()


def test_a_recipe_s_model_list_falls_back_to_the_real_server(smollm2: LiveServer) -> None:
    recipe = parse_recipe(
        f"""\
id: live_list
config: {{max_model_retries: 1, retry_initial_delay: 0.05}}
model:
  - openai-compatible:smollm2@{dead_url()}
  - openai-compatible:{smollm2.model}@{smollm2.base_url}
steps:
  - id: hello
    goal: Say hello in one word.
"""
    )
    result = AgentExecutor().execute_sync(recipe)
    hello = result.step("hello")
    assert hello.status is StepStatus.COMPLETED, hello.error
    assert isinstance(hello.output, str)
    assert hello.output.strip()
    assert [c.ok for c in hello.model_calls] == [False, False, True]
