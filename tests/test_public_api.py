"""The public API: names importable from `minions`, and what importing costs."""

from __future__ import annotations

import subprocess
import sys

import pytest

import minions

CORE_NAMES = {
    "Message", "MessageBundle", "ModelMemory", "InMemoryModelMemory", "tool", "Tool",
    "ToolRegistry", "ToolCall", "ToolCallResponse", "ModelCall", "ModelCallResponse", "Prompt",
    "Usage", "Model", "ModelCallExecutor", "ToolCallExecutor", "Step", "DefaultStep",
    "StepExecution", "StepStatus", "StepCompletionChain", "StepCompletionLink",
    "CompletionDecision", "OutputInstructions", "ExecutionConfig", "AgentContext",
    "StepExecutor", "MinionsError",
}  # fmt: skip
AGENT_NAMES = {
    "AgentRecipe", "AgentExecutor", "AgentResult", "StepGraph", "StepManager", "Transition",
}  # fmt: skip
EVENT_NAMES = {
    "RunStarted", "RunCompleted", "RunFailed", "StepStarted", "StepCompleted", "StepFailed",
    "StepSkipped", "ModelCallStarted", "ModelCallCompleted", "ToolCallStarted",
    "ToolCallCompleted", "ToolCallFailed", "RetryScheduled", "CompletionDecided",
    "RoutingDecided", "event_to_json", "event_from_json",
}  # fmt: skip


def test_all_names_are_importable_and_unique() -> None:
    assert len(minions.__all__) == len(set(minions.__all__))
    for name in minions.__all__:
        assert hasattr(minions, name), name


def test_core_names_are_public() -> None:
    assert set(minions.__all__) >= CORE_NAMES


def test_agent_names_and_event_types_are_public() -> None:
    import minions.events

    assert set(minions.__all__) >= AGENT_NAMES
    assert set(minions.events.__all__) >= EVENT_NAMES


def test_step_status_values() -> None:
    assert [s.name for s in minions.StepStatus] == [
        "PENDING", "IN_PROGRESS", "COMPLETED", "FAILED", "SKIPPED",
    ]  # fmt: skip


def test_testing_doubles_are_public() -> None:
    from minions.testing import FunctionModel, ScriptedModel

    assert issubclass(ScriptedModel, minions.Model)
    assert issubclass(FunctionModel, minions.Model)


def test_import_stays_light() -> None:
    """Heavy dependencies load on first use, not on `import minions`."""
    code = (
        "import sys, minions; "
        "heavy = ['openai', 'instructor', 'pydantic', 'structlog', 'jmespath', 'yaml', "
        "'jsonschema', 'tenacity', 'httpx', 'httpx2', 'rich', 'typer', 'minions.agent']; "
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == ""


def test_lazy_names_resolve_once_and_are_listed() -> None:
    assert "AgentRecipe" in dir(minions)
    assert minions.AgentRecipe is minions.agent.AgentRecipe
    assert "AgentRecipe" in vars(minions)  # cached after the first lookup
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        minions.NoSuchName  # noqa: B018
