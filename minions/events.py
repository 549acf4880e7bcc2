"""Typed events: one frozen record per thing that happens in a run.

Every event carries the run id, the step id (``None`` for run-level events), a per-run sequence
number and a timestamp. `Event` is the discriminated union of all of them, so a list of events
serializes to JSON and parses back with `event_to_json` / `event_from_json`.

Events reach, in order:

* listeners on the `AgentContext` (`EventListener`: plain callables receiving each `Event`,
  called synchronously as events happen);
* structlog, when the application has configured structlog (the library never configures it,
  and stays silent when nobody did).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from minions._emitter import EventEmitter
from minions._messages import OutputMode

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = [
    "ApprovalEscalated",
    "ApprovalRequested",
    "ApprovalResolved",
    "CompletionDecided",
    "Event",
    "EventEmitter",
    "EventListener",
    "MessageRecord",
    "ModelCallCompleted",
    "ModelCallFailed",
    "ModelCallStarted",
    "ModelCallWaiting",
    "OutputModeDemoted",
    "PlanRevised",
    "RerunPlanned",
    "RetryScheduled",
    "RoutingDecided",
    "RunCompleted",
    "RunFailed",
    "RunDraining",
    "RunHandedBack",
    "RunRequeued",
    "RunResumed",
    "RunTakenOver",
    "RunStarted",
    "StepCompleted",
    "StepCached",
    "StepFailed",
    "StepReused",
    "StepSkipped",
    "StepStarted",
    "TokenDelta",
    "ToolCallCompleted",
    "ToolCallFailed",
    "ToolCallStarted",
    "UsageRecord",
    "event_from_json",
    "event_to_json",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class UsageRecord:
    """Token usage as carried by events (a plain, serializable copy of `Usage`)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    unknown_calls: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageRecord:
    """One message of a model call's request, as kept by events when content capture is on:
    its role and its text (an assistant's tool calls and a tool's result written as text)."""

    role: str = ""
    text: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class _EventBase:
    run_id: str = ""
    step_id: str | None = None
    seq: int = 0
    timestamp: float = 0.0


