"""The one fold of a run's events into the state of its steps (`minions._fold`), which the CLI,
the service and the console read: loop items, visits, waits, retries, a step started again,
a skip after a visit, what the store kept laid over the events; and the property the event
stream relies on: the executions each event reports changed are enough to keep a copy."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minions import events as ev
from minions._fold import (
    EXECUTION_STATUSES,
    RUN_STATUSES,
    TERMINAL,
    Execution,
    RunStates,
    step_error,
    step_failure,
)
from minions._item import ItemId
from minions.runs import STATUSES, StepRecord

T0 = 1_000.0


def numbered(*events: ev.Event) -> list[ev.Event]:
    """The events with their sequence numbers and times (a second apart), as stored."""
    return [
        dataclasses.replace(e, run_id="r", seq=i, timestamp=T0 + i)
        for i, e in enumerate(events, start=1)
    ]


def folded(events: list[ev.Event], *, details: bool = False) -> RunStates:
    return RunStates.of(events, details=details)


# -- the names every front end shares --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "step", "item"),
    [
        ("each", "each", None),
        ("each[0]", "each", 0),
        ("each[12]", "each", 12),
        ("a-b_c[3]", "a-b_c", 3),
        ("each[]", "each[]", None),
        ("each[x]", "each[x]", None),
        ("[3]", "[3]", None),
        ("each[٣]", "each[٣]", None),  # an Arabic-Indic digit is not an index
    ],
)
def test_an_item_id_parses_and_prints_back(text: str, step: str, item: int | None) -> None:
    name = ItemId.parse(text)
    assert (name.step, name.item) == (step, item)
    assert str(name) == text


def test_an_item_id_names_its_scope_and_its_items() -> None:
    step, item = ItemId("each"), ItemId("each", 2)
    assert (step.scope(3), item.scope(3)) == ("each#3", "each#3[2]")
    # What a step's stream matches its loop items' ids by, built once: not a longer id.
    assert step.items_prefix == "each["
    assert [s for s in ("each", "each[0]", "each[12]", "eacher", "eac") if s.startswith(step.items_prefix)] == ["each[0]", "each[12]"]  # fmt: skip


@pytest.mark.parametrize(
    ("scope", "visit"),
    [
        ("each#3", 3),
        ("each#3[2]", 3),
        ("outer#1/each#4", 4),
        ("#2", 2),
        ("each", None),
        ("each#", None),
        ("each#x", None),
        ("each#3[x]", None),
        ("each#3]", None),
        ("each#٣", None),  # an Arabic-Indic digit is no visit
    ],
)
def test_the_visit_a_scope_names(scope: str, visit: int | None) -> None:
    assert ItemId.visit_of(scope) == visit


@given(
    step=st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,20}", fullmatch=True),
    item=st.none() | st.integers(min_value=0, max_value=10**6),
    visit=st.integers(min_value=1, max_value=10**6),
)
def test_a_scope_gives_back_its_visit_and_an_id_parses_back(
    step: str, item: int | None, visit: int
) -> None:
    name = ItemId(step, item)
    assert ItemId.visit_of(name.scope(visit)) == visit
    assert ItemId.parse(str(name)) == name


@pytest.mark.parametrize(
    ("step_id", "error", "failure", "own"),
    [
        ("x", "boom", "step 'x' failed: boom", "boom"),
        ("x", "step 'x': cannot read 'a.txt'", "step 'x' failed: cannot read 'a.txt'", None),
        (
            "x",
            "step 'x', parameter 'p': no value",
            "step 'x' failed: parameter 'p': no value",
            None,
        ),
        ("x", "step 'x' timed out after 5s", "step 'x' timed out after 5s", "timed out after 5s"),
        ("each[2]", "step 'each': no list", "step 'each[2]' failed: no list", "no list"),
        # Another step named, or the name only as a prefix of another: said as it is.
        ("x", "step 'y': boom", "step 'x' failed: step 'y': boom", "step 'y': boom"),
        ("x", "step 'x'y: boom", "step 'x' failed: step 'x'y: boom", "step 'x'y: boom"),
    ],
)
def test_a_failed_step_is_named_once(
    step_id: str, error: str, failure: str, own: str | None
) -> None:
    assert step_failure(step_id, error) == failure
    assert step_error(step_id, error) == (own if own is not None else failure.split(": ", 1)[1])


def test_one_status_list_for_runs_and_one_for_executions() -> None:
    assert STATUSES == RUN_STATUSES  # the store's statuses are these
    assert {"completed", "failed", "cancelled"} == TERMINAL
    assert set(EXECUTION_STATUSES) == {
        "pending",
        "running",
        "waiting",
        "completed",
        "failed",
        "skipped",
        "reused",
    }


# -- folding -------------------------------------------------------------------------------


LOOP = numbered(
    ev.RunStarted(),
    ev.StepStarted(step_id="start"),
    ev.StepCompleted(step_id="start", usage=ev.UsageRecord(prompt_tokens=1, calls=1)),
    ev.StepStarted(step_id="each"),
    ev.StepStarted(step_id="each[0]"),
    ev.ModelCallStarted(step_id="each[0]", model="m"),
    ev.ModelCallCompleted(
        step_id="each[0]", usage=ev.UsageRecord(prompt_tokens=3, completion_tokens=2, calls=1)
    ),
    ev.StepStarted(step_id="each[1]"),
    ev.StepCompleted(step_id="each[0]"),
    ev.StepFailed(step_id="each[1]", error="boom"),
    ev.StepFailed(step_id="each", error="1 of 2 loop items failed"),
    ev.StepSkipped(step_id="after", reason="step 'each' failed before choosing it"),
    ev.RunFailed(error="step 'each' failed"),
)


def test_a_loop_and_its_items() -> None:
    states = folded(LOOP)
    assert [(e.step_id, e.status) for e in states.executions] == [
        ("start", "completed"),
        ("each", "failed"),
        ("each[0]", "completed"),
        ("each[1]", "failed"),
        ("after", "skipped"),
    ]
    assert states.steps() == {"start": "completed", "each": "failed", "after": "skipped"}
    each, first, second = states.of_step("each")
    assert (each.items_started, each.items_done) == (2, 2)
    assert (first.item, second.item, first.step) == (0, 1, "each")
    assert first.model_calls == 1
    assert first.spent == ev.UsageRecord(prompt_tokens=3, completion_tokens=2, calls=1)
    assert each.spent == ev.UsageRecord()  # an item's calls are its own
    assert second.error == "boom"
    assert (first.started_at, first.finished_at) == (T0 + 5, T0 + 9)
    after = states.latest("after")
    assert after is not None
    assert after.skipped == "step 'each' failed before choosing it"
    assert after.started_at is None
    assert (states.status, states.started_at, states.finished_at) == ("failed", T0 + 1, T0 + 13)
    assert states.seq == 13
    assert states.status_of("nothing") == "pending"


def test_a_second_visit_and_a_skip_after_a_visit_are_executions_of_their_own() -> None:
    states = folded(
        numbered(
            ev.StepStarted(step_id="draft", visit=1),
            ev.StepCompleted(step_id="draft", visit=1),
            ev.StepStarted(step_id="draft", visit=2),
            ev.RetryScheduled(step_id="draft", target="output", attempt=1, reason="bad"),
            ev.StepCompleted(step_id="draft", visit=2),
            ev.StepSkipped(step_id="draft", reason="not chosen"),
        )
    )
    visits = [(e.visit, e.status) for e in states.of_step("draft")]
    assert visits == [(1, "completed"), (2, "completed"), (3, "skipped")]
    first, second, _ = states.of_step("draft")
    assert first.retries == []
    assert [(r.visit, r.target, r.attempt, r.reason) for r in second.retries] == [
        (2, "output", 1, "bad")
    ]
    assert states.status_of("draft") == "skipped"


def test_executions_in_the_order_they_first_started() -> None:
    states = folded(
        numbered(
            ev.StepStarted(step_id="write"),
            ev.StepCompleted(step_id="write"),
            ev.StepSkipped(step_id="publish", reason="not chosen"),  # told of first...
            ev.StepStarted(step_id="write", visit=2),
            ev.StepStarted(step_id="each"),
            ev.StepStarted(step_id="each[0]"),
            ev.StepStarted(step_id="publish"),  # ...chosen later, in the same visit
            ev.StepStarted(step_id="write", visit=2),  # started again: not twice
        )
    )
    told = [(e.step_id, e.visit) for e in states.executions]
    assert told == [("write", 1), ("publish", 1), ("write", 2), ("each", 1), ("each[0]", 1)]
    started = [(e.step_id, e.visit) for e in states.started]
    assert started == [("write", 1), ("write", 2), ("each", 1), ("each[0]", 1), ("publish", 1)]


def test_a_step_started_again_after_a_failure_runs_from_its_new_start() -> None:
    states = folded(
        numbered(
            ev.StepStarted(step_id="call"),
            ev.ToolCallStarted(step_id="call", call_id="c1", name="t", arguments={"a": 1}),
            ev.ToolCallFailed(step_id="call", call_id="c1", name="t", error="down"),
            ev.StepFailed(step_id="call", error="down"),
            ev.StepStarted(step_id="call"),  # the run was resumed
            ev.ToolCallStarted(step_id="call", call_id="c1", name="t", arguments={"a": 1}),
        ),
        details=True,
    )
    call = states.latest("call")
    assert call is not None
    assert call.details is not None
    assert (call.status, call.error, call.starts, call.started_at) == ("running", None, 2, T0 + 5)
    # Its calls of each start are told apart (the same call id, made again).
    calls = [(t.start, t.error, t.finished_at) for t in call.details.tool_calls]
    assert calls == [(1, "down", T0 + 3), (2, None, None)]


def test_waits_for_a_person_and_for_a_model_endpoint() -> None:
    states = folded(
        numbered(
            ev.StepStarted(step_id="say"),
            ev.ModelCallWaiting(
                step_id="say", model="m", endpoint="http://x/v1", reason="max_concurrent"
            ),
            ev.ModelCallStarted(step_id="say"),
            ev.ModelCallCompleted(step_id="say"),
            ev.ApprovalRequested(step_id="say", call_id="say#1/c", name="shout"),
        )
    )
    say = states.latest("say")
    assert say is not None
    assert say.status == "waiting"
    limit, approval = say.waits
    assert (limit.kind, limit.endpoint, limit.limit, limit.started_at, limit.ended_at) == (
        "limit",
        "http://x/v1",
        "max_concurrent",
        T0 + 2,
        T0 + 3,
    )
    assert say.waiting("approval") is approval
    assert say.waiting("limit") is None
    states.fold(
        ev.ApprovalResolved(
            step_id="say", call_id="say#1/c", approved=False, reason="no", seq=6, timestamp=T0 + 9
        )
    )
    assert states.status_of("say") == "running"
    assert (approval.ended_at, approval.approved, approval.reason) == (T0 + 9, False, "no")


def test_what_a_step_waits_for_now_and_what_it_waited_once_it_ended() -> None:
    states = folded(
        numbered(
            ev.StepStarted(step_id="each"),
            ev.StepStarted(step_id="each[0]"),
            ev.ModelCallWaiting(step_id="each[0]", endpoint="http://x/v1"),
        )
    )
    each, item = states.of_step("each")
    assert states.items_of(each) == [item]
    assert states.items_of(item) == []
    # A loop item's wait for its endpoint is its step's too.
    assert (item.waits_for, each.waits_for, states.waits_for(each)) == ("limit", None, "limit")
    states.fold(ev.ApprovalRequested(step_id="each", call_id="each#1/c", name="t", seq=4))
    assert states.waits_for(each) == "approval"  # a person's decision first
    states.fold(ev.ApprovalResolved(step_id="each", call_id="each#1/c", approved=True, seq=5))
    states.fold(ev.ModelCallStarted(step_id="each[0]", seq=6))
    assert states.waits_for(each) is None
    states.fold(ev.StepCompleted(step_id="each[0]", waited=1.5, seq=7))
    states.fold(ev.StepCompleted(step_id="each", waited=2.5, seq=8))
    assert (each.waited, item.waited) == (2.5, 1.5)
    # A step that ended waits for nothing, even with a wait its events never closed.
    states.fold(ev.StepStarted(step_id="b", seq=9))
    states.fold(ev.ModelCallWaiting(step_id="b", seq=10))
    b = states.latest("b")
    assert b is not None
    assert states.waits_for(b) == "limit"
    states.fold(ev.StepFailed(step_id="b", error="cancelled", waited=3.0, seq=11))
    assert (b.waits_for, states.waits_for(b), b.waited) == (None, None, 3.0)
    # Started again (the run was resumed): its time waited is told anew at its end.
    states.fold(ev.StepStarted(step_id="b", seq=12))
    assert b.waited == 0.0
    # The store keeps what an ended execution waited, for one whose end is not in the events.
    states.stored([StepRecord(step_id="c", visit=1, status="completed", waited=4.0)])
    c = states.latest("c")
    assert c is not None
    assert c.waited == 4.0


def test_details_of_model_calls_and_decisions_only_when_asked() -> None:
    events = numbered(
        ev.StepStarted(step_id="s"),
        ev.ModelCallStarted(
            step_id="s",
            turn=1,
            attempt=1,
            model="m",
            messages=(ev.MessageRecord(role="user", text="hi"),),
        ),
        ev.ModelCallFailed(step_id="s", turn=1, attempt=1, error="cut off"),
        ev.ModelCallStarted(step_id="s", turn=1, attempt=2, model="m"),
        ev.ModelCallCompleted(
            step_id="s", turn=1, attempt=2, finish_reason="stop", tool_calls=("t",), answer="ok"
        ),
        ev.CompletionDecided(step_id="s", link="text", decision="complete", reason="text"),
    )
    assert all(e.details is None for e in folded(events).executions)
    s = folded(events, details=True).latest("s")
    assert s is not None
    assert s.details is not None
    first, second = s.details.model_calls
    assert (first.error, first.finished_at, first.messages[0].text) == ("cut off", T0 + 3, "hi")
    assert (second.attempt, second.finish_reason, second.tool_calls, second.answer) == (
        2,
        "stop",
        ("t",),
        "ok",
    )
    assert [(d.link, d.decision) for d in s.details.decisions] == [("text", "complete")]
    assert s.model_calls == 2


def test_a_reused_step_and_token_deltas() -> None:
    states = folded(
        numbered(
            ev.StepReused(step_id="one", source_run_id="parent"),
            ev.StepStarted(step_id="two"),
        )
    )
    one = states.latest("one")
    assert one is not None
    assert (one.status, one.reused_from, one.started_at, one.finished_at) == (
        "reused",
        "parent",
        T0 + 1,
        T0 + 1,
    )
    # Reused when the rerun reused it, not when it was queued (and its reuse stored): the
    # same whether the store or the event came first.
    queued = StepRecord(step_id="one", visit=1, status="reused", started_at=1.0, finished_at=1.0)
    first = RunStates()
    first.stored([queued])
    first.fold(numbered(ev.StepReused(step_id="one", source_run_id="parent"))[0])
    states.stored([queued])
    for told in (first.latest("one"), states.latest("one")):
        assert told is not None
        assert (told.started_at, told.finished_at) == (T0 + 1, T0 + 1)
    two = states.latest("two")
    assert two is not None
    delta = ev.TokenDelta(step_id="two", text="a", seq=2)
    assert states.fold(delta) == [two]
    assert two.streamed == 1
    assert states.fold(ev.TokenDelta(step_id="nobody", text="a")) == []


def test_what_the_store_kept_has_the_last_word_on_an_ended_execution() -> None:
    events = numbered(
        ev.StepStarted(step_id="a"),
        ev.StepCompleted(step_id="a"),
        ev.StepStarted(step_id="b"),  # runs again after a resume
    )
    states = folded(events)
    kept = [
        StepRecord(step_id="a", visit=1, status="completed", usage={"calls": 1}, finished_at=5.0),
        StepRecord(step_id="b", visit=1, status="failed", error="earlier"),
        StepRecord(
            step_id="c",  # its events are not in the log: still told
            visit=1,
            status="completed",
            started_at=1.0,
            finished_at=2.0,
            loop_items=(StepRecord(step_id="c[0]", visit=1, status="completed"),),
        ),
    ]
    changed = states.stored(kept)
    assert [e.step_id for e in changed] == ["a", "c", "c[0]"]
    a, b, c = (states.latest(s) for s in "abc")
    assert a is not None
    assert b is not None
    assert c is not None
    assert a.usage == ev.UsageRecord(calls=1)
    assert (a.started_at, a.finished_at) == (T0 + 1, T0 + 2)  # the events' times stay
    assert (b.status, b.error) == ("running", None)
    assert (c.status, c.started_at, c.finished_at) == ("completed", 1.0, 2.0)
    assert states.status_of("c[0]") == "completed"
    # `RunStates.of` is the two at once (what `RunStore.step_states` answers).
    both = RunStates.of(events, kept)
    assert [(e.step_id, e.status, e.usage, e.error) for e in both.executions] == [
        (e.step_id, e.status, e.usage, e.error) for e in states.executions
    ]


def test_a_run_handed_back_stops_what_was_in_flight_until_it_starts_again() -> None:
    states = folded(
        numbered(
            ev.StepStarted(step_id="one"),
            ev.StepCompleted(step_id="one"),
            ev.StepStarted(step_id="two"),
            ev.ApprovalRequested(step_id="two", call_id="c1"),
            ev.RunDraining(executor_id="w1", grace=0.0, in_flight=("two",)),
            ev.RunHandedBack(executor_id="w1", attempt=2, cut_short=("two",)),
        )
    )
    one, two = states.executions
    assert (one.status, two.status) == ("completed", "pending")
    assert (two.started_at, two.finished_at) == (T0 + 3, T0 + 6)  # its bar ends there
    assert [w.ended_at for w in two.waits] == [T0 + 6]
    states.fold(numbered(*[ev.StepStarted(step_id="x")] * 6, ev.StepStarted(step_id="two"))[-1])
    assert (two.status, two.starts, two.finished_at) == ("running", 2, None)
    # A takeover (of a worker that died) says the same of what it had in flight.
    taken = folded(
        numbered(ev.StepStarted(step_id="one"), ev.RunTakenOver(executor_id="w1", by="w2"))
    )
    assert [e.status for e in taken.executions] == ["pending"]


# -- the property the event stream relies on ---------------------------------------------------


STEPS = ("a", "b", "a[0]", "a[1]")


def _events() -> st.SearchStrategy[ev.Event]:
    step = st.sampled_from(STEPS)
    visit = st.integers(1, 2)
    call = st.sampled_from(("c1", "c2"))
    return st.one_of(
        st.builds(ev.StepStarted, step_id=step, visit=visit),
        st.builds(ev.StepCompleted, step_id=step, visit=visit, waited=st.just(1.0)),
        st.builds(ev.StepFailed, step_id=step, visit=visit, error=st.just("e")),
        st.builds(ev.StepSkipped, step_id=step, reason=st.just("r")),
        st.builds(ev.StepReused, step_id=step, visit=visit, source_run_id=st.just("p")),
        st.builds(ev.ModelCallWaiting, step_id=step),
        st.builds(ev.ModelCallStarted, step_id=step, attempt=st.integers(1, 2)),
        st.builds(ev.ModelCallCompleted, step_id=step, attempt=st.integers(1, 2)),
        st.builds(ev.ModelCallFailed, step_id=step, attempt=st.integers(1, 2)),
        st.builds(ev.ToolCallStarted, step_id=step, call_id=call),
        st.builds(ev.ToolCallCompleted, step_id=step, call_id=call),
        st.builds(ev.RetryScheduled, step_id=step),
        st.builds(ev.ApprovalRequested, step_id=step, call_id=call),
        st.builds(ev.ApprovalResolved, step_id=step, call_id=call, approved=st.booleans()),
        st.builds(ev.CompletionDecided, step_id=step),
        st.builds(ev.TokenDelta, step_id=step),
        st.builds(ev.RunStarted),
        st.builds(ev.RunCompleted),
        st.builds(ev.RunDraining),
        st.builds(ev.RunHandedBack),
        st.builds(ev.RunTakenOver),
    )


def _state(execution: Execution) -> dict[str, Any]:
    return dataclasses.asdict(execution)


@settings(max_examples=200, deadline=None)
@given(st.lists(_events(), max_size=40))
def test_the_executions_each_event_changes_are_enough_to_keep_a_copy(
    events: list[ev.Event],
) -> None:
    states = RunStates(details=True)
    copy: dict[tuple[str, int], dict[str, Any]] = {}
    for event in events:
        for execution in states.fold(event):
            copy[(execution.step_id, execution.visit)] = _state(execution)
    assert copy == {(e.step_id, e.visit): _state(e) for e in states.executions}
    # Each step's status is its latest execution's, whichever order they came in.
    for step_id, status in states.steps().items():
        latest = states.latest(step_id)
        assert latest is not None
        assert (latest.status, latest.item) == (status, None)
