"""The core issue's contract program, exactly as users will write it."""

import asyncio

from pydantic import BaseModel

from minions import (
    AgentContext,
    DefaultStep,
    MessageBundle,
    OutputInstructions,
    StepExecutor,
    StepStatus,
    tool,
)
from minions.testing import ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Sum(BaseModel):
    total: int


def test_contract_program() -> None:
    model = ScriptedModel(
        [
            [("add", {"a": 2, "b": 3}), ("add", {"a": 10, "b": 1})],
            '{"total": 16}',
        ]
    )
    step = DefaultStep(
        "sum",
        MessageBundle(system="You add numbers.", goal="Add 2+3 and 10+1, then the totals."),
        tools={"add"},
        output=OutputInstructions(Sum),
    )
    execution = asyncio.run(StepExecutor(step, AgentContext(model=model, tools=[add])).execute())
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == Sum(total=16)
    assert [c.response.result for c in execution.tool_calls if c.response] == [5, 11]
