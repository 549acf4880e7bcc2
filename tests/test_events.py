"""Typed events: order, content, serialization, listeners and structlog."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, get_args

import pytest
import structlog
from conftest import FAST, add

from minions import AgentContext, DefaultStep, StepExecutor
from minions import events as ev
from minions.testing import ScriptedModel


def run(model: ScriptedModel, listeners: list[Any]) -> None:
    context = AgentContext(model=model, tools=[add], config=FAST, listeners=listeners, run_id="r1")
    asyncio.run(StepExecutor(DefaultStep("s", "Add.", tools={"add"}), context).execute())


def test_events_of_a_step_in_order() -> None:
    events: list[Any] = []
    run(ScriptedModel([TimeoutError(), [("add", {"a": 1, "b": 2})], "three"]), [events.append])
    kinds = [e.kind for e in events if e.kind != "token_delta"]
    assert kinds == [
        "step_started",
        "model_call_started",
        "model_call_failed",
        "retry_scheduled",
        "model_call_started",
        "model_call_completed",
        "tool_call_started",
        "tool_call_completed",
        "model_call_started",
        "model_call_completed",
        "completion_decided",
        "step_completed",
    ]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(e.run_id == "r1" and e.step_id == "s" for e in events)
    assert [e.timestamp for e in events] == sorted(e.timestamp for e in events)
    completed = events[-1]
    assert completed.output == "three"
    assert completed.usage.calls == 3
    assert "".join(e.text for e in events if e.kind == "token_delta") == "three"
    tool_done = next(e for e in events if e.kind == "tool_call_completed")
    assert (tool_done.name, tool_done.content) == ("add", "3")


def test_events_are_frozen() -> None:
    event = ev.StepStarted(run_id="r", step_id="s")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.step_id = "t"  # type: ignore[misc]


def test_every_event_type_round_trips_through_json() -> None:
    samples = [cls(run_id="r", step_id="s", seq=3, timestamp=1.5) for cls in get_args(ev.Event)]
    assert len(samples) == 17
    for event in samples:
        assert ev.event_from_json(ev.event_to_json(event)) == event
    usage = ev.UsageRecord(prompt_tokens=1, completion_tokens=2, calls=1)
    done = ev.StepCompleted(run_id="r", step_id="s", output={"a": [1]}, usage=usage)
    assert ev.event_from_json(ev.event_to_json(done)) == done


def test_real_run_events_serialize() -> None:
    events: list[Any] = []
    run(ScriptedModel([[("add", {"a": 1, "b": 2})], "three"]), [events.append])
    for event in events:
        assert ev.event_from_json(ev.event_to_json(event)) == event


def test_a_failing_listener_does_not_stop_the_run(caplog: pytest.LogCaptureFixture) -> None:
    received: list[Any] = []

    def broken(event: Any) -> None:
        raise RuntimeError("listener bug")

    with caplog.at_level(logging.ERROR, logger="minions"):
        run(ScriptedModel(["done"]), [broken, received.append])
    assert received[-1].kind == "step_completed"
    assert "event listener" in caplog.text
    assert "listener bug" in caplog.text


def test_events_go_to_structlog_only_when_the_application_configured_it() -> None:
    # Unconfigured structlog would print to stdout: the library must stay silent then.
    structlog.reset_defaults()
    assert not structlog.is_configured()
    emitter = ev.EventEmitter("r")
    assert emitter.emit(ev.StepStarted, step_id="s") is None
    with structlog.testing.capture_logs() as logs:
        run(ScriptedModel(["done"]), [])
    assert [entry["event"] for entry in logs if entry["log_level"] == "info"] == [
        "step_started",
        "model_call_completed",
        "completion_decided",
        "step_completed",
    ]
    assert logs[-1]["step_id"] == "s"
    assert logs[-1]["run_id"] == "r1"
