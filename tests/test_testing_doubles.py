"""ScriptedModel and FunctionModel, the test doubles users test their agents with."""

from __future__ import annotations

import asyncio

import pytest

from minions import (
    AgentContext,
    DefaultStep,
    Message,
    ModelCallResponse,
    ModelOutputError,
    Prompt,
    StepExecutor,
    StepStatus,
)
from minions.errors import ScriptExhaustedError
from minions.testing import FunctionModel, ScriptedModel


def ask(model: ScriptedModel | FunctionModel, text: str = "hi") -> ModelCallResponse:
    return asyncio.run(model.call(Prompt(messages=(Message.user(text),), step_id="s")))


def test_scripted_replies_in_order_and_records_requests() -> None:
    custom = ModelCallResponse(message=Message.assistant("custom"))
    model = ScriptedModel(["one", [("t", {"x": 1}), ("u", "{}")], custom])
    assert ask(model, "a").text == "one"
    calls = ask(model, "b").tool_calls
    assert [(c.id, c.name, dict(c.arguments)) for c in calls] == [
        ("call_1", "t", {"x": 1}),
        ("call_2", "u", {}),
    ]
    assert ask(model, "c") is custom
    assert [str(p) for p in model.requests] == ["user: a", "user: b", "user: c"]
    assert model.remaining == 0


def test_scripted_usage_is_estimated_and_deterministic() -> None:
    first = ask(ScriptedModel(["x" * 40]), "y" * 40).usage
    assert (first.prompt_tokens, first.completion_tokens, first.calls) == (14, 10, 1)


def test_scripted_exceptions_are_raised() -> None:
    model = ScriptedModel([ValueError("boom")])
    with pytest.raises(ValueError, match="boom"):
        ask(model)


def test_bad_argument_json_raises_like_a_provider() -> None:
    with pytest.raises(ModelOutputError, match="were not valid JSON"):
        ask(ScriptedModel([[("t", "{oops")]]))


def test_running_out_of_script_fails_loudly() -> None:
    model = ScriptedModel(["only"])
    ask(model)
    with pytest.raises(ScriptExhaustedError) as raised:
        ask(model, "again")
    assert "has no reply left: its script holds 1 replies and this is request 2" in str(
        raised.value
    )
    assert "step 's'" in str(raised.value)


def test_function_model_sync_and_async() -> None:
    def echo(prompt: Prompt) -> str:
        return prompt.messages[-1].content.upper()

    async def tools(prompt: Prompt) -> list[tuple[str, dict[str, int]]]:
        return [("t", {"n": len(prompt.messages)})]

    assert ask(FunctionModel(echo), "shout").text == "SHOUT"
    assert ask(FunctionModel(tools)).tool_calls[0].arguments == {"n": 1}


def test_a_function_model_drives_a_whole_step() -> None:
    def reply(prompt: Prompt) -> str | list[tuple[str, dict[str, object]]]:
        if prompt.messages[-1].role == "tool":
            return f"result: {prompt.messages[-1].content}"
        return [("echo", {"text": "ping"})]

    from minions import tool

    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    context = AgentContext(model=FunctionModel(reply), tools=[echo])
    execution = StepExecutor(DefaultStep("s", "x", tools={"echo"}), context).execute_sync()
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "result: ping"
