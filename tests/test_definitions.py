"""Bad input is refused before any model call, with a message naming the step and problem."""

from __future__ import annotations

import asyncio

import pytest
from conftest import add

from minions import (
    AgentContext,
    ConfigError,
    DefaultStep,
    ExecutionConfig,
    MessageBundle,
    MinionsError,
    OutputInstructions,
    StepDefinitionError,
    StepExecution,
    StepExecutor,
    StepStatus,
    ToolStep,
    tool,
)
from minions.testing import ScriptedModel


def test_unknown_tool_is_named_with_the_known_ones() -> None:
    model = ScriptedModel(["never"])
    step = DefaultStep("sum", "Add.", tools={"add", "multiply"})
    with pytest.raises(StepDefinitionError) as raised:
        StepExecutor(step, AgentContext(model=model, tools=[add]))
    assert str(raised.value) == "step 'sum': unknown tool 'multiply'; known tools: add"
    assert isinstance(raised.value, MinionsError)
    assert model.requests == []


@pytest.mark.parametrize("goal", ["", "   ", MessageBundle(goal="", system="sys")])
def test_empty_goal(goal: object) -> None:
    with pytest.raises(StepDefinitionError, match="step 'x': goal is empty"):
        DefaultStep("x", goal)  # type: ignore[call-overload]


def test_all_problems_are_collected() -> None:
    with pytest.raises(StepDefinitionError) as raised:
        DefaultStep(
            "x",
            "",
            output=OutputInstructions({"type": 5}),
            completion_pattern="(unclosed",
        )
    assert len(raised.value.problems) == 3


def test_step_options_are_checked() -> None:
    step = DefaultStep("1bad id", "x", mode="parallel", memory="global", timeout=0, max_visits=0)  # type: ignore[call-overload]
    with pytest.raises(StepDefinitionError) as raised:
        StepExecutor(step, AgentContext(model=ScriptedModel([])))
    problems = raised.value.problems
    assert problems[0] == (
        "step '1bad id': id must be letters, digits, '_' or '-', not starting with a digit, "
        "and at most 64 characters long"
    )
    assert "mode must be one of ('async', 'sync', 'fire_and_forget'), not 'parallel'" in problems[1]
    assert "memory must be one of ('step', 'agent'), not 'global'" in problems[2]
    assert "timeout must be positive" in problems[3]
    assert "max_visits must be at least 1" in problems[4]


def test_config_values_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"config\.max_tool_call_retries must not be negative"):
        ExecutionConfig(max_tool_call_retries=-1)
    with pytest.raises(ConfigError, match="max_model_calls_per_step must be at least 1"):
        ExecutionConfig(max_model_calls_per_step=0)


def test_a_step_config_overrides_only_the_fields_it_sets() -> None:
    run = ExecutionConfig(max_tool_call_retries=0, max_model_calls_per_step=4)
    step = ExecutionConfig(max_model_calls_per_step=2)
    merged = run.merged(step)
    assert (merged.max_model_calls_per_step, merged.max_tool_call_retries) == (2, 0)
    assert run.merged({"max_output_retries": 5}).max_tool_call_retries == 0
    assert run.merged(ExecutionConfig()) is run
    with pytest.raises(ConfigError, match="max_model_call"):
        run.merged({"max_model_call": 3})


def test_a_field_a_step_config_gives_overrides_the_run_even_at_its_default() -> None:
    run = ExecutionConfig(max_tool_call_retries=0, max_model_calls_per_step=4)
    step = ExecutionConfig(max_tool_call_retries=2)  # 2 is the default, said on purpose
    assert step.overrides() == {"max_tool_call_retries": 2}
    merged = run.merged(step)
    assert (merged.max_model_calls_per_step, merged.max_tool_call_retries) == (4, 2)
    assert ExecutionConfig().overrides() == {}


def _run_flaky(step_config: ExecutionConfig) -> tuple[StepExecution, int]:
    """A tool step whose tool fails the first time, in a run that allows no tool retry."""
    attempts = 0

    @tool
    def flaky() -> str:
        """Fails the first time."""
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("not yet")
        return "done"

    run_config = ExecutionConfig(max_tool_call_retries=0, tool_retry_initial_delay=0.0)
    context = AgentContext(tools=[flaky], config=run_config)
    step = ToolStep("t", "flaky", config=step_config)
    return asyncio.run(StepExecutor(step, context).execute()), attempts


def test_a_step_config_keeps_the_run_fields_it_does_not_give() -> None:
    execution, attempts = _run_flaky(ExecutionConfig(max_model_calls_per_step=3))
    assert execution.status is StepStatus.FAILED
    assert execution.error == "step 't': Tool 'flaky' failed: RuntimeError: not yet"
    assert attempts == 1


def test_a_step_config_field_at_its_default_still_overrides_the_run() -> None:
    execution, attempts = _run_flaky(ExecutionConfig(max_tool_call_retries=2))
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "done"
    assert attempts == 2


def test_no_model_configured_fails_the_step_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINIONS_MODEL", raising=False)
    execution = StepExecutor(DefaultStep("s", "x"), AgentContext()).execute_sync()
    assert execution.error is not None
    assert execution.error.startswith("no model configured")
    assert "MINIONS_MODEL" in execution.error
