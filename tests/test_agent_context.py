"""Context policy (memory="step" vs "agent"), templates over the run state, and events."""

from __future__ import annotations

from typing import Any

from agent_helpers import Recorder, model_of, numbered, run, step
from pydantic import BaseModel

from minions import AgentExecutor, AgentRecipe, DefaultStep, MessageBundle, OutputInstructions
from minions.events import event_from_json, event_to_json
from minions.testing import ScriptedModel


def chain(memory: str) -> list[DefaultStep]:
    return [
        step("a", "alpha output", goal="Goal A, long enough to matter " * 5, memory=memory),
        step("b", "beta output", goal="Goal B.", depends_on=["a"], memory=memory),
        step("c", "gamma output", goal="Goal C.", depends_on=["b"], memory=memory),
    ]


async def test_step_memory_sees_only_its_goal_and_direct_dependencies() -> None:
    steps = chain("step")
    result = await run(steps)
    assert result.ok
    [request] = model_of(steps[2]).requests
    prompt = str(request)
    assert "Goal C." in prompt
    assert "[b]\nbeta output" in prompt
    assert "alpha output" not in prompt  # not a direct dependency
    assert "Goal A" not in prompt
    assert "Goal B." not in prompt
    assert "{{" not in prompt


async def test_agent_memory_shares_one_conversation() -> None:
    steps = chain("agent")
    result = await run(steps)
    assert result.ok
    prompt = str(model_of(steps[2]).requests[0])
    for text in ("Goal A", "alpha output", "Goal B.", "beta output", "Goal C."):
        assert text in prompt


async def test_step_memory_uses_fewer_prompt_tokens_and_usage_shows_it() -> None:
    by_step = await run(chain("step"))
    by_agent = await run(chain("agent"))
    assert by_step.usage.prompt_tokens < by_agent.usage.prompt_tokens
    assert by_step.step("c").usage.prompt_tokens < by_agent.step("c").usage.prompt_tokens
    assert by_step.usage.total_tokens == sum(e.usage.total_tokens for e in by_step.executions)


class Plan(BaseModel):
    topics: list[str]
    owner: str


async def test_templates_read_inputs_outputs_and_structured_fields() -> None:
    plan = DefaultStep(
        "plan",
        "Plan a report on {{ inputs.subject }}.",
        output=OutputInstructions(Plan),
        model=ScriptedModel(['{"topics": ["bees", "wasps"], "owner": "Ada"}']),
    )
    write = step(
        "write",
        goal="Write about {{ plan.output.topics }} for {{ plan.output.owner }}.",
        depends_on=["plan"],
    )
    result = await run([plan, write], inputs={"subject": "insects"})
    assert result.ok
    assert "Plan a report on insects." in str(model_of(plan).requests[0])
    prompt = str(model_of(write).requests[0])
    assert "Write about " in prompt
    assert "for Ada." in prompt
    assert "bees" in prompt
    assert "wasps" in prompt
    assert result.state["plan"]["output"] == {"topics": ["bees", "wasps"], "owner": "Ada"}


async def test_a_missing_template_value_fails_the_step_naming_the_expression() -> None:
    write = step("write", goal="Use {{ inputs.missing_thing }} now.")
    result = await run([write], inputs={"other": 1})
    assert not result.ok
    error = result.step("write").error or ""
    assert "{{ inputs.missing_thing }}" in error
    assert model_of(write).requests == []  # no literal {{...}} ever reaches a model


async def test_events_carry_run_id_step_id_sequence_and_round_trip_as_json() -> None:
    recorder = Recorder()
    steps = [step("a"), step("b"), step("c", depends_on=["a", "b"])]
    result = await run(steps, recorder=recorder)
    events = recorder.events
    assert numbered(events)
    assert {e.run_id for e in events} == {result.run_id}
    assert events[0].kind == "run_started"
    assert events[-1].kind == "run_completed"
    assert all(e.timestamp > 0 for e in events)
    step_events = [e for e in events if e.kind.startswith("step_")]
    assert {e.step_id for e in step_events} == {"a", "b", "c"}
    for event in events:
        again = event_from_json(event_to_json(event))
        assert again == event


async def test_stream_matches_the_listener_view() -> None:
    steps = [step("a"), step("b", depends_on=["a"])]
    recipe = AgentRecipe(id="s", steps=steps)
    streamed: list[Any] = []
    stream = AgentExecutor().stream(recipe)
    async for event in stream:
        streamed.append(event)
    assert stream.result is not None
    assert stream.result.ok
    assert [e.seq for e in streamed] == sorted(e.seq for e in streamed)
    assert streamed[-1].kind == "run_completed"
    assert [e.step_id for e in streamed if e.kind == "step_completed"] == ["a", "b"]


async def test_system_prompts_are_templated_too() -> None:
    s = DefaultStep(
        "s",
        MessageBundle(system="You write for {{ inputs.audience }}.", goal="Go."),
        model=ScriptedModel(["ok"]),
    )
    result = await run([s], inputs={"audience": "children"})
    assert result.ok
    assert "You write for children." in str(model_of(s).requests[0])


async def test_an_output_quoted_by_the_goal_is_not_shown_twice() -> None:
    plan = DefaultStep(
        "plan",
        "Plan.",
        output=OutputInstructions(Plan),
        model=ScriptedModel(['{"topics": ["bees"], "owner": "Ada"}']),
    )
    note = step("note", "NOTE TEXT")
    whole = step("whole", goal="Rewrite: {{ note.output }}", depends_on=["note", "plan"])
    part = step("part", goal="Owner: {{ plan.output.owner }}", depends_on=["plan"])
    result = await run([plan, note, whole, part])
    assert result.ok
    prompt = str(model_of(whole).requests[0])
    assert prompt.count("NOTE TEXT") == 1  # quoted by the goal, not listed again
    assert "[plan]" in prompt  # a dependency the goal does not quote is still listed
    partial = str(model_of(part).requests[0])
    assert "[plan]" in partial  # only a field is quoted: the whole output is still there
    assert "Owner: Ada" in partial


async def test_templates_read_nested_models_and_tuples_in_outputs() -> None:
    from minions import ToolStep, tool

    @tool(run_in_thread=False)
    def plans() -> tuple[Plan, ...]:
        """Two plans."""
        return (Plan(topics=["bees"], owner="Ada"), Plan(topics=["ants"], owner="Bo"))

    use = step(
        "use",
        goal="First owner {{ plans.output[0].owner }} of {{ length(plans.output) }}.",
        depends_on=["plans"],
    )
    recipe = AgentRecipe(id="nested", steps=[ToolStep("plans", "plans"), use], tools=[plans])
    result = await AgentExecutor().execute(recipe)
    assert result.ok, result.error
    assert "First owner Ada of 2." in str(model_of(use).requests[0])
