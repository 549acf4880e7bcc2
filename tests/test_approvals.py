"""Tools that need a person's approval: the approver is asked before the call, with events;
a rejection reaches the model as the call's result; no approver fails the step clearly; the
CLI asks on a terminal, and without one refuses to start unless --approve-all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_helpers import Recorder
from cli_helpers import write_recipe
from typer.testing import CliRunner

from minions import AgentExecutor, AgentRecipe, DefaultStep, tool
from minions.cli._app import Settings, app
from minions.errors import RecipeError
from minions.events import ApprovalRequested, ApprovalResolved, ToolCallFailed
from minions.recipes import dump_recipe, parse_recipe
from minions.testing import FunctionModel, ScriptedModel
from minions.tools import ApprovalDecision, ApprovalRequest

calls: list[str] = []


@tool(requires_approval=True)
def deploy(target: str) -> str:
    """Deploy to a target."""
    calls.append(target)
    return f"deployed {target}"


def agent_recipe() -> AgentRecipe:
    return AgentRecipe(
        id="ship",
        steps=[DefaultStep("ship", "Deploy to prod.", tools=["deploy"])],
        tools=[deploy],
    )


def model() -> ScriptedModel:
    return ScriptedModel([[("deploy", {"target": "prod"})], "Done."])


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


async def test_an_approved_call_runs_after_the_approver_said_yes() -> None:
    asked: list[ApprovalRequest] = []

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision(approved=True)

    recorder = Recorder()
    executor = AgentExecutor(model=model(), approver=approver, listeners=[recorder])
    result = await executor.execute(agent_recipe())
    assert result.ok
    assert calls == ["prod"]
    [request] = asked
    assert (request.step_id, request.visit, request.item, request.tool) == (
        "ship",
        1,
        None,
        "deploy",
    )
    assert request.arguments == {"target": "prod"}
    assert request.call_id.startswith("ship#1/")
    requested = [e for e in recorder.events if isinstance(e, ApprovalRequested)]
    resolved = [e for e in recorder.events if isinstance(e, ApprovalResolved)]
    assert [e.call_id for e in requested] == [request.call_id]
    assert [(e.approved, e.reason) for e in resolved] == [(True, None)]


async def test_a_rejection_reaches_the_model_as_the_calls_result() -> None:
    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision(approved=False, reason="not on a Friday")

    scripted = model()
    recorder = Recorder()
    executor = AgentExecutor(model=scripted, approver=approver, listeners=[recorder])
    result = await executor.execute(agent_recipe())
    assert result.ok
    assert calls == []
    said = scripted.requests[-1].messages[-1].content
    assert said == (
        "A person rejected this call to 'deploy': not on a Friday. Do not make it again as it was."
    )
    # The note is the model's: the call's error and its event say what the person did.
    [call] = result.step("ship").tool_calls
    assert call.response is not None
    assert call.response.error == "A person rejected this call to 'deploy': not on a Friday."
    failed = [e for e in recorder.events if isinstance(e, ToolCallFailed)]
    assert [e.error for e in failed] == [call.response.error]


async def test_without_an_approver_the_step_fails_naming_the_tool() -> None:
    result = await AgentExecutor(model=model()).execute(agent_recipe())
    assert not result.ok
    assert calls == []
    assert "tool 'deploy' (step 'ship') needs a person's approval" in (result.error or "")


async def test_an_approver_that_raises_fails_the_step() -> None:
    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        raise RuntimeError("the approval service is down")

    result = await AgentExecutor(model=model(), approver=approver).execute(agent_recipe())
    assert not result.ok
    assert calls == []
    assert "asking for approval of 'deploy' (step 'ship') failed: RuntimeError" in (
        result.error or ""
    )


TOOL_STEP = """\
id: release
tools: [tools]
steps:
  - id: say
    tool: shout
    params: {text: ship it}
    requires_approval: true
"""


async def test_a_yaml_tool_step_can_require_approval(tmp_path: Path) -> None:
    recipe = parse_recipe(TOOL_STEP, base=write_recipe(tmp_path, TOOL_STEP).parent)
    assert "requires_approval: true" in dump_recipe(recipe)
    seen: list[str] = []

    async def reject(request: ApprovalRequest) -> ApprovalDecision:
        seen.append(request.call_id)
        return ApprovalDecision(approved=False, reason="too loud")

    result = await AgentExecutor(approver=reject).execute(recipe)
    assert not result.ok
    assert "A person rejected this call to 'shout': too loud" in (result.error or "")
    assert "Do not make it again" not in (result.error or "")
    assert seen == ["say#1/say-call"]


def test_requires_approval_belongs_to_tool_steps() -> None:
    with pytest.raises(RecipeError, match="`requires_approval` is for tool steps"):
        parse_recipe("id: x\nsteps: [{id: a, goal: hi, requires_approval: true}]\n")


def run(tmp_path: Path, *args: str, ask: Any = None) -> Any:
    path = write_recipe(tmp_path, TOOL_STEP)
    settings = Settings(resolve_model=lambda s: FunctionModel(lambda p: "x", name="m"), ask=ask)
    return CliRunner().invoke(app, ["run", str(path), *args], obj=settings)


def test_the_cli_refuses_to_start_without_a_terminal_unless_approve_all(tmp_path: Path) -> None:
    refused = run(tmp_path)
    assert refused.exit_code == 2
    said = " ".join(refused.output.split())
    assert "step 'say' calls 'shout', which needs a person's approval" in said
    assert "--approve-all" in said
    approved = run(tmp_path, "--approve-all", "--json")
    assert approved.exit_code == 0, approved.output
    assert '"SHIP IT"' in approved.output


@pytest.mark.parametrize(("answers", "code"), [(["y"], 0), (["n", "too loud"], 1)])
def test_the_cli_asks_on_a_terminal(tmp_path: Path, answers: list[str], code: int) -> None:
    questions: list[str] = []
    given = iter(answers)

    def ask(question: str) -> str:
        questions.append(question)
        return next(given)

    result = run(tmp_path, ask=ask)
    assert result.exit_code == code, result.output
    assert questions[0] == "approve? [y/N] "
    assert "step 'say' wants to call shout" in result.output
    if code:
        assert "too loud" in result.output
