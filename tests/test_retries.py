"""Transactional retries: transient errors, invalid output, usage and budgets."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from conftest import FAST, add, assert_tool_invariant
from pydantic import BaseModel

from minions import (
    AgentContext,
    DefaultStep,
    ExecutionConfig,
    ModelError,
    ModelOutputError,
    OutputInstructions,
    StepExecution,
    StepExecutor,
    StepStatus,
    TransientModelError,
    Usage,
)
from minions.events import RetryScheduled
from minions.testing import ScriptedModel


def run(
    step: DefaultStep, model: ScriptedModel, config: ExecutionConfig = FAST
) -> tuple[StepExecution, list[Any]]:
    events: list[Any] = []
    context = AgentContext(model=model, tools=[add], config=config, listeners=[events.append])
    return asyncio.run(StepExecutor(step, context).execute()), events


def contents(execution: StepExecution) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in execution.messages]


def test_transient_errors_are_retried_and_leave_no_trace() -> None:
    model = ScriptedModel(
        [
            TransientModelError("HTTP 503: overloaded", status_code=503),
            TimeoutError(),
            ConnectionError("connection reset"),
            "ok",
        ]
    )
    execution, events = run(DefaultStep("s", "Say ok."), model)
    assert execution.status is StepStatus.COMPLETED
    assert contents(execution) == [("user", "Say ok."), ("assistant", "ok")]
    assert [(c.turn, c.attempt, c.ok) for c in execution.model_calls] == [
        (1, 1, False),
        (1, 2, False),
        (1, 3, False),
        (1, 4, True),
    ]
    retries = [e for e in events if isinstance(e, RetryScheduled)]
    assert [(e.target, e.attempt) for e in retries] == [("model", 1), ("model", 2), ("model", 3)]
    assert execution.retries == 3
    # Every attempt saw the same conversation: retrying does not grow it.
    assert len({len(p.messages) for p in model.requests}) == 1


def test_retry_after_hint_is_honoured() -> None:
    model = ScriptedModel([TransientModelError("429", status_code=429, retry_after=0.01), "ok"])
    config = dataclasses.replace(FAST, retry_initial_delay=60.0)
    execution, events = run(DefaultStep("s", "x"), model, config)
    assert execution.status is StepStatus.COMPLETED
    assert [e.delay for e in events if isinstance(e, RetryScheduled)] == [0.01]


def test_retry_after_is_capped_by_the_max_delay() -> None:
    model = ScriptedModel([TransientModelError("429", retry_after=3600), "ok"])
    config = dataclasses.replace(FAST, retry_max_delay=0.01)
    _, events = run(DefaultStep("s", "x"), model, config)
    assert [e.delay for e in events if isinstance(e, RetryScheduled)] == [0.01]


def test_spent_retries_fail_the_step_with_the_last_error() -> None:
    model = ScriptedModel([TransientModelError("HTTP 500", status_code=500)] * 4)
    execution, _ = run(DefaultStep("s", "x"), model)
    assert execution.status is StepStatus.FAILED
    assert execution.error == ("model call failed after 4 attempts: HTTP 500")
    assert execution.usage == Usage(calls=4)


def test_permanent_model_errors_are_not_retried() -> None:
    model = ScriptedModel([ModelError("HTTP 401: invalid API key", status_code=401), "never"])
    execution, _ = run(DefaultStep("s", "x"), model)
    assert execution.status is StepStatus.FAILED
    assert execution.error == "HTTP 401: invalid API key"
    assert len(model.requests) == 1


def test_bad_tool_argument_json_is_reasked_with_one_short_note() -> None:
    model = ScriptedModel(
        [
            [("add", '{"a": 1, "b": ')],
            [("add", "[1, 2]")],
            [("add", '{"a": 1, "b": 2}')],
            "3",
        ]
    )
    execution, events = run(DefaultStep("s", "Add 1 and 2.", tools={"add"}), model)
    assert execution.status is StepStatus.COMPLETED
    note = "The arguments of your call to tool 'add' must be a JSON object, not list."
    assert contents(execution) == [
        ("user", "Add 1 and 2."),
        ("user", note),
        ("assistant", ""),
        ("tool", "3"),
        ("assistant", "3"),
    ]
    # The second attempt saw the first note; the third saw only the second one.
    assert (
        model.requests[1]
        .messages[-1]
        .content.startswith("The arguments of your call to tool 'add' were not valid JSON")
    )
    assert len(model.requests[2].messages) == len(model.requests[1].messages)
    assert [e.target for e in events if isinstance(e, RetryScheduled)] == ["output", "output"]
    assert_tool_invariant(execution.messages)


class Sum(BaseModel):
    total: int


def test_invalid_structured_output_is_reasked_with_its_errors() -> None:
    model = ScriptedModel(['{"total": "many"}', "no json at all", '```json\n{"total": 3}\n```'])
    step = DefaultStep("s", "Sum.", output=OutputInstructions(Sum))
    execution, _ = run(step, model)
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == Sum(total=3)
    assert model.requests[1].messages[-1].content == (
        "Your output did not match the required schema: total: Input should be a valid "
        "integer, unable to parse string as an integer."
    )
    assert model.requests[2].messages[-1].content == "Your answer did not contain a JSON object."
    assert contents(execution) == [
        ("user", "Sum."),
        ("user", "Your answer did not contain a JSON object."),
        ("assistant", '```json\n{"total": 3}\n```'),
    ]
    rejected = [c.error for c in execution.model_calls if c.error]
    assert len(rejected) == 2
    assert all(e.startswith("rejected: ") for e in rejected)


def test_output_retries_are_bounded() -> None:
    model = ScriptedModel(["nope"] * 3)
    step = DefaultStep("s", "Sum.", output=OutputInstructions(Sum))
    execution, _ = run(step, model)
    assert execution.status is StepStatus.FAILED
    assert execution.error == (
        "invalid output after 3 attempts (max_output_retries=2): "
        "Your answer did not contain a JSON object."
    )


def test_usage_counts_every_attempt() -> None:
    model = ScriptedModel(
        [
            ModelOutputError("cut off", usage=Usage.of_call(100, 50)),
            TransientModelError("503", status_code=503),
            TimeoutError(),
            "ok",
        ]
    )
    execution, _ = run(DefaultStep("s", "x"), model)
    assert execution.status is StepStatus.COMPLETED
    final = execution.model_calls[-1].usage
    assert execution.usage == Usage(
        prompt_tokens=100 + final.prompt_tokens,
        completion_tokens=50 + final.completion_tokens,
        calls=4,
        unknown_calls=1,  # the timeout: it may have cost tokens nobody reported
    )
    assert execution.usage == Usage.total([c.usage for c in execution.model_calls])
    assert not execution.usage.complete


def test_step_budget_is_checked_before_every_attempt_retries_included() -> None:
    costly = ModelOutputError("truncated", usage=Usage.of_call(80, 20))
    model = ScriptedModel([costly, costly, "never reached"])
    config = dataclasses.replace(FAST, step_token_budget=150)
    execution, _ = run(DefaultStep("s", "x"), model, config)
    assert execution.status is StepStatus.FAILED
    assert execution.error == (
        "step token budget of 150 exhausted: 200 tokens used over 2 model calls"
    )
    assert len(model.requests) == 2


def test_run_budget_spans_steps_sharing_a_context() -> None:
    config = dataclasses.replace(FAST, run_token_budget=10)
    model = ScriptedModel(["a long enough answer to use the budget", "never"])
    context = AgentContext(model=model, config=config)
    first = asyncio.run(StepExecutor(DefaultStep("one", "x"), context).execute())
    second = asyncio.run(StepExecutor(DefaultStep("two", "y"), context).execute())
    assert first.status is StepStatus.COMPLETED
    assert second.status is StepStatus.FAILED
    assert (second.error or "").startswith("run token budget of 10 exhausted")
    assert len(model.requests) == 1
