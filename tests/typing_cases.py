"""What the typed surface promises, as `assert_type` cases: `tests/test_typing.py` runs
``mypy --strict`` on this file (and `make typecheck` checks it with the rest of the tests).

The functions also run (`test_typing.py` runs `contract`), so the promises are about code that
works, not only code that type-checks.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, assert_type

from pydantic import BaseModel

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    AgentResult,
    AnalysisStep,
    CompletionDecision,
    DefaultStep,
    MessageBundle,
    OutputInstructions,
    RunStream,
    StepExecution,
    StepExecutor,
    StepFailed,
    StepStatus,
    StepStream,
    Tool,
    ToolContext,
    ToolStep,
    tool,
)
from minions.events import Event
from minions.testing import ScriptedModel, TestModel, block_real_models


class Expense(BaseModel):
    merchant: str
    amount_eur: float


class Advice(BaseModel):
    approve: bool


@dataclass
class Deps:
    rates: dict[str, float]


@tool
def convert(ctx: ToolContext[Deps], amount: float, currency: str) -> float:
    """Convert an amount to euros."""
    assert_type(ctx.deps, Deps)
    assert_type(ctx.run_id, str)
    assert_type(ctx.idempotency_key, str)
    assert_type(ctx.attempt, int)
    return amount * ctx.deps.rates[currency]


def not_negative(expense: Expense) -> Expense:
    if expense.amount_eur < 0:
        raise ValueError("amount_eur cannot be negative")
    return expense


async def positive(expense: Expense) -> Expense:
    return expense


def categorise_step() -> DefaultStep[Expense]:
    return DefaultStep(
        "categorise",
        goal="Categorise: {{ inputs.line }}",
        system="You categorise expenses.",
        tools=[convert],
        output=Expense,
        validators=[not_negative, positive],
    )


def each_way_of_building_a_step() -> None:
    assert_type(convert, Tool)
    assert_type(DefaultStep("a", goal="Say hi."), DefaultStep[str])
    assert_type(DefaultStep("a", "Say hi."), DefaultStep[str])
    assert_type(DefaultStep("a", MessageBundle(goal="Say hi.")), DefaultStep[str])
    assert_type(DefaultStep("a", goal="x", output=Expense), DefaultStep[Expense])
    assert_type(
        DefaultStep("a", goal="x", output=OutputInstructions(Expense)), DefaultStep[Expense]
    )
    assert_type(DefaultStep("a", goal="x", output=list[str]), DefaultStep[list[str]])
    assert_type(DefaultStep("a", goal="x", output={"type": "object"}), DefaultStep[Any])
    assert_type(DefaultStep("a", goal="x", tools=[convert, "read_file", len]), DefaultStep[str])
    assert_type(categorise_step(), DefaultStep[Expense])
    advise = DefaultStep("advise", goal="Approve?", depends_on=[categorise_step()], output=Advice)
    assert_type(advise, DefaultStep[Advice])
    assert_type(OutputInstructions(Expense), OutputInstructions[Expense])
    assert_type(OutputInstructions({"type": "object"}), OutputInstructions[Any])
    assert_type(OutputInstructions(Expense).validate_json("{}"), Expense)
    assert_type(AnalysisStep("x", input="{{ inputs }}", output={"a": 1}), AnalysisStep)
    assert_type(ToolStep("t", "convert", {"amount": 1}), ToolStep)


def step_results() -> None:
    step = categorise_step()
    model = ScriptedModel(['{"merchant": "A", "amount_eur": 1}'])
    execution = step.run_sync(model=model, inputs={"line": "A 1 EUR"}, deps=Deps({}))
    assert_type(execution, StepExecution[Expense])
    assert_type(execution.output, Expense | None)
    assert_type(execution.result(), Expense)
    text = DefaultStep("t", goal="Hi.").run_sync(model=ScriptedModel(["hi"]))
    assert_type(text.result(), str)
    layered = StepExecutor(step, AgentContext(model=model, deps=Deps({})))
    assert_type(layered, StepExecutor[Expense])
    assert_type(layered.execution, StepExecution[Expense])
    assert_type(layered.execute_sync, Callable[[], StepExecution[Expense]])
    untyped: StepExecution = text  # a bare StepExecution is a StepExecution[Any]
    assert_type(untyped.output, Any | None)
    try:
        execution.result()
    except StepFailed as failed:
        assert_type(failed.reason, str)
        assert_type(failed.step_id, str)


async def async_step_results() -> None:
    step = categorise_step()
    execution = await step.run(model=ScriptedModel(["{}"]), deps=Deps({}))
    assert_type(execution, StepExecution[Expense])
    layered = await StepExecutor(step, AgentContext(model=ScriptedModel(["{}"]))).execute()
    assert_type(layered, StepExecution[Expense])


async def streams() -> None:
    advise = DefaultStep("advise", goal="Approve it?", output=Advice)
    stream = advise.stream(model=ScriptedModel(['{"approve": true}']))
    assert_type(stream, StepStream[Advice])
    async with stream as opened:
        assert_type(opened, StepStream[Advice])
        assert_type(opened.text(), AsyncIterator[str])
        async for text in opened.text():
            assert_type(text, str)
    assert_type(stream.execution, StepExecution[Advice])
    async with StepExecutor(advise, AgentContext()).stream() as layered:
        async for event in layered:
            assert_type(event, Event)
    assert_type(layered.execution, StepExecution[Advice])


async def recipes() -> None:
    categorise, advise = categorise_step(), DefaultStep("advise", goal="Approve?", output=Advice)
    steps = [categorise, advise]  # steps are covariant in their output: a list of steps
    recipe = AgentRecipe(id="expenses", steps=steps)
    executor = AgentExecutor(model=ScriptedModel([]))
    result = await executor.execute(recipe, inputs={"line": "..."}, deps=Deps({}))
    assert_type(result, AgentResult)
    assert_type(result.step(advise), StepExecution[Advice])
    assert_type(result.step(categorise).result(), Expense)
    assert_type(result.step("advise"), StepExecution[Any])
    assert_type(result.visits(advise), tuple[StepExecution[Advice], ...])
    assert_type(executor.execute_sync(recipe, deps=Deps({})), AgentResult)
    assert_type(executor.stream(recipe, deps=Deps({})), RunStream)


def decisions() -> None:
    expense = Expense(merchant="A", amount_eur=1)
    decision = CompletionDecision.complete(expense)
    assert_type(decision, CompletionDecision[Expense])
    assert_type(decision.output, Expense | None)
    assert_type(CompletionDecision.reask("again"), CompletionDecision[Any])


async def contract() -> None:
    """The issue's program as written (inside an `async def`), with a real script where it says
    ``...`` and a `TestModel` for the stream's `model`; then checks of what it did."""
    categorise = DefaultStep(
        "categorise",
        goal="Categorise: {{ inputs.line }}",
        system="You categorise expenses.",
        tools=[convert],  # functions or Tools (registered for this step); names still work
        output=Expense,  # a pydantic model, a JSON Schema dict or OutputInstructions
        validators=[not_negative],
    )
    script = ScriptedModel(
        [
            [("convert", {"amount": 10, "currency": "USD"})],
            '{"merchant": "ACME", "amount_eur": -9}',  # re-asked by not_negative
            '{"merchant": "ACME", "amount_eur": 9}',
        ]
    )
    with block_real_models():  # any real model request inside raises, naming the model
        execution = categorise.run_sync(
            model=script, inputs={"line": "ACME 10 USD"}, deps=Deps({"USD": 0.9})
        )
    assert_type(execution, StepExecution[Expense])
    assert_type(execution.output, Expense | None)
    expense = execution.result()  # the output, or raises minions.StepFailed with the reason
    assert_type(expense, Expense)

    advise = DefaultStep("advise", goal="Approve it?", depends_on=[categorise], output=Advice)
    result = await AgentExecutor(model=TestModel()).execute(
        AgentRecipe(id="expenses", steps=[categorise, advise]),
        inputs={"line": "..."},
        deps=Deps({"USD": 0.9}),
    )
    assert_type(result.step(advise), StepExecution[Advice])

    model = TestModel()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        async with advise.stream(model=model, inputs={"line": "..."}) as stream:
            async for text in stream.text():  # text deltas as they arrive
                print(text, end="")
    assert_type(stream.execution, StepExecution[Advice])

    # What it did: the tool got the run's deps, the validator re-asked (a decision).
    assert expense == Expense(merchant="ACME", amount_eur=9)
    assert execution.tool_calls[0].result == 9.0
    reasked = execution.decisions[0]
    assert (reasked.kind, reasked.link) == ("reask", "validator:not_negative")
    assert result.status is StepStatus.COMPLETED, result.error
    assert result.step(advise).result() == Advice(approve=False)
    assert [call.name for call in result.step(categorise).tool_calls] == ["convert"]
    assert printed.getvalue() == '{"approve": false}', printed.getvalue()
    assert stream.execution.result() == Advice(approve=False)
