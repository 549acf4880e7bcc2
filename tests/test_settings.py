"""RunSettings: an executor holds what it was given in one frozen value, a run's context takes
it (given arguments win), and a recipe step's inner run shares the outer run's settings."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from agent_helpers import Recorder
from opentelemetry.trace import NoOpTracerProvider

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    ConfigError,
    DefaultStep,
    Message,
    Model,
    RecipeStep,
    RunSettings,
    Step,
    StepInput,
    StepRun,
    tool,
)
from minions.testing import ScriptedModel
from minions.tools import ApprovalDecision, ApprovalRequest, MCPStdioServer

deployed: list[str] = []
seen: list[RunSettings] = []
"""The settings `Peek` steps ran with."""


@tool(requires_approval=True)
def deploy(target: str) -> str:
    """Deploy to a target."""
    deployed.append(target)
    return f"deployed {target}"


class Peek(Step):
    """Keeps the settings of the run it runs in (in `seen`)."""

    def uses_model(self) -> bool:
        return False

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []

    async def run(self, run: StepRun) -> None:
        seen.append(run.context.settings)
        run.complete("peeked")


async def approve(request: ApprovalRequest) -> ApprovalDecision:
    return ApprovalDecision(approved=True)


def same_model(model: Model) -> Model:
    return model


def test_an_executor_holds_what_it_was_given_in_its_settings() -> None:
    def resolver(spec: Model | str | None) -> Model:
        return ScriptedModel([])

    listener = Recorder()
    executor = AgentExecutor(
        model="openai:gpt-4o-mini",
        model_resolver=resolver,
        model_wrapper=same_model,
        approver=approve,
        tracer_provider=NoOpTracerProvider(),
        mcp_servers={"notes": {"command": "notes-server", "args": ["--ro"]}},
        listeners=[listener],
    )
    settings = executor.settings
    assert settings.model == "openai:gpt-4o-mini"
    assert settings.model_resolver is resolver
    assert settings.model_wrapper is same_model
    assert settings.approver is approve
    assert settings.tracer is not None
    assert settings.listeners == (listener,)
    assert dict(settings.mcp_servers) == {
        "notes": MCPStdioServer(command="notes-server", args=("--ro",))
    }
    with pytest.raises(TypeError):
        settings.mcp_servers["other"] = settings.mcp_servers["notes"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.model = "other:model"  # type: ignore[misc]


def test_an_executor_without_arguments_has_empty_settings() -> None:
    settings = AgentExecutor().settings
    assert settings == RunSettings()
    assert (settings.model, settings.approver, settings.tracer) == (None, None, None)
    assert (dict(settings.mcp_servers), settings.listeners) == ({}, ())


def test_a_settings_field_is_given_once_settings_or_keyword_never_both() -> None:
    base = RunSettings(model="a:model", model_wrapper=same_model, approver=approve)

    async def other(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision(approved=False)

    with pytest.raises(
        ConfigError, match=r"AgentExecutor: model given both as a keyword and in settings="
    ):
        AgentExecutor(settings=base, model="b:model")
    with pytest.raises(ConfigError, match=r"dataclasses.replace\(settings, approver=\.\.\.\)"):
        AgentContext(settings=base, approver=other, tools=[deploy])
    # Each form alone, the fields that are not settings beside them, and a keyword filling a
    # field the settings leave unset.
    assert AgentExecutor(settings=base, tools=[deploy]).settings is base
    listener = Recorder()
    both = AgentExecutor(settings=base, listeners=[listener])
    assert both.settings == dataclasses.replace(base, listeners=(listener,))
    assert AgentContext(settings=base, tools=[deploy]).settings is base
    changed = AgentContext(settings=dataclasses.replace(base, approver=other))
    assert changed.settings.approver is other


def test_a_context_built_by_hand_holds_its_arguments_as_settings() -> None:
    model = ScriptedModel(["ok"])
    listener = Recorder()
    context = AgentContext(model=model, approver=approve, listeners=[listener])
    assert context.settings == RunSettings(model=model, approver=approve, listeners=(listener,))
    assert context.model is model


async def test_a_run_context_takes_the_executors_settings_and_the_recipes_own() -> None:
    listener, extra = Recorder(), Recorder()
    executor = AgentExecutor(model="a:model", approver=approve, listeners=[listener])
    plain = AgentRecipe(id="plain", steps=[Peek("peek")])
    assert executor.create_context(plain).settings is executor.settings

    own = AgentRecipe(
        id="own",
        model="b:model",
        steps=[Peek("peek")],
        mcp_servers={"notes": MCPStdioServer(command="notes-server")},
    )
    settings = executor.create_context(own, listeners=[extra]).settings
    assert settings.model == "b:model"
    assert settings.listeners == (listener, extra)
    assert dict(settings.mcp_servers) == {"notes": MCPStdioServer(command="notes-server")}
    assert settings.approver is approve
    assert executor.settings.listeners == (listener,)  # the executor's are unchanged


async def test_a_recipe_steps_inner_run_shares_the_outer_runs_settings() -> None:
    """Resolver, wrapper, approver and tracer reach the inner run through the settings; the
    inner run's events stay out of the outer listeners, as before."""
    seen.clear()
    deployed.clear()
    resolved: list[Any] = []
    wrapped: list[Model] = []
    asked: list[str] = []
    scripted = ScriptedModel([[("deploy", {"target": "prod"})], "Done."])

    def resolver(spec: Model | str | None) -> Model:
        resolved.append(spec)
        return scripted

    def wrapper(model: Model) -> Model:
        wrapped.append(model)
        return model

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request.step_id)
        return ApprovalDecision(approved=True)

    listener = Recorder()
    executor = AgentExecutor(
        model="outer:model",
        model_resolver=resolver,
        model_wrapper=wrapper,
        approver=approver,
        tracer_provider=NoOpTracerProvider(),
        listeners=[listener],
    )
    inner = AgentRecipe(
        id="inner",
        steps=[Peek("peek"), DefaultStep("ship", "Deploy.", tools=["deploy"])],
        tools=[deploy],
    )
    result = await executor.execute(AgentRecipe(id="outer", steps=[RecipeStep("nested", inner)]))

    assert result.ok, result.error
    assert deployed == ["prod"]
    assert asked == ["ship"]
    assert resolved == ["outer:model"]
    assert wrapped == [scripted]
    [inner_settings] = seen
    assert inner_settings.model == "outer:model"
    assert inner_settings.model_resolver is resolver
    assert inner_settings.approver is approver
    assert inner_settings.tracer is executor.settings.tracer
    assert inner_settings.model_wrapper is not wrapper  # wrapped again: the inner calls are scoped
    assert (inner_settings.listeners, dict(inner_settings.mcp_servers)) == ((), {})
    assert {event.run_id for event in listener.events} == {result.run_id}
