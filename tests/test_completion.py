"""The completion chain: links, order, customization, and the built-in links."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import FAST

from minions import (
    AgentContext,
    CompletionDecision,
    DefaultStep,
    ExecutionConfig,
    Message,
    StepCompletionChain,
    StepCompletionLink,
    StepExecution,
    StepExecutor,
    StepInput,
    StepStatus,
    UnknownLinkError,
    tool,
)
from minions.events import CompletionDecided
from minions.testing import ScriptedModel


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


def run(step: DefaultStep, model: ScriptedModel, **context: Any) -> StepExecution:
    ctx = AgentContext(model=model, tools=[lookup], config=FAST, **context)
    return asyncio.run(StepExecutor(step, ctx).execute())


class Pass(StepCompletionLink):
    def __init__(self) -> None:
        self.calls = 0

    def check(self, execution: StepExecution, context: AgentContext) -> None:
        self.calls += 1


class RequireLookup(StepCompletionLink):
    """Not done until the model has used the lookup tool."""

    async def check(
        self, execution: StepExecution, context: AgentContext
    ) -> CompletionDecision | None:
        if not execution.tool_calls:
            return CompletionDecision.incomplete("Use the lookup tool first.")
        return None


def test_default_chain_order() -> None:
    assert StepCompletionChain.default().names == (
        "completion_tool",
        "completion_marker",
        "structured_output",
        "text_answer",
        "call_limit",
    )


def test_pass_means_ask_the_next_link() -> None:
    """Java pitfall: a link answering "pass" stopped the chain."""
    first, second = Pass(), Pass()
    chain = StepCompletionChain.default().add_first(second).add_first(first)
    execution = run(DefaultStep("s", "x", completion=chain), ScriptedModel(["done"]))
    assert (first.calls, second.calls) == (1, 1)
    assert execution.status is StepStatus.COMPLETED
    assert execution.decisions[0].link == "text_answer"


def test_editing_returns_new_chains() -> None:
    default = StepCompletionChain.default()
    edited = default.add_before("text_answer", Pass()).remove("completion_marker")
    assert edited.names == (
        "completion_tool",
        "structured_output",
        "pass",
        "text_answer",
        "call_limit",
    )
    assert default.names[1] == "completion_marker"
    assert edited.add_after(Pass, RequireLookup()).names[3] == "require_lookup"
    assert edited.replace("pass", RequireLookup()).names[2] == "require_lookup"
    assert edited.add_last(Pass()).names[-1] == "pass"
    with pytest.raises(UnknownLinkError, match="no completion link 'nope'"):
        edited.remove("nope")


def test_incomplete_adds_a_note_and_the_loop_goes_on() -> None:
    chain = StepCompletionChain.default().add_first(RequireLookup())
    events: list[Any] = []
    model = ScriptedModel(["guess", [("lookup", {"key": "k"})], "K"])
    execution = run(
        DefaultStep("s", "Find k.", tools={"lookup"}, completion=chain),
        model,
        listeners=[events.append],
    )
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "K"
    assert model.requests[1].messages[-1] == Message.user("Use the lookup tool first.")
    assert [(d.link, d.kind) for d in execution.decisions] == [
        ("require_lookup", "incomplete"),
        ("text_answer", "complete"),
    ]
    decided = [e for e in events if isinstance(e, CompletionDecided)]
    assert [(e.link, e.decision) for e in decided] == [
        ("require_lookup", "incomplete"),
        ("text_answer", "complete"),
    ]


def test_a_context_chain_applies_to_steps_without_their_own() -> None:
    chain = StepCompletionChain.default().add_first(RequireLookup())
    model = ScriptedModel(["guess", [("lookup", {"key": "k"})], "K"])
    execution = run(DefaultStep("s", "x", tools={"lookup"}), model, completion_chain=chain)
    assert execution.decisions[0].link == "require_lookup"


def test_fail_decision_fails_the_step() -> None:
    class Refuse(StepCompletionLink):
        def check(self, execution: StepExecution, context: AgentContext) -> CompletionDecision:
            return CompletionDecision.fail("the answer mentions a secret")

    chain = StepCompletionChain((Refuse(),))
    execution = run(DefaultStep("s", "x", completion=chain), ScriptedModel(["secret"]))
    assert execution.status is StepStatus.FAILED
    assert execution.error == "the answer mentions a secret"


def test_completion_marker() -> None:
    model = ScriptedModel(["Working on it.", "The answer is 42. TASK_COMPLETE"])
    step = DefaultStep("s", "x", completion_marker="TASK_COMPLETE")
    execution = run(step, model)
    assert execution.output == "The answer is 42."
    assert model.requests[1].messages[-1].content == (
        "Continue with the task. When it is done, end your reply with TASK_COMPLETE."
    )


def test_completion_pattern_with_an_output_group() -> None:
    step = DefaultStep("s", "x", completion_pattern=r"FINAL: (?P<output>.+)")
    execution = run(step, ScriptedModel(["Thinking... FINAL: 7 apples"]))
    assert execution.output == "7 apples"
    assert execution.decisions[0].reason.startswith("pattern")


def test_completion_tool() -> None:
    model = ScriptedModel(
        [[("lookup", {"key": "a"}), ("complete_step", {"result": "A", "next_step": "b"})]]
    )
    step = DefaultStep("s", "x", tools={"lookup"}, completion_tool=True)
    execution = run(step, model)
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "A"
    assert execution.next_step == "b"
    assert [t.name for t in model.requests[0].tools] == ["lookup", "complete_step"]
    # The other call of that answer was not run, but still got its result message.
    assert [m.content for m in execution.messages if m.role == "tool"] == [
        "Not executed: complete_step ended the step.",
        "Received.",
    ]
    assert execution.tool_calls == []


def test_call_limit_link_fails_when_reached() -> None:
    model = ScriptedModel([[("lookup", {"key": "a"})]] * 2)
    step = DefaultStep("s", "x", tools={"lookup"}, config={"max_model_calls_per_step": 2})
    execution = run(step, model)
    decision = execution.decisions[-1]
    assert (decision.link, decision.kind, decision.turn) == ("call_limit", "fail", 2)
    assert decision.reason == "reached max_model_calls_per_step (2) without completing"
    assert execution.error == "reached max_model_calls_per_step (2) without completing"


def test_a_chain_without_the_limit_link_still_stops_at_the_step_limit() -> None:
    class GoOn(StepCompletionLink):
        name = "go_on"

        def check(self, execution: StepExecution, context: AgentContext) -> CompletionDecision:
            return CompletionDecision.incomplete("Keep going.")

    model = ScriptedModel(["one", "two", "three", "four"])
    step = DefaultStep(
        "s",
        "x",
        config=ExecutionConfig(max_model_calls_per_step=3),
        completion=StepCompletionChain([GoOn()]),
    )
    execution = run(step, model)
    assert len(model.requests) == 3
    assert [d.link for d in execution.decisions] == ["go_on", "go_on", "go_on", "call_limit"]
    assert execution.error == "reached max_model_calls_per_step (3) without completing"


def test_empty_answer_is_reasked() -> None:
    execution = run(DefaultStep("s", "x"), ScriptedModel(["  ", "fine"]))
    assert execution.output == "fine"
    assert execution.decisions[0].kind == "reask"


def test_a_step_subclass_builds_its_own_prompt_tools_and_chain() -> None:
    class Shouting(DefaultStep):
        def build_messages(self, step_input: StepInput) -> list[Message]:
            return [Message.user(f"{self.bundle.goal.upper()}!")]

        def tool_names(self) -> frozenset[str]:
            return frozenset({"lookup"})

        def completion_chain(self, default: StepCompletionChain) -> StepCompletionChain:
            return default.add_first(RequireLookup())

    model = ScriptedModel([[("lookup", {"key": "x"})], "X"])
    execution = run(Shouting("s", "find x"), model)
    assert model.requests[0].messages == (Message.user("FIND X!"),)
    assert [t.name for t in model.requests[0].tools] == ["lookup"]
    assert execution.output == "X"


def test_a_step_subclass_can_replace_the_loop() -> None:
    from minions import Step, StepRun

    class Constant(Step):
        def build_messages(self, step_input: StepInput) -> list[Message]:
            return []

        async def run(self, run: StepRun) -> None:
            run.complete({"value": 1})

    context = AgentContext(model=ScriptedModel([]))
    execution = asyncio.run(StepExecutor(Constant("c"), context).execute())
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == {"value": 1}
