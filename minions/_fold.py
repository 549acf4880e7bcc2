"""What a run's events tell of its steps: one fold, event by event, for every front end.

`RunStates` folds a run's events one at a time, so a live view and a replay of stored events
share it: each execution of a step (a visit of it, or one of its loop items) with its status,
times, usage, waits (for a person's decision, for a model endpoint's limits: what it waits for
now, and once it ended the time it waited rather than worked) and retries; with
``details=True`` also each model call, tool call and completion decision. `minions run`'s live
view, `minions runs show` and `runs events --follow`, the service's ``/runs/{id}/steps`` and
its event stream (which the console renders) all read this one fold.

Here too are the names every front end shares: `ItemId` (``step[2]``, a loop item's id), the
run statuses (`RUN_STATUSES`, `TERMINAL`), an execution's (`EXECUTION_STATUSES`, `ENDED`) and
the kinds of event that end a run (`TERMINAL_KINDS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, get_args

from minions import events as ev
from minions._item import ItemId

__all__: list[str] = []

RunStatus = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]
"""Where a durable run is: `queued` for a worker, `running`, `waiting` for a person's
decision, or ended (`TERMINAL`)."""
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
"""The statuses of a run that has ended."""
TERMINAL_KINDS: frozenset[str] = frozenset({"run_completed", "run_failed"})
"""The kinds of event that end a run's log (until the run is resumed)."""

ExecutionStatus = Literal[
    "pending", "running", "waiting", "completed", "failed", "skipped", "reused"
]
"""Where an execution of a step is: not started (`pending`), `running`, `waiting` for a
person's decision on a call, or ended: `completed`, `failed`, `skipped` (it will not run), or
`reused` (a rerun took its recorded result)."""
EXECUTION_STATUSES: tuple[ExecutionStatus, ...] = get_args(ExecutionStatus)
ENDED: frozenset[str] = frozenset({"completed", "failed", "skipped", "reused"})
"""The statuses of an execution that has ended."""
IN_FLIGHT: frozenset[str] = frozenset({"running", "waiting"})
"""The statuses of an execution in flight: started, and not ended."""


WaitKind = Literal["approval", "limit"]
"""What a wait is for: a person's decision on a call (``approval``), or a model endpoint's
limits before a model call is sent (``limit``)."""


def _named(step_id: str, error: str) -> tuple[str, str] | None:
    """The mention of the step (or of the loop step of an item) that `error` starts with
    (``step 'x'``), and what follows it; ``None``: it names no such step first."""
    name = ItemId.parse(step_id)
    for named in dict.fromkeys((f"step {step_id!r}", f"step {name.step!r}")):
        rest = error[len(named) :]
        if error.startswith(named) and rest[:1] in (":", ",", " "):
            return named, rest
    return None


def step_error(step_id: str, error: str) -> str:
    """A step's error said where the step is named already (its row, its line): without
    the step's name it may start with (``step 'x': cannot read...`` is ``cannot read...``;
    ``step 'x' timed out after 5s`` is ``timed out after 5s``)."""
    found = _named(step_id, error)
    return error if found is None else found[1].lstrip(":, ")


def step_failure(step_id: str, error: str) -> str:
    """``step 'x' failed: ERROR``, the step named once: an error that starts by naming it
    says the rest after ``failed:`` (``step 'x': boom`` is ``step 'x' failed: boom``), and one
    that says what the step did is kept whole (``step 'x' timed out after 5s``)."""
    found = _named(step_id, error)
    if found is not None and found[1][:1] == " ":
        return error
    return f"step {step_id!r} failed: {step_error(step_id, error)}"


