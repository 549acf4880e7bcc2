"""Content capture: the model call events carry the request and the answer only when asked."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conftest import FAST, add

from minions import (
    AgentContext,
    AgentExecutor,
    DefaultStep,
    MessageBundle,
    RunSettings,
    StepExecutor,
    tool,
)
from minions import events as ev
from minions._step.capture import MESSAGE_CHARS, TOTAL_CHARS
from minions._tracing.tracer import CAPTURE_ENV
from minions.testing import ScriptedModel


def run(
    model: ScriptedModel, *, capture: bool | None, goal: str = "Add 1 and 2.", tools: Any = (add,)
) -> list[ev.Event]:
    events: list[ev.Event] = []
    context = AgentContext(
        model=model,
        tools=list(tools),
        config=FAST,
        listeners=[events.append],
        settings=RunSettings(capture_content=capture),
    )
    names = set(context.tools.names)
    bundle = MessageBundle(system="Be brief.", goal=goal)
    asyncio.run(StepExecutor(DefaultStep("s", bundle, tools=names), context).execute())
    return events


def started(events: list[ev.Event]) -> list[ev.ModelCallStarted]:
    return [e for e in events if isinstance(e, ev.ModelCallStarted)]


def completed(events: list[ev.Event]) -> list[ev.ModelCallCompleted]:
    return [e for e in events if isinstance(e, ev.ModelCallCompleted)]


def test_with_capture_on_the_events_carry_the_request_and_the_answer() -> None:
    events = run(ScriptedModel([[("add", {"a": 1, "b": 2})], "It is 3."]), capture=True)
    first, second = started(events)
    assert [m.role for m in first.messages] == ["system", "user"]
    assert first.messages[-1].text == "Add 1 and 2."
    # The second turn's request holds the tool call asked for and its result, as text.
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "tool"]
    asked, answered = second.messages[2:]
    assert '→ add({"a": 1, "b": 2})' in asked.text
    assert answered.text.startswith("[add ")
    assert answered.text.endswith("\n3")
    assert second.messages_omitted == 0
    assert [c.answer for c in completed(events)] == ["", "It is 3."]
    assert completed(events)[0].tool_calls == ("add",)
    for event in events:  # and they round-trip as stored
        assert ev.event_from_json(ev.event_to_json(event)) == event


def test_with_capture_off_the_events_carry_no_content(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CAPTURE_ENV, "true")  # an explicit False wins over the environment
    events = run(ScriptedModel([[("add", {"a": 1, "b": 2})], "It is 3."]), capture=False)
    assert [e.messages for e in started(events)] == [(), ()]
    assert [e.answer for e in completed(events)] == [None, None]
    assert "Add 1 and 2." not in "".join(ev.event_to_json(e) for e in events)


def test_capture_follows_the_environment_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CAPTURE_ENV, raising=False)
    assert RunSettings().capture_content is False
    monkeypatch.setenv(CAPTURE_ENV, "true")
    assert RunSettings().capture_content is True
    assert RunSettings(capture_content=False).capture_content is False
    monkeypatch.setenv(CAPTURE_ENV, "SPAN_ONLY")  # the tracer's value turns it on too
    assert started(run(ScriptedModel(["3"]), capture=None, tools=()))[0].messages
    monkeypatch.setenv(CAPTURE_ENV, "false")
    assert started(run(ScriptedModel(["3"]), capture=None, tools=()))[0].messages == ()
    # The executor's switch for spans turns it on for events too.
    assert AgentExecutor(capture_message_content=True).settings.capture_content is True


def test_captured_content_is_bounded_and_says_where_it_was_cut() -> None:
    long_goal = "x" * (3 * MESSAGE_CHARS)
    events = run(ScriptedModel(["y" * (2 * MESSAGE_CHARS)]), capture=True, goal=long_goal, tools=())
    (call,) = started(events)
    goal = call.messages[-1].text
    assert goal.startswith("x" * MESSAGE_CHARS)
    assert len(goal) < MESSAGE_CHARS + 100
    assert f"[cut: {2 * MESSAGE_CHARS:,} more characters not kept]" in goal
    (answer,) = completed(events)
    assert answer.answer is not None
    assert len(answer.answer) < MESSAGE_CHARS + 100
    assert "more characters not kept" in answer.answer


def test_a_long_tool_loop_keeps_the_instructions_and_the_newest_messages() -> None:
    @tool
    def page(n: int) -> str:
        """A long page."""
        return f"page {n} " + "z" * (MESSAGE_CHARS - 10)

    turns: list[Any] = [[("page", {"n": n})] for n in range(6)]
    events = run(ScriptedModel([*turns, "done"]), capture=True, tools=[page])
    last = started(events)[-1]
    texts = [m.text for m in last.messages]
    assert sum(len(t) for t in texts) <= TOTAL_CHARS + 100
    assert last.messages[0].role == "system"
    assert texts[-1].startswith("[page ")
    assert "page 5 " in texts[-1]
    assert last.messages_omitted > 0
    assert len(last.messages) + last.messages_omitted == 2 + 2 * 6


def test_captured_content_hides_url_credentials() -> None:
    goal = "Fetch https://bob:hunter2@example.com/x?api_key=s3cret please."
    events = run(ScriptedModel(["ok"]), capture=True, goal=goal, tools=())
    text = started(events)[0].messages[-1].text
    assert "hunter2" not in text
    assert "s3cret" not in text
    assert "example.com/x" in text


def test_events_stored_before_content_capture_still_load() -> None:
    stored = {"kind": "model_call_started", "run_id": "r", "step_id": "s", "seq": 3, "turn": 1}
    event = ev.event_from_json(json.dumps(stored))
    assert isinstance(event, ev.ModelCallStarted)
    assert event.messages == ()
    assert event.messages_omitted == 0
    done = ev.event_from_json(json.dumps({**stored, "kind": "model_call_completed"}))
    assert isinstance(done, ev.ModelCallCompleted)
    assert done.answer is None
