"""Short reprs of `ModelCall` and `ToolCall`: what happened, in one line; the detail stays in
the fields."""

from __future__ import annotations

from pydantic import BaseModel

from minions import (
    AgentContext,
    DefaultStep,
    ExecutionConfig,
    Message,
    ModelCall,
    ModelCallResponse,
    OutputInstructions,
    Prompt,
    StepExecutor,
    ToolCall,
    ToolCallResponse,
    TransientModelError,
    Usage,
    tool,
)
from minions.testing import ScriptedModel


@tool
def lookup(city: str) -> str:
    """Look up a city's country."""
    if city == "Atlantis":
        raise ValueError("no such city " + "x" * 500)
    return "Norway"


class Country(BaseModel):
    name: str
    capital: str


def test_a_step_s_calls_read_as_one_line_each() -> None:
    long_answer = "Oslo is in Norway, " + "a country of long coasts and many fjords " * 50
    model = ScriptedModel(
        [
            TransientModelError("HTTP 503: the server is busy", status_code=503),
            [("lookup", {"city": "Oslo"}), ("lookup", {"city": "Atlantis"})],
            long_answer,
        ]
    )
    fast = ExecutionConfig(retry_initial_delay=0, tool_retry_initial_delay=0)
    context = AgentContext(model=model, tools=[lookup], config=fast)
    step = DefaultStep("geo", "Where is Oslo?", tools={"lookup"})
    execution = StepExecutor(step, context).execute_sync()
    failed, asked, answered = execution.model_calls
    assert repr(failed) == (
        "ModelCall(step='geo', turn=1, attempt=1, model='scripted', status='failed', "
        "error='HTTP 503: the server is busy', tokens='0+0')"
    )
    assert repr(asked) == (
        "ModelCall(step='geo', turn=1, attempt=2, model='scripted', status='ok', "
        "tool_calls=['lookup', 'lookup'], tokens='8+16')"
    )
    assert repr(answered).startswith(
        "ModelCall(step='geo', turn=2, attempt=1, model='scripted', status='ok', "
        "answer='Oslo is in Norway, a "
    )
    assert "…', tokens='" in repr(answered)
    assert len(repr(answered)) < 200 < len(long_answer)
    oslo, atlantis = execution.tool_calls
    assert repr(oslo) == (
        "ToolCall(id='call_1', name='lookup', arguments={'city': 'Oslo'}, status='ok', "
        "result='Norway')"
    )
    assert repr(atlantis) == (
        "ToolCall(id='call_2', name='lookup', arguments={'city': 'Atlantis'}, status='failed', "
        """error="Tool 'lookup' failed after 3 attempts: ValueError: no such …", attempts=3)"""
    )
    assert len(repr(atlantis)) < 200


def test_structured_output_pending_calls_and_unreported_usage() -> None:
    prompt = Prompt(messages=(Message.user("Norway?"),), output=OutputInstructions(Country))
    response = ModelCallResponse(
        message=Message.assistant('{"name": "Norway", "capital": "Oslo"}'),
        output=Country(name="Norway", capital="Oslo"),
        usage=Usage.of_call(None, None),
    )
    call = ModelCall(
        step_id="s", turn=1, attempt=1, prompt=prompt, response=response, usage=response.usage
    )
    assert repr(call) == (
        "ModelCall(step='s', turn=1, attempt=1, status='ok', "
        "output=Country(name='Norway', capital='Oslo'), tokens='0+0 (not all reported)')"
    )
    pending = ToolCall(id="c1", name="lookup", arguments={"city": "x" * 200})
    assert repr(pending) == (
        "ToolCall(id='c1', name='lookup', arguments={'city': "
        "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…, status='pending')"
    )
    done = ToolCall(
        id="c1",
        name="lookup",
        response=ToolCallResponse(call_id="c1", name="lookup", result=1, content="1"),
    )
    assert repr(done) == "ToolCall(id='c1', name='lookup', arguments={}, status='ok', result='1')"