@dataclass(kw_only=True, slots=True)
class Wait:
    """A wait inside an execution: for a person's decision on a call (`kind` ``approval``),
    or for a model endpoint's limits before a model call is sent (`kind` ``limit``).

    Attributes:
        ended_at: when it ended (``None``: it goes on).
        call_id: the call waiting for a decision (``step#visit[item]/id``).
        name: the tool of that call.
        approved: the decision (``None``: not made yet).
        reason: why the call was rejected.
        endpoint: the limits' entry that holds the model call (its ``match``).
        model: the model called.
        limit: which limit holds it: ``max_concurrent``, ``requests_per_minute``,
            ``tokens_per_minute`` or ``retry_after``.
        delay: seconds it should wait, when that is known.
        escalated_at: when the call was escalated (its recipe's ``approval.escalate_after``).
    """

    kind: WaitKind
    started_at: float
    ended_at: float | None = None
    call_id: str | None = None
    name: str = ""
    approved: bool | None = None
    reason: str | None = None
    endpoint: str = ""
    model: str = ""
    limit: str | None = None
    delay: float | None = None
    escalated_at: float | None = None


@dataclass(kw_only=True, slots=True)
class Retry:
    """A model call, an answer or a tool call tried again (`target` ``model``, ``output`` or
    ``tool``); `attempt` is the attempt that failed."""

    item: int | None
    visit: int
    at: float
    target: str
    attempt: int
    delay: float
    reason: str
    seq: int = 0


@dataclass(kw_only=True, slots=True)
class ModelCall:
    """One attempt of a model call (kept with ``details=True``)."""

    item: int | None
    visit: int
    turn: int
    attempt: int
    model: str
    started_at: float
    finished_at: float | None = None
    usage: ev.UsageRecord | None = None
    finish_reason: str | None = None
    tool_calls: tuple[str, ...] = ()
    output_mode: str | None = None
    error: str | None = None
    messages: tuple[ev.MessageRecord, ...] = ()
    messages_omitted: int = 0
    answer: str | None = None
    seq: int = 0
    start: int = 1
    """Which start of its execution it belongs to (see `Execution.starts`)."""


@dataclass(kw_only=True, slots=True)
class ToolCall:
    """A tool call, its attempts together (kept with ``details=True``)."""

    item: int | None
    visit: int
    call_id: str
    name: str
    arguments: dict[str, Any]
    attempts: int
    started_at: float
    finished_at: float | None = None
    result: str | None = None
    error: str | None = None
    seq: int = 0
    start: int = 1


@dataclass(kw_only=True, slots=True)
class Decision:
    """A completion link's decision on an answer (kept with ``details=True``)."""

    item: int | None
    visit: int
    at: float
    link: str
    decision: str
    reason: str
    seq: int = 0


@dataclass(kw_only=True, slots=True)
class Details:
    """What an execution's events tell beyond its state: every model call attempt, tool call
    and completion decision, in order."""

    model_calls: list[ModelCall] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)


@dataclass(kw_only=True, slots=True, eq=False)
class Execution:
    """One execution of a step: a visit of it, or one of its loop items.

    Attributes:
        step_id: its id in events and records (``each`` or ``each[2]``).
        step: the step's id.
        item: its loop item's index (``None``: the step itself).
        visit: the visit (a loop item has its step's).
        usage: the tokens its end told (``None`` until it ends; a loop step's, its items').
        spent: the tokens of its own model calls so far, each attempt as it ended.
        skipped: why it was skipped.
        model_calls: its model call attempts that ended.
        tool_calls: its tool calls that ended.
        streamed: text deltas of its model call in flight (live only).
        items_started: a loop step's items started in this visit; `items_done` ended.
        starts: how many times it started (more than once: its run went on after a failure
            or a crash, and it ran again).
        reused_from: the run whose recorded result a rerun reused.
        waited: seconds of its time it waited (its model calls for their endpoint's limits,
            its tool calls for approval) rather than worked, told when it ended (a loop
            step's: the time any of its items waited).
    """

    step_id: str
    step: str
    item: int | None
    visit: int
    status: ExecutionStatus = "pending"
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    skipped: str | None = None
    usage: ev.UsageRecord | None = None
    spent: ev.UsageRecord = field(default_factory=ev.UsageRecord)
    model_calls: int = 0
    tool_calls: int = 0
    streamed: int = 0
    items_started: int = 0
    items_done: int = 0
    starts: int = 0
    reused_from: str | None = None
    waited: float = 0.0
    retries: list[Retry] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    details: Details | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def waiting(self, kind: WaitKind) -> Wait | None:
        """The wait of this kind that goes on, if any."""
        for wait in reversed(self.waits):
            if wait.kind == kind and wait.ended_at is None:
                return wait
        return None

    @property
    def waits_for(self) -> WaitKind | None:
        """What it waits for now (a person's decision before its endpoint's limits), or
        ``None`` while it works or once it ended."""
        if self.ended:
            return None
        if self.waiting("approval") is not None:
            return "approval"
        return "limit" if self.waiting("limit") is not None else None


