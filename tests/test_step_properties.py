"""Property test: random transient errors, invalid outputs and tool failures in scripted runs.

For every run: the memory invariant holds, no failed attempt leaves a trace in the conversation
except one note per re-asked turn, usage is the sum of every attempt, and the status is
terminal.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from conftest import assert_tool_invariant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from minions import (
    AgentContext,
    DefaultStep,
    ExecutionConfig,
    Message,
    ModelCallResponse,
    ModelOutputError,
    OutputInstructions,
    Prompt,
    StepExecutor,
    StepStatus,
    ToolCall,
    TransientModelError,
    Usage,
    tool,
)
from minions.testing import FunctionModel

FAILURES = ["transient", "timeout", "bad_json", "bad_output"]


class Sum(BaseModel):
    total: int


@dataclass
class Turn:
    failures: list[str]
    tool_failures: list[int] | None  # None: the final answer


@dataclass
class Planned:
    turns: list[Turn]
    handed_out: list[Usage] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def outcomes(self) -> list[tuple[str, Any]]:
        plan: list[tuple[str, Any]] = []
        for turn in self.turns:
            plan.extend((f, None) for f in turn.failures)
            plan.append(("ok", turn.tool_failures))
        return plan


turns = st.lists(
    st.builds(
        Turn,
        failures=st.lists(st.sampled_from(FAILURES), max_size=4),
        tool_failures=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    ),
    max_size=3,
)
final = st.builds(
    Turn, failures=st.lists(st.sampled_from(FAILURES), max_size=4), tool_failures=st.none()
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    early=turns,
    last=final,
    model_retries=st.integers(0, 3),
    output_retries=st.integers(0, 3),
    sequential=st.booleans(),
)
def test_random_failures_keep_every_invariant(
    early: list[Turn], last: Turn, model_retries: int, output_retries: int, sequential: bool
) -> None:
    planned = Planned([*early, last])
    outcomes = iter(planned.outcomes())
    failed_so_far: Counter[str] = Counter()

    @tool
    async def work(token: str, fail: int) -> str:
        """Fail `fail` times for this token, then succeed."""
        failed_so_far[token] += 1
        if failed_so_far[token] <= fail:
            raise RuntimeError(f"failure {failed_so_far[token]} of {token}")
        return f"done {token}"

    def reply(prompt: Prompt) -> ModelCallResponse:
        kind, tool_failures = next(outcomes)
        if kind == "transient":
            planned.handed_out.append(Usage(calls=1))
            raise TransientModelError("HTTP 503", status_code=503)
        if kind == "timeout":
            planned.handed_out.append(Usage(calls=1, unknown_calls=1))
            raise TimeoutError
        if kind == "bad_json":
            usage = Usage.of_call(7, 3)
            planned.handed_out.append(usage)
            raise ModelOutputError("Your tool arguments were not valid JSON.", usage=usage)
        usage = Usage.of_call(10, 2)
        planned.handed_out.append(usage)
        if kind == "bad_output":
            return ModelCallResponse(message=Message.assistant('{"total": "BAD"}'), usage=usage)
        if tool_failures is None:
            return ModelCallResponse(message=Message.assistant('{"total": 1}'), usage=usage)
        calls = [
            ToolCall(
                id=f"c{next(planned.ids)}",
                name="work",
                arguments={"token": f"t{next(planned.ids)}", "fail": f},
            )
            for f in tool_failures
        ]
        return ModelCallResponse(message=Message.assistant("", calls), usage=usage)

    config = ExecutionConfig(
        max_model_retries=model_retries,
        max_output_retries=output_retries,
        sequential_tool_calls=sequential,
        retry_initial_delay=0,
        tool_retry_initial_delay=0,
    )
    context = AgentContext(model=FunctionModel(reply), tools=[work], config=config)
    step = DefaultStep("s", "Do the work.", tools={"work"}, output=OutputInstructions(Sum))
    execution = asyncio.run(StepExecutor(step, context).execute())

    assert execution.status in (StepStatus.COMPLETED, StepStatus.FAILED)
    messages = execution.messages
    assert_tool_invariant(messages)
    assert messages[0] == Message.user("Do the work.")
    assert all("BAD" not in m.content for m in messages), "a rejected answer stayed"
    # Between two answers there is at most one note: retries never grow the conversation.
    notes_in_a_row = 0
    for message in messages[1:]:
        notes_in_a_row = notes_in_a_row + 1 if message.role == "user" else 0
        assert notes_in_a_row <= 1
    assert execution.usage == Usage.total(planned.handed_out)
    assert execution.usage == Usage.total([c.usage for c in execution.model_calls])
    assert context.usage == execution.usage
    if execution.status is StepStatus.COMPLETED:
        assert execution.output == Sum(total=1)
        assert messages[-1] == Message.assistant('{"total": 1}')
        assert next(outcomes, None) is None
    else:
        assert execution.error
