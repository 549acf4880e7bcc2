"""The structured-output ladder over HTTP: each rung, the fall-through from a 400, the memory
per (base URL, model), the mode on each call, tools next to structured output, and re-asks
through the step loop (one retry boundary)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import structlog
from pydantic import BaseModel, Field

from minions import (
    AgentContext,
    DefaultStep,
    MessageBundle,
    OutputInstructions,
    StepExecution,
    StepExecutor,
    StepStatus,
    tool,
)
from minions import events as ev
from minions.events import EventListener
from minions.models import CapabilityMemory, OpenAIChatModel
from minions.testing import FakeOpenAIServer, FakeReply

from .conftest import FAST


class Sum(BaseModel):
    """The sum of the numbers.

    Args:
        total: the sum.
    """

    total: int


SUM_SCHEMA = {
    "title": "Total",
    "type": "object",
    "properties": {"total": {"type": "integer"}},
    "required": ["total"],
}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def sum_step(output: Any = Sum, **options: Any) -> DefaultStep:
    return DefaultStep(
        "sum",
        MessageBundle(system="You add numbers.", goal="What is 2+3?"),
        output=OutputInstructions(output),
        **options,
    )


async def run(
    model: OpenAIChatModel,
    step: DefaultStep | None = None,
    *,
    listeners: Sequence[EventListener] = (),
) -> StepExecution:
    context = AgentContext(model=model, tools=[add], config=FAST, listeners=listeners)
    return await StepExecutor(step or sum_step(), context).execute()


async def test_json_schema_rung() -> None:
    async with FakeOpenAIServer([FakeReply.structured(Sum(total=5))]) as server:
        model = server.model()
        execution = await run(model)
        (request,) = server.chat_requests

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert execution.output == Sum(total=5)
    fmt = request.response_format
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "Sum"
    assert fmt["json_schema"]["schema"] == Sum.model_json_schema()
    assert "tools" not in request.body
    assert execution.model_calls[0].output_mode == "json_schema"
    assert model.output_mode == "json_schema"


async def test_the_json_schema_rung_tells_the_model_what_the_fields_mean() -> None:
    # A server enforcing the schema with a grammar never shows it: the fields' meaning is in
    # the prompt too, once, in the system message.
    class Verdict(BaseModel):
        ok: bool = Field(description="Whether the change can ship.")
        reason: str

    async with FakeOpenAIServer([FakeReply.structured(Verdict(ok=True, reason="x"))]) as server:
        execution = await run(server.model(), sum_step(Verdict))
        (request,) = server.chat_requests
    assert execution.output == Verdict(ok=True, reason="x")
    assert request.response_format is not None
    assert request.messages[0]["content"] == (
        "You add numbers.\n\nThe fields of your answer:\n- ok: Whether the change can ship."
    )


async def test_a_schema_without_descriptions_adds_nothing_to_the_prompt() -> None:
    async with FakeOpenAIServer([FakeReply.structured({"n": 5})]) as server:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        await run(server.model(), sum_step(schema))
        (request,) = server.chat_requests
    assert request.messages[0]["content"] == "You add numbers."


async def test_tool_rung_forces_the_output_tool() -> None:
    async with FakeOpenAIServer([FakeReply.structured(Sum(total=5))]) as server:
        model = server.model(output_modes=("tool",))
        execution = await run(model)
        (request,) = server.chat_requests

    assert execution.output == Sum(total=5)
    assert request.tools == ["Sum"]
    # The output tool is the only one: "required" forces it, and is what llama.cpp honours.
    assert request.tool_choice == "required"
    assert request.forced_tool == "Sum"
    # instructor shaped the tool: the docstring describes it, and each field from its `Args:`.
    function = request.body["tools"][0]["function"]
    assert function["description"].startswith("The sum of the numbers.")
    assert function["parameters"]["properties"]["total"]["description"] == "the sum."
    assert execution.model_calls[0].output_mode == "tool"
    # The output tool call is answered, so the conversation keeps its invariant.
    assert [m.role for m in execution.messages] == ["system", "user", "assistant", "tool"]


async def test_when_instructor_cannot_shape_the_request_its_json_schema_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import instructor.v2

    class MovedRegistry:
        def get_handlers(self, *args: Any) -> Any:
            raise KeyError("no handlers for (openai, tools)")

    monkeypatch.setattr(instructor.v2, "mode_registry", MovedRegistry())
    with structlog.testing.capture_logs() as logs:
        async with FakeOpenAIServer([FakeReply.structured(Sum(total=5))] * 2) as server:
            models = [server.model(output_modes=(m,)) for m in ("json_schema", "tool")]
            results = [await run(model) for model in models]
            native, forced = server.chat_requests

    assert [r.output for r in results] == [Sum(total=5)] * 2
    assert [r.model_calls[0].output_mode for r in results] == ["json_schema", "tool"]
    schema = Sum.model_json_schema()
    assert native.response_format["json_schema"] == {"name": "Sum", "schema": schema}
    function = forced.body["tools"][0]["function"]
    assert function["description"] == "Give your final answer by calling this tool."
    assert function["parameters"] == schema
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert {entry["mode"] for entry in warnings} == {"json_schema", "tool"}
    for warning in warnings:
        assert warning["event"].startswith("instructor could not shape the request")
        assert warning["output_type"] == "Sum"
        assert warning["error"].startswith("KeyError")


async def test_prompted_json_rung_reads_json_in_prose_and_fences() -> None:
    async with FakeOpenAIServer([FakeReply.json_in_prose({"total": 5})]) as server:
        execution = await run(server.model(output_modes=("prompted_json",)))
        (request,) = server.chat_requests

    assert execution.output == Sum(total=5)
    system = request.messages[0]
    assert system["role"] == "system"
    assert system["content"].startswith("You add numbers.\n\n")
    assert "Reply with only a JSON object" in system["content"]
    assert '"required":["total"]' in system["content"]
    assert "response_format" not in request.body
    assert "tools" not in request.body
    assert execution.model_calls[0].output_mode == "prompted_json"
    # The schema is not kept in the conversation: it is added per request.
    assert "JSON Schema" not in execution.messages[0].content


async def test_prompted_json_repairs_trivially_broken_json() -> None:
    async with FakeOpenAIServer(['Answer: {"total": 5,']) as server:
        execution = await run(server.model(output_modes=("prompted_json",)))
    assert execution.output == Sum(total=5)


async def test_fall_through_from_400_and_memory_per_endpoint_and_model() -> None:
    replies = [FakeReply.structured(Sum(total=5), prose=True)] * 3
    async with FakeOpenAIServer(
        replies, models=("small", "other"), reject={"response_format", "tool_choice"}
    ) as server:
        model = server.model("small")
        first = await run(model)
        rungs = [(r.response_format is not None, r.tool_choice) for r in server.chat_requests]
        second = await run(model)
        after_second = len(server.chat_requests)
        # Another model on the same endpoint learns for itself.
        other = await run(server.model("other"))
        other_requests = server.chat_requests[after_second:]

    assert first.output == second.output == other.output == Sum(total=5)
    # json_schema refused (400), tool refused (400), prompted JSON answered: one model call.
    assert rungs == [
        (True, None),
        (False, "required"),
        (False, None),
    ]
    assert len(first.model_calls) == 1
    assert first.model_calls[0].output_mode == "prompted_json"
    # The refused rungs left nothing in the conversation, and the schema is not kept in it.
    assert [m.role for m in first.messages] == ["system", "user", "assistant"]
    assert first.messages[0].content == "You add numbers."
    assert first.usage.calls == 1
    # Remembered for (base URL, model): the second step goes straight to the rung that works.
    assert after_second == 4
    assert model.output_mode == "prompted_json"
    assert model.rejected == {"json_schema", "tool"}
    assert len(other_requests) == 3


async def test_a_400_on_the_last_rung_fails_the_step() -> None:
    async with FakeOpenAIServer(["never"], reject={"response_format"}) as server:
        execution = await run(server.model(output_modes=("json_schema",)))
    assert execution.status is StepStatus.FAILED
    assert execution.error is not None
    assert "HTTP 400" in execution.error
    assert "response_format" in execution.error


async def test_a_400_on_the_prompted_json_rung_fails_the_step_with_the_servers_message() -> None:
    async with FakeOpenAIServer(
        [FakeReply.failure(400, "Prompt contains a forbidden word.")]
    ) as server:
        execution = await run(server.model(output_modes=("prompted_json",)))
    assert execution.status is StepStatus.FAILED
    assert execution.error is not None
    assert "HTTP 400" in execution.error
    assert "Prompt contains a forbidden word." in execution.error


async def test_unrelated_400_does_not_move_down_the_ladder() -> None:
    async with FakeOpenAIServer(
        [FakeReply.failure(400, "Maximum context length exceeded."), "never"]
    ) as server:
        model = server.model()
        execution = await run(model)
        assert len(server.chat_requests) == 1
    assert execution.status is StepStatus.FAILED
    assert model.rejected == frozenset()


ROLE_ERROR = "messages with role 'tool' must be a response to a preceding 'tool_calls'."


@pytest.mark.parametrize(
    ("refusal", "refused"),
    [
        # The parameter a 400 names decides, whatever words its message holds.
        (FakeReply.failure(400, ROLE_ERROR, param="messages.[2].role"), False),
        (FakeReply.failure(400, "Invalid value: 'required'.", param="tool_choice"), True),
        (FakeReply.failure(400, "Invalid schema for function 'Sum'.", param="tools[0]"), True),
        # Without a parameter, the message's words do (Ollama names none).
        (FakeReply.failure(400, "llama3.2:1b does not support tools"), True),
    ],
)
async def test_a_400_refuses_a_rung_by_its_param_else_by_its_words(
    refusal: FakeReply, refused: bool
) -> None:
    async with FakeOpenAIServer([refusal, FakeReply.json_in_prose({"total": 5})]) as server:
        model = server.model(output_modes=("tool", "prompted_json"))
        execution = await run(model)
        requests = len(server.chat_requests)

    if refused:
        assert execution.output == Sum(total=5)
        assert execution.model_calls[0].output_mode == "prompted_json"
        assert (requests, model.rejected) == (2, frozenset({"tool"}))
    else:
        assert execution.status is StepStatus.FAILED
        assert execution.error is not None
        assert "HTTP 400" in execution.error
        assert (requests, model.rejected) == (1, frozenset())


async def test_raw_json_schema_output_in_each_rung() -> None:
    replies = [FakeReply.structured({"total": 5})] * 2 + [FakeReply.json_in_prose({"total": 5})]
    async with FakeOpenAIServer(replies) as server:
        results = [
            await run(server.model(output_modes=(mode,)), sum_step(SUM_SCHEMA))
            for mode in ("json_schema", "tool", "prompted_json")
        ]
        requests = server.chat_requests
    assert [r.output for r in results] == [{"total": 5}] * 3
    assert requests[0].response_format["json_schema"]["name"] == "Total"
    assert requests[1].tools == ["Total"]


async def test_invalid_output_is_reasked_once_through_the_step_loop() -> None:
    events: list[Any] = []
    async with FakeOpenAIServer(
        [FakeReply.structured({"total": "many"}), FakeReply.structured(Sum(total=5))]
    ) as server:
        context = AgentContext(model=server.model(), config=FAST, listeners=[events.append])
        execution = await StepExecutor(sum_step(), context).execute()
        first, second = server.chat_requests

    assert execution.output == Sum(total=5)
    # One retry boundary: two HTTP requests, two model calls, no retry inside instructor.
    assert len(execution.model_calls) == 2
    assert execution.model_calls[0].error is not None
    assert "total" in execution.model_calls[0].error
    # Both record their mode, the failed one too, as do their events.
    assert [c.output_mode for c in execution.model_calls] == ["json_schema", "json_schema"]
    ended = [e for e in events if e.kind in ("model_call_failed", "model_call_completed")]
    assert [(e.kind, e.output_mode) for e in ended] == [
        ("model_call_failed", "json_schema"),
        ("model_call_completed", "json_schema"),
    ]
    # The re-ask is the original prompt plus one note (joined to the goal: no two user messages
    # in a row), not the failed answer.
    assert second.messages[:-1] == first.messages[:-1]
    goal, note = second.messages[-1]["content"].split("\n\n", 1)
    assert (second.messages[-1]["role"], goal) == ("user", first.messages[-1]["content"])
    assert "did not match the required schema" in note
    assert all(m["role"] != "assistant" for m in second.messages)
    assert [m.role for m in execution.messages] == ["system", "user", "user", "assistant"]
    assert execution.usage.calls == 2


async def test_one_answer_ignoring_json_schema_is_reasked_in_json_schema() -> None:
    # One prose answer is a retry, not a verdict on the endpoint.
    events: list[ev.Event] = []
    async with FakeOpenAIServer(
        ["The total is five.", FakeReply.structured(Sum(total=5))]
    ) as server:
        model = server.model()
        execution = await run(model, listeners=[events.append])
        first, second = server.chat_requests

    assert execution.output == Sum(total=5)
    assert first.response_format is not None
    assert second.response_format is not None
    assert model.rejected == frozenset()
    assert model.output_mode == "json_schema"
    # The note tells the model the schema it never saw.
    assert '"total"' in second.messages[-1]["content"]
    assert not [e for e in events if isinstance(e, ev.OutputModeDemoted)]


async def test_json_schema_ignored_twice_in_a_row_moves_down_the_ladder() -> None:
    events: list[ev.Event] = []
    async with FakeOpenAIServer(
        ["The total is five.", "Five, I said.", FakeReply.structured(Sum(total=5))]
    ) as server:
        model = server.model()
        execution = await run(model, listeners=[events.append])
        first, second, third = server.chat_requests

    assert execution.output == Sum(total=5)
    assert first.response_format is not None
    assert second.response_format is not None
    assert third.forced_tool == "Sum"
    assert "json_schema" in model.rejected
    assert execution.model_calls[-1].output_mode == "tool"
    [demoted] = [e for e in events if isinstance(e, ev.OutputModeDemoted)]
    assert (demoted.mode, demoted.model, demoted.step_id) == ("json_schema", model.name, "sum")
    assert demoted.reason == "2 answers in a row ignored it"
    assert demoted.base_url == model.base_url


async def test_ignored_answers_demote_only_in_a_row() -> None:
    # A valid answer in the mode starts the count again: two prose answers, each followed by a
    # valid one (two steps), demote nothing.
    prose, valid = "The total is five.", FakeReply.structured(Sum(total=5))
    events: list[ev.Event] = []
    async with FakeOpenAIServer([prose, valid, prose, valid]) as server:
        model = server.model()
        executions = [await run(model, listeners=[events.append]) for _ in range(2)]
        requests = server.chat_requests

    assert [e.output for e in executions] == [Sum(total=5)] * 2
    assert [r.response_format is not None for r in requests] == [True] * 4
    assert model.rejected == frozenset()
    assert not [e for e in events if isinstance(e, ev.OutputModeDemoted)]


@pytest.mark.parametrize("demote_after", [1, 3])
async def test_how_many_ignored_answers_demote_is_the_memorys_to_say(demote_after: int) -> None:
    events: list[ev.Event] = []
    replies: list[Any] = [*["Five."] * demote_after, FakeReply.structured(Sum(total=5))]
    config = replace(FAST, max_output_retries=demote_after)
    async with FakeOpenAIServer(replies) as server:
        model = server.model(capabilities=CapabilityMemory(demote_after=demote_after))
        context = AgentContext(model=model, config=config, listeners=[events.append])
        execution = await StepExecutor(sum_step(), context).execute()
        requests = server.chat_requests

    assert execution.output == Sum(total=5), execution.error
    assert [r.response_format is not None for r in requests] == [True] * demote_after + [False]
    assert requests[-1].forced_tool == "Sum"
    [demoted] = [e for e in events if isinstance(e, ev.OutputModeDemoted)]
    assert demoted.reason == f"{demote_after} answers in a row ignored it"


@pytest.mark.parametrize("demote_after", [0, -1, True, 1.5])
def test_a_memory_demotes_after_one_answer_at_least(demote_after: Any) -> None:
    with pytest.raises(ValueError, match="demote_after"):
        CapabilityMemory(demote_after=demote_after)


async def test_a_server_refusal_demotes_at_once_with_an_event() -> None:
    events: list[ev.Event] = []
    async with FakeOpenAIServer(
        [FakeReply.structured(Sum(total=5))], reject={"response_format"}
    ) as server:
        model = server.model()
        execution = await run(model, listeners=[events.append])

    assert execution.output == Sum(total=5)
    assert model.rejected == {"json_schema"}
    [demoted] = [e for e in events if isinstance(e, ev.OutputModeDemoted)]
    assert demoted.mode == "json_schema"
    assert demoted.reason.startswith("the server refused it: ")
    assert demoted.base_url == model.base_url


async def test_a_demotion_names_the_endpoint_without_its_credentials() -> None:
    events: list[ev.Event] = []
    async with FakeOpenAIServer(
        [FakeReply.structured(Sum(total=5))], reject={"response_format"}
    ) as server:
        url = server.url.replace("http://", "http://user:hunter22@", 1)
        redacted = server.url.replace("http://", "http://***@", 1)
        model = OpenAIChatModel(server.models[0], base_url=url, api_key="sk-test-key")
        with structlog.testing.capture_logs() as logs:
            execution = await run(model, listeners=[events.append])

    assert execution.output == Sum(total=5), execution.error
    [demoted] = [e for e in events if isinstance(e, ev.OutputModeDemoted)]
    assert demoted.base_url == redacted
    # Logged by the model too (where structlog is configured), with the same fields.
    [logged] = [log for log in logs if log["event"] == "output mode demoted"]
    assert (logged["base_url"], logged["mode"]) == (redacted, "json_schema")
    assert "hunter22" not in repr(events) + repr(logs)


async def test_what_a_model_learns_is_its_own_unless_it_shares_a_memory() -> None:
    async with FakeOpenAIServer(
        [FakeReply.structured(Sum(total=5))] * 3, reject={"response_format"}
    ) as server:
        learner, stranger = server.model(), server.model()
        await run(learner)
        assert learner.rejected == {"json_schema"}
        assert stranger.rejected == frozenset()  # same endpoint, a model of its own
        shared = CapabilityMemory()
        one = server.model(capabilities=shared)
        other = server.model(capabilities=shared)
        await run(one)
        assert other.rejected == {"json_schema"}
        await run(other)
        [*_, last] = server.chat_requests
    assert last.response_format is None  # `other` skipped the rung `one` saw refused


async def test_tools_and_structured_output_offer_the_output_tool_beside_the_tools() -> None:
    async with FakeOpenAIServer([[("add", {"a": 2, "b": 3})], [("Sum", {"total": 5})]]) as server:
        execution = await run(server.model(), sum_step(tools={"add"}))
        first, second = server.chat_requests

    assert execution.status is StepStatus.COMPLETED, execution.error
    assert execution.output == Sum(total=5)
    assert first.tools == ["add", "Sum"]
    assert first.tool_choice == "required"
    assert first.response_format is None  # Native JSON would forbid the tool calls.
    assert [c.output_mode for c in execution.model_calls] == [None, "tool"]
    assert [c.name for c in execution.tool_calls] == ["add"]
    assert second.messages[-1] == {
        "role": "tool",
        "tool_call_id": second.messages[-2]["tool_calls"][0]["id"],
        "content": "5",
    }


async def test_tools_and_structured_output_fall_back_to_prompted_json() -> None:
    async with FakeOpenAIServer(
        [[("add", {"a": 2, "b": 3})], FakeReply.json_in_prose({"total": 5})],
        reject={"tool_choice"},
    ) as server:
        execution = await run(server.model(), sum_step(tools={"add"}))
        requests = server.chat_requests

    assert execution.output == Sum(total=5)
    assert [r.tools for r in requests] == [["add", "Sum"], ["add"], ["add"]]
    assert "When you have the final answer" in requests[1].messages[0]["content"]
    assert [c.output_mode for c in execution.model_calls] == [None, "prompted_json"]


async def test_text_instead_of_the_output_tool_is_salvaged_or_reasked() -> None:
    async with FakeOpenAIServer(
        ["I will not call tools.", 'Fine: {"total": 5}'],
    ) as server:
        execution = await run(server.model(output_modes=("tool",)))
        second = server.chat_requests[1]
    assert execution.output == Sum(total=5)
    assert "did not call the tool 'Sum'" in second.messages[-1]["content"]
    # The failed answer is recorded with the rung it was asked in; the second, text asked on
    # the tool rung, with the mode that read it: prompted JSON.
    assert [c.output_mode for c in execution.model_calls] == ["tool", "prompted_json"]


@pytest.mark.parametrize("mode", ["json_schema", "tool", "prompted_json"])
async def test_streaming_structured_output_in_each_rung(mode: str) -> None:
    deltas: list[str] = []

    def listen(event: Any) -> None:
        if event.kind == "token_delta":
            deltas.append(event.text)

    async with FakeOpenAIServer([FakeReply.structured(Sum(total=5))]) as server:
        model = server.model(stream=True, output_modes=(mode,))
        context = AgentContext(model=model, config=FAST, listeners=[listen])
        execution = await StepExecutor(sum_step(), context).execute()
    assert execution.output == Sum(total=5)
    assert execution.model_calls[0].output_mode == mode
    assert "".join(deltas) == ("" if mode == "tool" else '{"total":5}')


async def test_one_runs_prose_demotes_json_schema_for_that_run_only() -> None:
    """Models of several runs sharing a memory (a worker's): the run whose prompt made the
    model answer prose twice goes on without ``json_schema``; the next run asks for it again,
    until `demote_runs` runs saw it ignored."""
    prose, valid = "The total is five.", FakeReply.structured(Sum(total=5))
    config = replace(FAST, max_output_retries=2)
    shared = CapabilityMemory(demote_runs=2)
    async with FakeOpenAIServer([prose, prose, valid, valid, prose, prose, valid]) as server:
        model = server.model(capabilities=shared)
        for run_id in ("run-1", "run-2", "run-3"):
            context = AgentContext(model=model, config=config, run_id=run_id)
            execution = await StepExecutor(sum_step(), context).execute()
            assert execution.output == Sum(total=5), execution.error
            if run_id == "run-1":
                assert model.rejected == frozenset()  # the run's own lesson
        requests = server.chat_requests
    native = [r.response_format is not None for r in requests]
    assert native == [True, True, False, True, True, True, False]
    assert model.rejected == {"json_schema"}  # two runs agreed
    assert shared.evidence(model.endpoint)["json_schema"].runs == ("run-1", "run-3")