# -- run ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStarted(_EventBase):
    """A run started (a durable run that resumes does not say it again)."""

    kind: Literal["run_started"] = "run_started"
    recipe_id: str = ""
    inputs: Mapping[str, Any] = field(default_factory=dict)
    actor: str | None = None
    """Who queued this attempt of a durable run (submitted, reran or resumed it): a key's
    name, ``token``, ``cli:USER`` or ``schedule:NAME``; None when nobody did (a worker took it
    over, a run in the foreground, a log older than actors)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCompleted(_EventBase):
    """A run ended with every step that had to complete completed; `output` is the run's output."""

    kind: Literal["run_completed"] = "run_completed"
    output: Any = None
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0
    waited: float = 0.0
    """Seconds of `duration` the run was blocked: every step it was running was waiting."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFailed(_EventBase):
    """A run ended failed: a step that was neither optional nor fire-and-forget failed, or the run
    could not go on (`error` says which)."""

    kind: Literal["run_failed"] = "run_failed"
    error: str = ""
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0
    waited: float = 0.0
    """Seconds of `duration` the run was blocked: every step it was running was waiting."""
    actor: str | None = None
    """Who cancelled the run, when it was cancelled (as `RunStarted.actor`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResumed(_EventBase):
    """A durable run that failed or was cancelled goes on, from its last checkpoint, because
    someone resumed it (`minions runs resume`, ``POST /runs/{id}/resume``)."""

    kind: Literal["run_resumed"] = "run_resumed"
    attempt: int = 2
    """The run's attempt that goes on (see `minions.runs.RunRecord.attempt`)."""
    actor: str | None = None
    """Who resumed it (as `RunStarted.actor`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunDraining(_EventBase):
    """The worker running a durable run is stopping (SIGTERM, Ctrl-C): no new step of the run
    starts there; its steps in flight get `grace` seconds to finish (and be checkpointed),
    then the run is handed back (`RunHandedBack`) unless it ended meanwhile."""

    kind: Literal["run_draining"] = "run_draining"
    executor_id: str = ""
    """The worker that is stopping."""
    grace: float = 0.0
    """Seconds the steps in flight may take to finish (``minions worker --grace``)."""
    in_flight: tuple[str, ...] = ()
    """The steps running when the drain began (``step`` or ``step#visit``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunHandedBack(_EventBase):
    """A worker gave a durable run back to the queue before it ended: the next worker goes on
    from its last checkpoint (finished steps are not run again), and the run keeps its place
    in the queue (the time it was first queued)."""

    kind: Literal["run_handed_back"] = "run_handed_back"
    executor_id: str = ""
    """The worker that gave it back."""
    reason: Literal["drain", "busy"] = "drain"
    """``drain``: the worker stopped; ``busy``: it was handed to a worker with no place free
    while another had one."""
    attempt: int = 2
    """The run's attempt now queued (see `minions.runs.RunRecord.attempt`)."""
    cut_short: tuple[str, ...] = ()
    """Steps stopped in flight when the grace ran out: they run again from their start."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunTakenOver(_EventBase):
    """The worker that held (or had been handed) a durable run stopped beating: it died, or was
    cut off from the store past its lease. Another worker queued the run again; it goes on
    from its last checkpoint, keeping its place in the queue."""

    kind: Literal["run_taken_over"] = "run_taken_over"
    executor_id: str = ""
    """The worker that held it (empty when not known)."""
    by: str = ""
    """The worker that took it over."""
    attempt: int = 2
    """The run's attempt now queued."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRequeued(_EventBase):
    """A worker queued a durable run again for a reason other than a drain, a hand-back or a
    takeover: a run queued by a minions whose durable format was older (`reason`)."""

    kind: Literal["run_requeued"] = "run_requeued"
    attempt: int = 2
    """The run's attempt now queued."""
    reason: str = ""
    by: str = ""
    """The worker that queued it again."""


# -- step --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StepStarted(_EventBase):
    """A step (or one item of a loop step, ``step[index]``) started; `visit` counts loops back."""

    kind: Literal["step_started"] = "step_started"
    visit: int = 1
    resumed_at: str | None = None
    """A durable run's step that waited for a decision at this call (its id) when its run
    parked: it goes on there, with no model call made again for its turns before it."""
    restarted: str | None = None
    """A durable run's step that waited for a decision when its run parked, and starts again
    from its start (its model calls are made again): why its state was not kept."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCompleted(_EventBase):
    """A step completed with `output` (a durable run says it with the step's checkpoint)."""

    kind: Literal["step_completed"] = "step_completed"
    visit: int = 1
    output: Any = None
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0
    waited: float = 0.0
    """Seconds of `duration` spent waiting (model calls for their endpoint's limits, tool
    calls for approval) rather than working."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFailed(_EventBase):
    """A step failed; `error` is why (the step's `StepExecution.error`)."""

    kind: Literal["step_failed"] = "step_failed"
    visit: int = 1
    error: str = ""
    usage: UsageRecord = field(default_factory=UsageRecord)
    duration: float = 0.0
    waited: float = 0.0
    """Seconds of `duration` spent waiting (model calls for their endpoint's limits, tool
    calls for approval) rather than working."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSkipped(_EventBase):
    """A step will not run: a dependency failed, or routing chose another branch (`reason`)."""

    kind: Literal["step_skipped"] = "step_skipped"
    reason: str = ""


# -- model and tool calls ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallWaiting(_EventBase):
    """A model call waits for its endpoint's limits (see `Limits`) before it is sent; its
    `ModelCallStarted` follows when it may go. Emitted once per attempt that has to wait."""

    kind: Literal["model_call_waiting"] = "model_call_waiting"
    turn: int = 1
    attempt: int = 1
    model: str = ""
    endpoint: str = ""
    """The entry of the limits that holds it (its ``match``, without credentials)."""
    reason: Literal["max_concurrent", "requests_per_minute", "tokens_per_minute", "retry_after"] = (
        "max_concurrent"
    )
    """`max_concurrent`: as many calls as allowed are in flight; `requests_per_minute` or
    `tokens_per_minute`: the last minute used them up; `retry_after`: the endpoint answered
    429 with ``Retry-After`` (to this run or another)."""
    delay: float | None = None
    """Seconds it should wait, when that is known (a window, a pause)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallStarted(_EventBase):
    """A model call attempt was sent (`turn` of the step, `attempt` of the turn)."""

    kind: Literal["model_call_started"] = "model_call_started"
    turn: int = 1
    attempt: int = 1
    model: str = ""
    """The model asked (with a `FallbackModel`, the one of its models this attempt asks)."""
    endpoint: str = ""
    """Its base URL, without credentials; empty for a model not behind a server."""
    messages: tuple[MessageRecord, ...] = ()
    """The request's messages, only when content capture is on (``RunSettings.capture_content``,
    or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``); empty otherwise. Bounded: each
    message's text and the whole are cut, with a note saying so."""
    messages_omitted: int = 0
    """Messages of the request left out of `messages` (from its middle) to keep it bounded."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallCompleted(_EventBase):
    """A model call attempt answered: its usage, finish reason, output mode and the tools it
    asked for."""

    kind: Literal["model_call_completed"] = "model_call_completed"
    turn: int = 1
    attempt: int = 1
    usage: UsageRecord = field(default_factory=UsageRecord)
    finish_reason: str | None = None
    output_mode: OutputMode | None = None
    tool_calls: tuple[str, ...] = ()
    duration: float = 0.0
    answer: str | None = None
    """The answer's text (bounded), only when content capture is on; ``None`` otherwise."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallFailed(_EventBase):
    """A model call attempt failed (a transient error retried, an unusable answer re-asked, or
    the error that failed the step)."""

    kind: Literal["model_call_failed"] = "model_call_failed"
    turn: int = 1
    attempt: int = 1
    error: str = ""
    usage: UsageRecord = field(default_factory=UsageRecord)
    output_mode: OutputMode | None = None
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenDelta(_EventBase):
    """Text the model wrote, as it streams it: one delta of the answer of `turn`'s `attempt`.

    Deltas come only from streamed calls: when the caller streams (`step.stream()`,
    `StepExecutor.stream()`, `AgentExecutor.stream()`) or the model streams by default
    (`OpenAIChatModel(stream=True)`). They are live only (never stored) and carry the number
    of the event before them as their `seq`.

    A retried attempt's deltas follow the superseded one's: when a delta has a higher
    `attempt` than the last one of its `turn` (a transient error retried, or the answer
    re-asked), drop the text shown for that turn and start it over; the text of the attempt
    that ends in `ModelCallCompleted` is the answer."""

    kind: Literal["token_delta"] = "token_delta"
    turn: int = 1
    attempt: int = 1
    """The model call attempt of the turn the text belongs to (1, then 2... for a retry or a
    re-ask): a higher one supersedes the text of the lower ones."""
    text: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallStarted(_EventBase):
    """A tool call attempt started, with the arguments the model gave."""

    kind: Literal["tool_call_started"] = "tool_call_started"
    call_id: str = ""
    name: str = ""
    attempt: int = 1
    """1 for the first try of the call; a tool that raised is started again with 2, ..."""
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallCompleted(_EventBase):
    """A tool call returned; `content` is the text the model sees as its result."""

    kind: Literal["tool_call_completed"] = "tool_call_completed"
    call_id: str = ""
    name: str = ""
    content: str = ""
    attempt: int = 1
    """The attempt that succeeded (the call's attempts so far)."""
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallFailed(_EventBase):
    """A tool call failed for good (unknown tool, invalid arguments, raised after its retries);
    `error` is what the model sees."""

    kind: Literal["tool_call_failed"] = "tool_call_failed"
    call_id: str = ""
    name: str = ""
    error: str = ""
    attempt: int = 1
    """The last attempt (the call's attempts in all)."""
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryScheduled(_EventBase):
    """A model call or tool call will be tried again."""

    kind: Literal["retry_scheduled"] = "retry_scheduled"
    target: Literal["model", "output", "tool"] = "model"
    """`model`: transient error; `output`: invalid output re-asked; `tool`: a tool raised."""
    attempt: int = 1
    """The attempt that failed."""
    delay: float = 0.0
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputModeDemoted(_EventBase):
    """A model will no longer ask its endpoint for structured output in `mode`: the server
    refused it, or its answers ignored it several times in a row."""

    kind: Literal["output_mode_demoted"] = "output_mode_demoted"
    model: str = ""
    mode: OutputMode = "json_schema"
    reason: str = ""
    base_url: str = ""
    """The endpoint, without credentials (empty for models that have none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalRequested(_EventBase):
    """A tool call waits for a person's approval (the run is `waiting`)."""

    kind: Literal["approval_requested"] = "approval_requested"
    call_id: str = ""
    """Names the call in the run: ``step#visit[item]/id``; `minions runs approve` takes it."""
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalResolved(_EventBase):
    """A person approved or rejected a call."""

    kind: Literal["approval_resolved"] = "approval_resolved"
    call_id: str = ""
    name: str = ""
    approved: bool = True
    reason: str | None = None
    actor: str | None = None
    """Who decided (as `RunStarted.actor`; None: not known, as in a log older than actors)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalEscalated(_EventBase):
    """A call has waited for a decision longer than its recipe's ``approval.escalate_after``
    (said once, by a worker, while the run waits without one)."""

    kind: Literal["approval_escalated"] = "approval_escalated"
    call_id: str = ""
    name: str = ""
    waited: float = 0.0
    """Seconds the call had waited for a decision when it was escalated."""
    due_at: float | None = None
    """When it times out undecided (a Unix time; None: never)."""


# -- decisions ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CompletionDecided(_EventBase):
    """A completion decision about a step's answer: which `link` took it (a chain link, a
    ``validator:<name>``, or `structured_output` / `model_output` for an answer the provider
    could not use), its kind and why."""

    kind: Literal["completion_decided"] = "completion_decided"
    link: str = ""
    decision: Literal["complete", "incomplete", "fail", "reask"] = "complete"
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingDecided(_EventBase):
    """Which outgoing transitions of a step were taken, by which selector, and why."""

    kind: Literal["routing_decided"] = "routing_decided"
    chosen: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    selector: str = ""
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRevised(_EventBase):
    """A step of a plan failed and the planner revised the rest of the plan (a replan).

    `step_id` is the step that failed; completed steps are kept and not run again.
    """

    kind: Literal["plan_revised"] = "plan_revised"
    replan: int = 1
    """1 for the first replan of a run, 2 for the second..."""
    reason: str = ""
    """Why the step failed."""
    kept: tuple[str, ...] = ()
    """The completed steps kept as they are."""
    steps: tuple[str, ...] = ()
    """The ids of the steps of the revised plan still to run."""
    usage: UsageRecord = field(default_factory=UsageRecord)
    """The tokens of the planner's call(s) for this replan."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RerunPlanned(_EventBase):
    """This run is a rerun of `parent_run_id` from `from_step` (said right after
    `RunStarted`): which steps it reuses, which it executes again, and which of those run
    again for a reason of their own (``"inputs"``: their rendered templates changed with the
    new inputs; ``"definition"``: a new recipe version changed them)."""

    kind: Literal["rerun_planned"] = "rerun_planned"
    parent_run_id: str = ""
    from_step: str = ""
    reused: tuple[str, ...] = ()
    rerun: tuple[str, ...] = ()
    changed: Mapping[str, str] = field(default_factory=dict)
    outputs_set: tuple[str, ...] = ()
    """Reused steps whose output was set by hand."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepReused(_EventBase):
    """A rerun reused a step's recorded result instead of running it: no model or tool call,
    no new usage. `usage` is what the original execution (in run `source_run_id`) cost."""

    kind: Literal["step_reused"] = "step_reused"
    visit: int = 1
    source_run_id: str = ""
    output: Any = None
    edited: bool = False
    """The output was set by hand for this rerun."""
    usage: UsageRecord = field(default_factory=UsageRecord)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCached(_EventBase):
    """A step that says ``cache`` found the output of an earlier execution with the same
    rendered prompt, model, tools and output schema, and used it without calling its model
    (a `StepCompleted` with no usage follows). `saved` is what that execution cost."""

    kind: Literal["step_cached"] = "step_cached"
    visit: int = 1
    key: str = ""
    """The cache key (a SHA-256 of what it covers)."""
    age: float = 0.0
    """Seconds since the entry was made."""
    source_step: str = ""
    """The step whose execution made the entry."""
    saved: UsageRecord = field(default_factory=UsageRecord)


Event = Union[  # noqa: UP007 - a Union reads better than a 17-line `|` chain here.
    RunStarted,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunDraining,
    RunHandedBack,
    RunTakenOver,
    RunRequeued,
    StepStarted,
    StepCompleted,
    StepFailed,
    StepSkipped,
    ModelCallWaiting,
    ModelCallStarted,
    ModelCallCompleted,
    ModelCallFailed,
    TokenDelta,
    ToolCallStarted,
    ToolCallCompleted,
    ToolCallFailed,
    RetryScheduled,
    OutputModeDemoted,
    ApprovalRequested,
    ApprovalResolved,
    ApprovalEscalated,
    CompletionDecided,
    RoutingDecided,
    PlanRevised,
    RerunPlanned,
    StepReused,
    StepCached,
]
"""Any event (a union discriminated by the `kind` field)."""

EventListener = Callable[[Event], None]
"""A callable that receives every event of a run, synchronously, in sequence order."""


@cache
def _adapter() -> TypeAdapter[Event]:
    from pydantic import Discriminator, TypeAdapter

    return TypeAdapter(Annotated[Event, Discriminator("kind")])


def event_to_json(event: Event) -> str:
    """Serialize an event to one line of JSON."""
    return _adapter().dump_json(event, fallback=repr).decode()


def event_from_json(data: str | bytes) -> Event:
    """Parse an event serialized by `event_to_json` back into its typed record.

    Raises:
        pydantic.ValidationError: `data` is not an event.
    """
    event: Event = _adapter().validate_json(data)
    return event
