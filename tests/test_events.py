"""Typed events: order, content, serialization, listeners and structlog."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, get_args

import pytest
import structlog
from agent_helpers import numbered
from conftest import FAST, add

from minions import (
    AgentContext,
    DefaultStep,
    Message,
    Model,
    ModelCallResponse,
    Prompt,
    StepExecutor,
    TransientModelError,
    tool,
)
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
    assert numbered(events)
    assert all(e.run_id == "r1" and e.step_id == "s" for e in events)
    assert all(e.timestamp > 0 for e in events)  # stamped (the wall clock may step back)
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


@pytest.mark.parametrize("cls", get_args(ev.Event), ids=lambda cls: cls.__name__)
def test_every_event_type_round_trips_through_json(cls: type[ev.Event]) -> None:
    event = cls(run_id="r", step_id="s", seq=3, timestamp=1.5)
    parsed = ev.event_from_json(ev.event_to_json(event))
    assert parsed == event
    assert type(parsed) is cls


def test_the_event_union_has_every_event_type() -> None:
    kinds = {cls.__name__: cls().kind for cls in get_args(ev.Event)}
    assert len(kinds) == len(set(kinds.values())) == 31
    assert set(kinds) <= set(ev.__all__)


def test_an_event_with_values_round_trips_through_json() -> None:
    usage = ev.UsageRecord(prompt_tokens=1, completion_tokens=2, calls=1)
    done = ev.StepCompleted(run_id="r", step_id="s", output={"a": [1]}, usage=usage)
    assert ev.event_from_json(ev.event_to_json(done)) == done
    failed = ev.ModelCallFailed(turn=2, attempt=3, error="bad", output_mode="prompted_json")
    assert ev.event_from_json(ev.event_to_json(failed)) == failed


def test_real_run_events_serialize() -> None:
    events: list[Any] = []
    run(ScriptedModel([[("add", {"a": 1, "b": 2})], "three"]), [events.append])
    for event in events:
        assert ev.event_from_json(ev.event_to_json(event)) == event


def test_a_failing_listener_does_not_stop_the_run() -> None:
    received: list[Any] = []

    def broken(event: Any) -> None:
        raise RuntimeError("listener bug")

    with structlog.testing.capture_logs() as logs:
        run(ScriptedModel(["done"]), [broken, received.append])
    assert received[-1].kind == "step_completed"
    failures = [entry for entry in logs if entry["event"] == "event listener failed"]
    assert [entry["event_kind"] for entry in failures][:1] == ["step_started"]
    assert all(entry["log_level"] == "error" and entry["exc_info"] for entry in failures)


def test_a_failing_listener_is_reported_on_stderr_when_nothing_is_configured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # stdout may carry the program's output (`minions run` prints the run's output there).
    assert not structlog.is_configured()

    def broken(event: ev.Event) -> None:
        raise RuntimeError("listener bug")

    ev.EventEmitter("r", [broken]).emit(ev.StepStarted(step_id="s"))
    out, err = capsys.readouterr()
    assert out == ""
    assert "event listener failed" in err
    assert "listener bug" in err


def test_events_go_to_structlog_only_when_the_application_configured_it() -> None:
    # Unconfigured structlog would print to stdout: the library must stay silent then.
    structlog.reset_defaults()
    assert not structlog.is_configured()
    emitter = ev.EventEmitter("r")
    assert emitter.emit(ev.StepStarted(step_id="s")) is None
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


def test_emit_stamps_the_event_it_is_given() -> None:
    received: list[ev.Event] = []
    emitter = ev.EventEmitter("r9", [received.append])
    given = ev.StepStarted(step_id="s")
    first = emitter.emit(given)
    second = emitter.emit(ev.StepSkipped(step_id="t", reason="why"))
    assert received == [first, second]
    assert [(e.run_id, e.seq) for e in received] == [("r9", 1), ("r9", 2)]
    assert all(e.timestamp > 0 for e in received)
    assert (given.run_id, given.seq) == ("", 0)  # the caller's instance is left as it was


def test_a_listener_is_a_callable_taking_an_event() -> None:
    assert ev.EventListener == Callable[[ev.Event], None]
    kinds: list[str] = []

    def on_event(event: ev.Event) -> None:
        kinds.append(event.kind)  # `kind` is typed on every member of the union

    listener: ev.EventListener = on_event  # mypy checks the listener's signature here
    emitter = ev.EventEmitter("r", [listener])
    assert emitter.listeners == (listener,)
    delivered = emitter.emit(ev.RoutingDecided(step_id="s", chosen=("t",)))
    assert kinds == ["routing_decided"]
    assert isinstance(delivered, ev.RoutingDecided)
    assert delivered.chosen == ("t",)


def test_emit_is_skipped_when_nobody_listens() -> None:
    emitter = ev.EventEmitter("r")
    assert not emitter.active
    assert emitter.emit(ev.StepStarted(step_id="s")) is None
    # Nothing was numbered: the first event delivered later is still number 1.
    received: list[ev.Event] = []
    listening = ev.EventEmitter("r", [received.append])
    assert listening.active
    assert listening.emit(ev.StepStarted(step_id="s")) is not None
    assert [e.seq for e in received] == [1]


def test_an_emitter_silenced_silences_the_runs_inside_it() -> None:
    """A durable run's emitter silenced (its run parked, or handed back) silences the
    emitters of the runs its recipe steps run inside it: made in its task's context. Each
    says why (what the spans of its cut-short work say)."""
    outer = ev.EventEmitter("r", [lambda _: None])
    inside = outer.context_for_inner_runs().run(ev.EventEmitter, "r.sub", [lambda _: None])
    beside = ev.EventEmitter("other", [lambda _: None])
    assert (inside.active, inside.silenced, inside.cut_short) == (True, False, None)
    outer.silence("parked")
    assert [e.silenced for e in (outer, inside, beside)] == [True, True, False]
    assert [e.cut_short for e in (outer, inside, beside)] == ["parked", "parked", None]
    assert [e.active for e in (inside, beside)] == [False, True]
    assert inside.emit(ev.StepStarted(step_id="s")) is None
    assert beside.emit(ev.StepStarted(step_id="s")) is not None


class _StumblingModel(Model):
    """Streams part of an answer, then fails transiently; the second attempt answers."""

    name = "stumbling"

    def __init__(self) -> None:
        self.calls = 0

    async def call(
        self, prompt: Prompt, *, on_token: Callable[[str], None] | None = None
    ) -> ModelCallResponse:
        self.calls += 1
        if on_token is not None:
            on_token("hal" if self.calls == 1 else "done")
        if self.calls == 1:
            raise TransientModelError("HTTP 503", status_code=503)
        return ModelCallResponse(message=Message(role="assistant", content="done"))


def test_a_retried_model_call_numbers_its_events_by_attempt() -> None:
    events: list[ev.Event] = []
    context = AgentContext(model=_StumblingModel(), config=FAST, listeners=[events.append])
    asyncio.run(StepExecutor(DefaultStep("s", "Answer."), context).execute())
    started = [e.attempt for e in events if isinstance(e, ev.ModelCallStarted)]
    deltas = [(e.attempt, e.text) for e in events if isinstance(e, ev.TokenDelta)]
    assert started == [1, 2]
    assert deltas == [(1, "hal"), (2, "done")]
    # A consumer keeps the text of the attempt that completed, and only that.
    completed = {(e.turn, e.attempt) for e in events if isinstance(e, ev.ModelCallCompleted)}
    kept = [
        e.text for e in events if isinstance(e, ev.TokenDelta) and (e.turn, e.attempt) in completed
    ]
    assert kept == ["done"]


def test_a_retried_tool_call_numbers_its_events_by_attempt() -> None:
    tries = 0

    @tool
    def flaky(x: int) -> int:
        """Fails once."""
        nonlocal tries
        tries += 1
        if tries == 1:
            raise RuntimeError("flaky")
        return x

    events: list[ev.Event] = []
    model = ScriptedModel([[("flaky", {"x": 4})], "four"])
    config = dataclasses.replace(FAST, max_tool_call_retries=2)
    context = AgentContext(model=model, tools=[flaky], config=config, listeners=[events.append])
    asyncio.run(StepExecutor(DefaultStep("s", "Use it.", tools={"flaky"}), context).execute())
    started = [e.attempt for e in events if isinstance(e, ev.ToolCallStarted)]
    done = [e.attempt for e in events if isinstance(e, ev.ToolCallCompleted)]
    assert (started, done) == ([1, 2], [2])
    retry = next(e for e in events if isinstance(e, ev.RetryScheduled))
    assert (retry.target, retry.attempt) == ("tool", 1)


def test_a_tool_call_failing_every_attempt_numbers_its_events_by_attempt() -> None:
    @tool
    def broken(x: int) -> int:
        """Always fails."""
        raise RuntimeError(f"broken {x}")

    events: list[ev.Event] = []
    model = ScriptedModel([[("broken", {"x": 1})], "gave up"])
    config = dataclasses.replace(FAST, max_tool_call_retries=2)
    context = AgentContext(model=model, tools=[broken], config=config, listeners=[events.append])
    asyncio.run(StepExecutor(DefaultStep("s", "Use it.", tools={"broken"}), context).execute())
    started = [e.attempt for e in events if isinstance(e, ev.ToolCallStarted)]
    failed = [(e.attempt, e.error) for e in events if isinstance(e, ev.ToolCallFailed)]
    retries = [e.attempt for e in events if isinstance(e, ev.RetryScheduled)]
    assert started == [1, 2, 3]
    assert retries == [1, 2]
    assert len(failed) == 1
    assert failed[0][0] == 3
    assert "after 3 attempts" in failed[0][1]
    assert not any(isinstance(e, ev.ToolCallCompleted) for e in events)