class StoredExecution(Protocol):
    """What `RunStates.stored` reads of a stored execution (a `minions.runs.StepRecord`)."""

    @property
    def step_id(self) -> str: ...
    @property
    def visit(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def usage(self) -> Mapping[str, int]: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def finished_at(self) -> float | None: ...
    @property
    def reused_from(self) -> str | None: ...
    @property
    def waited(self) -> float: ...
    @property
    def loop_items(self) -> Sequence[StoredExecution]: ...


_USAGE_FIELDS = tuple(f.name for f in fields(ev.UsageRecord))


def _usage(data: Mapping[str, int]) -> ev.UsageRecord:
    return ev.UsageRecord(**{name: int(data.get(name, 0)) for name in _USAGE_FIELDS})


def _plus(a: ev.UsageRecord, b: ev.UsageRecord) -> ev.UsageRecord:
    return ev.UsageRecord(
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        calls=a.calls + b.calls,
        unknown_calls=a.unknown_calls + b.unknown_calls,
    )


def total(usages: Iterable[ev.UsageRecord]) -> ev.UsageRecord:
    """The sum of `usages`."""
    summed = ev.UsageRecord()
    for usage in usages:
        summed = _plus(summed, usage)
    return summed


class RunStates:
    """The state of a run's steps, folded from its events one at a time (`fold`), with what
    the store kept of each execution laid over them (`stored`).

    An event that names an execution never seen (a call before its step's start) makes it,
    pending; a step skipped after one of its visits ran is skipped in a visit of its own.

    Args:
        details: keep each model call, tool call and completion decision (`Execution.details`).
    """

    def __init__(self, *, details: bool = False) -> None:
        self.details = details
        self.status: Literal["pending", "running", "completed", "failed"] = "pending"
        """The run, as its events tell it."""
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.seq = 0
        """The last stored event folded (token deltas are not stored)."""
        self._executions: dict[tuple[str, int], Execution] = {}
        self._latest: dict[str, Execution] = {}
        self._first_started: list[Execution] = []

    @classmethod
    def of(
        cls,
        events: Iterable[ev.Event],
        stored: Iterable[StoredExecution] = (),
        *,
        details: bool = False,
    ) -> RunStates:
        """A run's `events` folded, then what the store kept of its executions (`stored`)
        laid over them: a stored run's step states."""
        states = cls(details=details)
        for event in events:
            states.fold(event)
        states.stored(stored)
        return states

    # -- reading -------------------------------------------------------------------------------

    @property
    def executions(self) -> list[Execution]:
        """Every execution, in the order they were first told of."""
        return list(self._executions.values())

    @property
    def started(self) -> list[Execution]:
        """Every execution that started, in the order each first started (one that was
        told of before, a step skipped then chosen in the same visit, is where it started)."""
        return list(self._first_started)

    def latest(self, step_id: str) -> Execution | None:
        """The latest execution of `step_id` (a step's id, or a loop item's)."""
        return self._latest.get(step_id)

    def status_of(self, step_id: str) -> ExecutionStatus:
        """The status of the latest execution of `step_id` (``pending``: none)."""
        found = self._latest.get(step_id)
        return "pending" if found is None else found.status

    def steps(self) -> dict[str, ExecutionStatus]:
        """Each step's status (its latest visit's), loop items left out, in the order they
        were first told of."""
        return {e.step_id: e.status for e in list(self._latest.values()) if e.item is None}

    def of_step(self, step: str) -> list[Execution]:
        """Every execution of `step` and of its loop items, in the order they were first told
        of."""
        return [e for e in list(self._executions.values()) if e.step == step]

    def items_of(self, execution: Execution) -> list[Execution]:
        """The loop items of `execution`'s visit of its step (none for a loop item itself),
        in the order they were first told of."""
        if execution.item is not None:
            return []
        return [
            e
            for e in self.of_step(execution.step)
            if e.item is not None and e.visit == execution.visit
        ]

    def waits_for(self, execution: Execution) -> WaitKind | None:
        """What a visit of a step waits for now, its loop items' waits included: a person's
        decision if one waits for it, else its endpoint's limits (``None``: it works, or it
        ended)."""
        if execution.ended:
            return None
        kinds = {e.waits_for for e in (execution, *self.items_of(execution))}
        return "approval" if "approval" in kinds else "limit" if "limit" in kinds else None

    # -- folding -------------------------------------------------------------------------------

    def fold(self, event: ev.Event) -> list[Execution]:
        """Take in one event; returns the executions it changed (an empty list: none)."""
        if isinstance(event, ev.TokenDelta):
            found = self._latest.get(event.step_id or "")
            if found is None:
                return []
            found.streamed += 1
            return [found]
        self.seq = max(self.seq, event.seq)
        step_id = event.step_id
        if step_id is None:
            return self._run(event)
        at = event.timestamp
        match event:
            case ev.StepStarted():
                return self._started(step_id, event.visit, at)
            case ev.StepCompleted() | ev.StepFailed():
                return self._ended(event, step_id, at)
            case ev.StepSkipped():
                return [self._skipped(step_id, event.reason)]
            case ev.StepReused():
                execution = self._execution(step_id, event.visit)
                # Reused when the event says (a rerun's reused steps are stored when it is
                # queued, with that moment: not when it ran).
                execution.status, execution.started_at, execution.finished_at = "reused", at, at
                execution.reused_from = event.source_run_id
                return [execution]
        execution = self._current(step_id)
        match event:
            case ev.ApprovalRequested():
                execution.status = "waiting"
                # Asked again when its run goes on after a park (or a crash): the same wait.
                if not any(
                    w.kind == "approval" and w.call_id == event.call_id and w.ended_at is None
                    for w in execution.waits
                ):
                    execution.waits.append(
                        Wait(
                            kind="approval",
                            started_at=at,
                            call_id=event.call_id,
                            name=event.name,
                        )
                    )
            case ev.ApprovalEscalated():
                for wait in execution.waits:
                    if wait.kind == "approval" and wait.call_id == event.call_id:
                        wait.escalated_at = wait.escalated_at or at
            case ev.ApprovalResolved():
                for wait in execution.waits:
                    if wait.kind == "approval" and wait.call_id == event.call_id:
                        wait.ended_at = wait.ended_at or at
                        wait.approved, wait.reason = event.approved, event.reason
                if execution.status == "waiting":
                    execution.status = "running"
            case ev.ModelCallWaiting():
                execution.waits.append(
                    Wait(
                        kind="limit",
                        started_at=at,
                        endpoint=event.endpoint,
                        model=event.model,
                        limit=event.reason,
                        delay=event.delay,
                    )
                )
            case ev.ModelCallStarted():
                self._limit_ended(execution, at)
                if execution.details is not None:
                    execution.details.model_calls.append(
                        ModelCall(
                            item=execution.item,
                            visit=execution.visit,
                            turn=event.turn,
                            attempt=event.attempt,
                            model=event.model,
                            started_at=at,
                            messages=event.messages,
                            messages_omitted=event.messages_omitted,
                            seq=event.seq,
                            start=execution.starts,
                        )
                    )
            case ev.ModelCallCompleted() | ev.ModelCallFailed():
                self._model_call_ended(execution, event, at)
            case ev.ToolCallStarted():
                if execution.details is not None:
                    self._tool_call_started(execution.details, execution, event, at)
            case ev.ToolCallCompleted() | ev.ToolCallFailed():
                execution.tool_calls += 1
                if execution.details is not None:
                    self._tool_call_ended(execution.details, execution, event, at)
            case ev.RetryScheduled():
                execution.retries.append(
                    Retry(
                        item=execution.item,
                        visit=execution.visit,
                        at=at,
                        target=event.target,
                        attempt=event.attempt,
                        delay=event.delay,
                        reason=event.reason,
                        seq=event.seq,
                    )
                )
            case ev.CompletionDecided():
                if execution.details is None:
                    return []
                execution.details.decisions.append(
                    Decision(
                        item=execution.item,
                        visit=execution.visit,
                        at=at,
                        link=event.link,
                        decision=event.decision,
                        reason=event.reason,
                        seq=event.seq,
                    )
                )
            case _:
                return []
        return [execution]

    def stored(self, records: Iterable[StoredExecution]) -> list[Execution]:
        """Lay what the store kept of each execution (and of its loop items) over what the
        events told: the store has the last word on the status, error and tokens of an
        execution that ended, gives the times the events did not, and tells of an execution
        whose events are missing; an execution the events say runs (its run went on after a
        failure, and it runs again) keeps what they say. Returns the executions it changed."""
        changed = []
        for record in records:
            for one in (record, *record.loop_items):
                execution = self._execution(one.step_id, one.visit, fresh=False)
                if execution.status in IN_FLIGHT:
                    continue
                if one.status in EXECUTION_STATUSES:
                    execution.status = one.status
                execution.error = one.error
                execution.usage = _usage(one.usage) if one.usage else None
                execution.started_at = execution.started_at or one.started_at
                execution.finished_at = execution.finished_at or one.finished_at
                execution.reused_from = execution.reused_from or one.reused_from
                execution.waited = one.waited or execution.waited
                changed.append(execution)
        return changed

    # -- the machinery -------------------------------------------------------------------------

    def _run(self, event: ev.Event) -> list[Execution]:
        if isinstance(event, ev.RunStarted):
            self.status, self.started_at = "running", event.timestamp
            self.finished_at = None
        elif isinstance(event, ev.RunCompleted | ev.RunFailed):
            self.status = "completed" if isinstance(event, ev.RunCompleted) else "failed"
            self.finished_at = event.timestamp
        elif isinstance(event, ev.RunHandedBack | ev.RunTakenOver | ev.RunRequeued):
            # Queued again: what was in flight stopped there (its bar ends), and starts
            # again from its beginning in the next worker.
            cut = [e for e in self._executions.values() if e.status in IN_FLIGHT]
            for execution in cut:
                execution.status, execution.finished_at = "pending", event.timestamp
                for wait in execution.waits:
                    wait.ended_at = wait.ended_at or event.timestamp
            return cut
        return []

    def _execution(self, step_id: str, visit: int, *, fresh: bool = True) -> Execution:
        """The execution (`step_id`, `visit`), made when it is new (then the latest of
        `step_id` when `fresh`, or when no later visit is known)."""
        found = self._executions.get((step_id, visit))
        if found is not None:
            return found
        name = ItemId.parse(step_id)
        made = Execution(
            step_id=step_id,
            step=name.step,
            item=name.item,
            visit=visit,
            details=Details() if self.details else None,
        )
        self._executions[(step_id, visit)] = made
        latest = self._latest.get(step_id)
        if fresh or latest is None or latest.visit < visit:
            self._latest[step_id] = made
        return made

    def _current(self, step_id: str) -> Execution:
        """The execution an event of `step_id` without a visit belongs to: its latest."""
        return self._latest.get(step_id) or self._execution(step_id, 1)

    def _parent(self, name: ItemId) -> Execution | None:
        return None if name.item is None else self._latest.get(name.step)

    def _started(self, step_id: str, visit: int, at: float) -> list[Execution]:
        execution = self._execution(step_id, visit)
        self._latest[step_id] = execution
        execution.status, execution.started_at, execution.finished_at = "running", at, None
        execution.error = execution.skipped = None
        execution.waited = 0.0
        execution.starts += 1
        if execution.starts == 1:
            self._first_started.append(execution)
        execution.items_started = execution.items_done = 0
        parent = self._parent(ItemId.parse(step_id))
        if parent is None:
            return [execution]
        parent.items_started += 1
        return [execution, parent]

    def _ended(
        self, event: ev.StepCompleted | ev.StepFailed, step_id: str, at: float
    ) -> list[Execution]:
        execution = self._execution(step_id, event.visit)
        failed = isinstance(event, ev.StepFailed)
        execution.status = "failed" if failed else "completed"
        execution.error = event.error if isinstance(event, ev.StepFailed) else None
        execution.finished_at = at
        execution.usage = event.usage
        execution.waited = event.waited
        execution.streamed = 0
        parent = self._parent(ItemId.parse(step_id))
        if parent is None:
            return [execution]
        parent.items_done += 1
        return [execution, parent]

    def _skipped(self, step_id: str, reason: str) -> Execution:
        latest = self._latest.get(step_id)
        if latest is None or latest.status == "pending":
            execution = latest or self._execution(step_id, 1)
        else:  # it ran: the skip is of a later visit
            execution = self._execution(step_id, latest.visit + 1)
        execution.status, execution.skipped = "skipped", reason
        return execution

    @staticmethod
    def _limit_ended(execution: Execution, at: float) -> None:
        wait = execution.waiting("limit")
        if wait is not None:
            wait.ended_at = at

    def _model_call_ended(
        self, execution: Execution, event: ev.ModelCallCompleted | ev.ModelCallFailed, at: float
    ) -> None:
        execution.model_calls += 1
        execution.streamed = 0
        execution.spent = _plus(execution.spent, event.usage)
        if isinstance(event, ev.ModelCallFailed):
            self._limit_ended(execution, at)
        if execution.details is None:
            return
        for call in reversed(execution.details.model_calls):
            if (call.start, call.turn, call.attempt) == (
                execution.starts,
                event.turn,
                event.attempt,
            ):
                break
        else:
            return  # its start is not in the events read
        call.finished_at = at
        call.usage = event.usage
        call.output_mode = event.output_mode
        if isinstance(event, ev.ModelCallCompleted):
            call.finish_reason = event.finish_reason
            call.tool_calls = event.tool_calls
            call.answer = event.answer
        else:
            call.error = event.error

    @staticmethod
    def _tool_call_started(
        details: Details, execution: Execution, event: ev.ToolCallStarted, at: float
    ) -> None:
        found = _tool_call(details, execution, event.call_id)
        if found is not None:
            found.attempts = event.attempt
            return
        details.tool_calls.append(
            ToolCall(
                item=execution.item,
                visit=execution.visit,
                call_id=event.call_id,
                name=event.name,
                arguments=dict(event.arguments),
                attempts=event.attempt,
                started_at=at,
                seq=event.seq,
                start=execution.starts,
            )
        )

    @staticmethod
    def _tool_call_ended(
        details: Details,
        execution: Execution,
        event: ev.ToolCallCompleted | ev.ToolCallFailed,
        at: float,
    ) -> None:
        found = _tool_call(details, execution, event.call_id)
        if found is None:
            return  # its start is not in the events read
        found.finished_at = at
        found.attempts = event.attempt
        if isinstance(event, ev.ToolCallCompleted):
            found.result, found.error = event.content, None
        else:
            found.error = event.error


def _tool_call(details: Details, execution: Execution, call_id: str) -> ToolCall | None:
    """The tool call `call_id` of the execution's current start (a step that starts again
    makes its calls again, with the same ids)."""
    for call in reversed(details.tool_calls):
        if call.call_id == call_id and call.start == execution.starts:
            return call
    return None
