"""The typed surface: one way to wire a step (goal, system, tools, output, validators,
depends_on), `step.run` / `run_sync`, typed executions and results, tools with a
`ToolContext` and per-run deps, validators that re-ask, and short reprs."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from typing_cases import Advice, Deps, Expense, not_negative

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    ExecutionConfig,
    MessageBundle,
    MissingDepsError,
    ModelOutputError,
    Prompt,
    Reask,
    RecipeError,
    RecipeStep,
    StepDefinitionError,
    StepExecution,
    StepExecutor,
    StepFailed,
    StepStatus,
    Tool,
    ToolContext,
    ToolStep,
    tool,
)
from minions.events import CompletionDecided, Event
from minions.testing import FunctionModel, ScriptedModel
from minions.tools import tool_context

FAST = ExecutionConfig(retry_initial_delay=0.0, tool_retry_initial_delay=0.0)


seen: list[ToolContext[Deps]] = []


@tool
def convert(ctx: ToolContext[Deps], amount: float, currency: str) -> float:
    """Convert an amount to euros.

    Args:
        amount: the amount.
        currency: its currency.
    """
    seen.append(ctx)
    return amount * ctx.deps.rates[currency]


def categorise() -> DefaultStep[Expense]:
    return DefaultStep(
        "categorise",
        goal="Categorise: {{ inputs.line }}",
        system="You categorise expenses.",
        tools=[convert],
        output=Expense,
        validators=[not_negative],
        config=FAST,
    )


# -- wiring one way --------------------------------------------------------------------------


def test_the_short_form_runs_with_its_system_prompt_tools_output_and_deps() -> None:
    seen.clear()
    model = ScriptedModel(
        [[("convert", {"amount": 10, "currency": "USD"})], '{"merchant": "ACME", "amount_eur": 9}']
    )
    execution = categorise().run_sync(
        model=model, inputs={"line": "ACME 10 USD"}, deps=Deps({"USD": 0.9})
    )
    assert execution.status is StepStatus.COMPLETED, execution.error
    assert execution.result() == Expense(merchant="ACME", amount_eur=9.0)
    assert execution.tool_calls[0].result == 9.0
    first = model.requests[0]
    assert [m.role for m in first.messages] == ["system", "user"]
    assert first.messages[0].content == "You categorise expenses."
    assert first.messages[1].content.startswith("Categorise: ACME 10 USD")
    # The context is not part of the tool's schema: the model sees amount and currency only.
    [spec] = [s for s in first.tools if s.name == "convert"]
    assert set(spec.parameters["properties"]) == {"amount", "currency"}
    assert spec.parameters["required"] == ["amount", "currency"]
    [ctx] = seen
    assert (ctx.run_id, ctx.step_id, ctx.call_id, ctx.attempt) == (
        execution.conversation_id.split("/")[0],
        "categorise",
        "call_1",
        1,
    )
    assert ctx.idempotency_key == f"{ctx.run_id}/categorise#1/call_1"


def test_the_older_spellings_still_work() -> None:
    bundle = MessageBundle(system="Be terse.", goal="Say hi.")
    model = ScriptedModel(["hi", "hi"])
    for step in (DefaultStep("a", bundle), DefaultStep("a", "Say hi.", system="Be terse.")):
        execution = StepExecutor(step, AgentContext(model=model)).execute_sync()
        assert execution.output == "hi"
    assert [str(p) for p in model.requests] == ["system: Be terse.\nuser: Say hi."] * 2


def test_a_tool_function_given_to_a_step_is_that_steps_alone() -> None:
    @tool
    def secret() -> str:
        """A secret."""
        return "42"

    mine = DefaultStep("mine", goal="Use it.", tools=[secret])
    other = DefaultStep("other", goal="Try it.", tools=["secret"])
    with pytest.raises(RecipeError, match="step 'other', field 'tools': unknown tool 'secret'"):
        asyncio.run(
            AgentExecutor(model=ScriptedModel([])).execute(AgentRecipe(id="r", steps=[mine, other]))
        )
    # Names still resolve from the run's tools, beside the step's own functions.
    step = DefaultStep("both", goal="Use both.", tools=[secret, "add"], config=FAST)
    model = ScriptedModel([[("secret", {}), ("add", {"a": 1, "b": 2})], "done"])
    from conftest import add

    execution = step.run_sync(model=model, tools=[add])
    assert [c.result for c in execution.tool_calls] == ["42", 3]
    assert sorted(s.name for s in model.requests[0].tools) == ["add", "secret"]


def test_depends_on_takes_steps_or_ids_and_results_are_typed_by_step() -> None:
    first = DefaultStep(
        "categorise",
        goal="Categorise.",
        output=Expense,
        model=ScriptedModel(['{"merchant": "A", "amount_eur": 1}']),
    )
    advise = DefaultStep(
        "advise",
        goal="Approve it?",
        depends_on=[first],
        output=Advice,
        model=ScriptedModel(['{"approve": true}']),
    )
    last = DefaultStep(
        "last", goal="Say done.", depends_on=["advise"], model=ScriptedModel(["done"])
    )
    assert advise.depends_on == ("categorise",)
    result = AgentExecutor().execute_sync(AgentRecipe(id="expenses", steps=[first, advise, last]))
    assert result.step(advise).result() == Advice(approve=True)
    assert result.step(first).result().merchant == "A"
    assert result.step("advise") is result.step(advise)
    assert result.visits(advise) == (result.step(advise),)


def test_run_model_wins_over_the_steps_own_and_a_model_string_works() -> None:
    step = DefaultStep("s", goal="Say hi.", model=ScriptedModel(["the step's own"]))
    assert step.run_sync(model=ScriptedModel(["the run's"])).output == "the run's"
    assert step.run_sync().output == "the step's own"


# -- bad definitions -------------------------------------------------------------------------


def test_a_misspelt_step_option_says_did_you_mean() -> None:
    with pytest.raises(StepDefinitionError) as raised:
        DefaultStep("s", goal="x", dependson=["a"])  # type: ignore[call-overload]
    message = str(raised.value)
    assert message.startswith(
        "step 's': DefaultStep has no option 'dependson' (did you mean 'depends_on'?); "
        "its options: "
    )
    assert "goal" in message
    assert "validators" in message
    with pytest.raises(
        StepDefinitionError, match=r"ToolStep has no option 'parms' \(did you mean 'params'\?\)"
    ):
        ToolStep("t", "add", parms={})  # type: ignore[call-arg]


def test_tools_may_be_any_iterable_even_one_read_once() -> None:
    from conftest import add

    given: list[Tool | str] = [add, "read_file"]
    step = DefaultStep("s", goal="x", tools=(t for t in given))
    assert step.tools == {"add", "read_file"}
    assert [t.name for t in step.own_tools] == ["add"]


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        (convert, r"tools must be a list: write tools=\[convert\], not tools=convert"),
        (42, "tools must be a list of functions, Tools or tool names, not 42"),
        ([42], "tools holds 42, which is neither a function, a Tool nor a tool name"),
        ([lambda x: x], r"tool name '<lambda>' must be 1-64 letters"),
    ],
)
def test_a_tool_given_the_wrong_way_is_a_clear_definition_error(tools: Any, expected: str) -> None:
    with pytest.raises(StepDefinitionError, match=expected):
        DefaultStep("s", goal="x", tools=tools)


def test_other_bad_wiring_is_a_clear_definition_error() -> None:
    with pytest.raises(StepDefinitionError, match="goal is empty; say what the step must do"):
        DefaultStep("s", system="You help.")
    with pytest.raises(StepDefinitionError, match="depends_on holds 3, which is neither a step"):
        DefaultStep("s", goal="x", depends_on=[3])  # type: ignore[list-item]
    with pytest.raises(
        StepDefinitionError, match=r"validators must be a list: write validators=\[not_negative\]"
    ):
        DefaultStep("s", goal="x", output=Expense, validators=not_negative)  # type: ignore[call-overload]
    with pytest.raises(StepDefinitionError, match="the system prompt is given twice"):
        DefaultStep("s", MessageBundle(goal="x", system="a"), system="b")


# -- results ---------------------------------------------------------------------------------


def test_result_raises_step_failed_with_the_reason() -> None:
    step = DefaultStep("s", goal="Say hi.", config=ExecutionConfig(max_model_calls_per_step=1))
    execution = step.run_sync(model=ScriptedModel([[("nothing", {})]]))
    assert execution.status is StepStatus.FAILED
    with pytest.raises(StepFailed) as raised:
        execution.result()
    assert raised.value.step_id == "s"
    assert raised.value.status == "failed"
    assert raised.value.reason == execution.error
    assert str(raised.value) == f"step 's' failed: {execution.error}"
    with pytest.raises(StepFailed, match="step 'p' pending: it has not ended yet"):
        StepExecution(step_id="p").result()


def test_reprs_are_short_and_say_what_matters() -> None:
    model = ScriptedModel(
        [[("add", {"a": 2, "b": 3})], '{"merchant": "' + "M" * 500 + '", "amount_eur": 5}']
    )
    from conftest import add

    step = DefaultStep("sum", goal="Add.", tools=[add], output=Expense)
    execution = step.run_sync(model=model)
    text = repr(execution)
    assert text.startswith(
        "StepExecution(step='sum', status='completed', output=Expense(merchant='MMM"
    )
    assert "model_calls=2, tokens='25+141', tool_calls=1, duration='" in text
    assert len(text) < 200
    assert repr(execution.tool_calls[0]) == (
        "ToolCall(id='call_1', name='add', arguments={'a': 2, 'b': 3}, status='ok', result='5')"
    )
    call = repr(execution.model_calls[0])
    assert call.startswith(
        "ModelCall(step='sum', turn=1, attempt=1, model='scripted', status='ok', "
        "tool_calls=['add'], "
    )
    assert len(repr(execution.model_calls[1])) < 200
    result = AgentExecutor().execute_sync(
        AgentRecipe(id="one", steps=[DefaultStep("s", goal="Hi.", model=ScriptedModel(["hello"]))])
    )
    assert repr(result).startswith("AgentResult(recipe='one', run_id=")
    assert repr(result).endswith(
        "status='completed', steps=1, output='hello', model_calls=1, tokens='5+2')"
    )
    failed = StepExecution[str](step_id="f", status=StepStatus.FAILED, error="x" * 500)
    assert repr(failed) == f"StepExecution(step='f', status='failed', error='{'x' * 59}…')"


# -- ToolContext and deps --------------------------------------------------------------------


def test_a_tool_context_without_deps_fails_the_step_saying_how_to_give_them() -> None:
    model = ScriptedModel([[("convert", {"amount": 1, "currency": "USD"})], "never asked"])
    execution = DefaultStep("s", goal="Convert.", tools=[convert], config=FAST).run_sync(
        model=model
    )
    assert execution.status is StepStatus.FAILED
    assert execution.error is not None
    assert execution.error.startswith(
        "a tool of step 's' (call 'call_1') reads ctx.deps, and this run was given none: "
        "pass deps= to step.run(...)"
    )
    assert len(model.requests) == 1  # not the model's to handle, not retried
    assert [m.role for m in execution.messages][-1] == "tool"  # the conversation is whole
    with pytest.raises(MissingDepsError):
        _ = ToolContext[Deps]().deps


def test_deps_reach_tools_through_every_way_of_running() -> None:
    rates = Deps({"USD": 2.0})

    def script() -> ScriptedModel:
        return ScriptedModel([[("convert", {"amount": 1, "currency": "USD"})], "done"])

    step = DefaultStep("s", goal="Convert.", tools=[convert], config=FAST)
    recipe = AgentRecipe(id="r", steps=[step])
    results = [
        asyncio.run(step.run(model=script(), deps=rates)),
        StepExecutor(step, AgentContext(model=script(), deps=rates)).execute_sync(),
        AgentExecutor(model=script()).execute_sync(recipe, deps=rates).step(step),
        asyncio.run(AgentExecutor(model=script()).execute(recipe, deps=rates)).step(step),
    ]

    async def streamed() -> StepExecution[Any]:
        stream = AgentExecutor(model=script()).stream(recipe, deps=rates)
        async for _ in stream:
            pass
        assert stream.result is not None
        return stream.result.step(step)

    results.append(asyncio.run(streamed()))
    # A recipe run as a step of another run gets the outer run's deps.
    outer = AgentRecipe(id="outer", steps=[RecipeStep("inner", recipe)])
    inner = AgentExecutor(model=script()).execute_sync(outer, deps=rates)
    results.append(inner.step("inner").items[0])
    assert [e.tool_calls[0].result for e in results] == [2.0] * 6


def test_a_tool_may_take_a_plain_tool_context_and_read_it_from_threads() -> None:
    found: list[tuple[str, str | None]] = []

    @tool
    def where(ctx: ToolContext) -> str:
        """Where am I?"""
        current = tool_context()
        assert current is ctx
        found.append((ctx.call_id, ctx.step_id))
        return "here"

    @tool
    async def later(ctx: ToolContext[int], n: int) -> int:
        """Async, with a string annotation."""
        return ctx.deps + n

    assert later.takes_context
    assert where.takes_context
    assert set(later.parameters["properties"]) == {"n"}
    model = ScriptedModel([[("where", {}), ("later", {"n": 1})], "done"])
    execution = DefaultStep("s", goal="Where?", tools=[where, later]).run_sync(model=model, deps=41)
    assert [c.result for c in execution.tool_calls] == ["here", 42]
    assert found == [("call_1", "s")]


def test_a_tool_context_that_is_not_first_is_a_definition_error() -> None:
    from minions import ToolDefinitionError

    def late(n: int, ctx: ToolContext[Deps]) -> int:
        return n

    with pytest.raises(
        ToolDefinitionError, match="its ToolContext parameter 'ctx' must be the first one"
    ):
        tool(late)


# -- validators ------------------------------------------------------------------------------


def test_a_validator_re_asks_with_its_message_and_the_reask_is_a_decision() -> None:
    events: list[Event] = []
    model = ScriptedModel(
        ['{"merchant": "A", "amount_eur": -5}', '{"merchant": "A", "amount_eur": 5}']
    )
    step = DefaultStep("s", goal="Categorise.", output=Expense, validators=[not_negative])
    execution = step.run_sync(model=model, listeners=[events.append])
    assert execution.result() == Expense(merchant="A", amount_eur=5)
    assert model.requests[1].messages[-1].content == (
        "Your answer was rejected: amount_eur cannot be negative"
    )
    assert len(model.requests[1].messages) == 2  # transactional: the rejected answer is gone
    assert [(d.link, d.kind, d.reason) for d in execution.decisions] == [
        ("validator:not_negative", "reask", "amount_eur cannot be negative"),
        ("structured_output", "complete", "structured output (text)"),
    ]
    decided = [(e.link, e.decision) for e in events if isinstance(e, CompletionDecided)]
    assert decided == [("validator:not_negative", "reask"), ("structured_output", "complete")]


def test_validators_change_the_output_run_in_order_may_be_async_and_use_reask() -> None:
    async def rounded(expense: Expense) -> Expense:
        return expense.model_copy(update={"amount_eur": round(expense.amount_eur)})

    def known(expense: Expense) -> Expense:
        if expense.merchant != "ACME":
            raise Reask("merchant must be ACME", reason="unknown merchant")
        return expense

    model = ScriptedModel(
        ['{"merchant": "B", "amount_eur": 1.4}', '{"merchant": "ACME", "amount_eur": 1.4}']
    )
    step = DefaultStep("s", goal="x", output=Expense, validators=[rounded, known])
    execution = step.run_sync(model=model)
    assert execution.output == Expense(merchant="ACME", amount_eur=1)
    assert execution.decisions[0].reason == "unknown merchant"
    assert "merchant must be ACME" in model.requests[1].messages[-1].content


def test_validator_reasks_count_in_max_output_retries() -> None:
    model = ScriptedModel(['{"merchant": "A", "amount_eur": -1}'] * 3)
    step = DefaultStep(
        "s",
        goal="x",
        output=Expense,
        validators=[not_negative],
        config=ExecutionConfig(max_output_retries=1),
    )
    execution = step.run_sync(model=model)
    assert execution.status is StepStatus.FAILED
    assert execution.error == (
        "invalid output after 2 attempts (max_output_retries=1): amount_eur cannot be negative"
    )
    assert len(model.requests) == 2


def test_a_validator_raising_something_else_fails_the_step_naming_it() -> None:
    def broken(text: str) -> str:
        raise KeyError("oops")

    model = ScriptedModel(["hello", "never"])
    execution = DefaultStep("s", goal="x", validators=[broken]).run_sync(model=model)
    assert execution.status is StepStatus.FAILED
    assert execution.error == (
        "validator 'broken' of step 's' raised KeyError: 'oops' "
        "(raise ValueError or minions.Reask to re-ask the model)"
    )
    assert [(d.link, d.kind) for d in execution.decisions] == [("validator:broken", "fail")]
    assert len(model.requests) == 1


def test_schema_reasks_from_the_provider_are_decisions_too() -> None:
    bad = ModelOutputError(
        "Your output was not JSON.", reason="no JSON in the answer", mode="json_schema"
    )
    broken_args = ModelOutputError("Bad arguments.", reason="bad tool arguments")
    model = ScriptedModel([bad, broken_args, '{"approve": false}'])
    execution = DefaultStep("s", goal="x", output=Advice).run_sync(model=model)
    assert execution.output == Advice(approve=False)
    assert [(d.link, d.kind, d.reason) for d in execution.decisions] == [
        ("structured_output", "reask", "no JSON in the answer"),
        ("model_output", "reask", "bad tool arguments"),
        ("structured_output", "complete", "structured output (text)"),
    ]


def test_a_no_output_step_answers_text_even_through_the_completion_tool() -> None:
    model = ScriptedModel([[("complete_step", {"result": {"n": 1}})]])
    execution = DefaultStep("s", goal="x", completion_tool=True).run_sync(model=model)
    assert execution.output == '{"n": 1}'


def test_run_sync_inside_an_event_loop_runs_the_step_with_its_deps() -> None:
    async def inside() -> StepExecution[str]:
        model = ScriptedModel([[("convert", {"amount": 10, "currency": "USD"})], "9 EUR"])
        return DefaultStep("s", goal="x", tools=[convert]).run_sync(
            model=model, deps=Deps({"USD": 0.9})
        )

    execution = asyncio.run(inside())
    assert execution.result() == "9 EUR"
    assert execution.tool_calls[0].result == 9.0


def test_a_function_model_sees_the_same_prompt_as_the_layered_form() -> None:
    prompts: list[Prompt] = []

    def reply(prompt: Prompt) -> str:
        prompts.append(prompt)
        return "ok"

    step = DefaultStep("s", goal="Hi {{ inputs.name }}.", system="Sys.")
    step.run_sync(model=FunctionModel(reply), inputs={"name": "Ada"})
    StepExecutor(
        step, AgentContext(model=FunctionModel(reply), inputs={"name": "Ada"})
    ).execute_sync()
    assert dataclasses.replace(prompts[0], scope="") == dataclasses.replace(prompts[1], scope="")
