"""The REST bodies: what clients send and what they get back (the OpenAPI schema). What the
service answers of a stored thing is validated from `minions.runs`' record of it
(``Model.model_validate(record, from_attributes=True)``), never copied field by field; what
it answers of a run's steps, from the one fold of their events (`minions._fold`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field

from minions._fold import Execution, ExecutionStatus, RunStates, RunStatus, WaitKind

__all__: list[str] = []

Status = RunStatus
Outcome = Literal[RunStatus, "rejected"]


def _as_dict(value: Any) -> Any:
    """A usage as the API gives it: a record's dict as it is, an event's `UsageRecord` as a
    dict, none as ``{}``."""
    if value is None:
        return {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


Usage = Annotated[dict[str, Any], BeforeValidator(_as_dict)]
"""Tokens: ``prompt_tokens``, ``completion_tokens``, ``calls``, ``unknown_calls``."""


class _Record(BaseModel):
    """A body validated from a record (or a state of the fold) by its attributes."""

    model_config = ConfigDict(from_attributes=True, populate_by_name=True)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


PROJECT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""A project's name."""


class SubmitRequest(_Body):
    """A run to queue: a recipe of the server's folder by id, or (when the server allows it)
    recipe YAML inline."""

    recipe: str | None = Field(None, description="The id of a recipe in the server's folder.")
    recipe_yaml: str | None = Field(
        None, description="Recipe YAML (only with `minions serve --allow-inline-recipes`)."
    )
    inputs: dict[str, Any] = Field(default_factory=dict, description="The run's inputs.")
    idempotency_key: str | None = Field(
        None,
        max_length=200,
        description="Submitting again with the same key returns the same run.",
    )
    project: str | None = Field(
        None,
        pattern=PROJECT_PATTERN,
        description="The run's project: one of the key's (default: its only one; for an "
        "admin, `default`). A key of several projects names it.",
    )


class Decision(_Body):
    """A decision on a call the run waits for."""

    approve: bool
    reason: str | None = Field(None, description="Why not (goes to the model on a rejection).")


class ErrorDetail(BaseModel):
    type: str
    message: str
    state: str | None = Field(
        None, description="With `wrong_state`: the run's status when the request came."
    )


class ErrorBody(BaseModel):
    """Every error: a type to branch on and a message for people."""

    error: ErrorDetail


class SubmitOut(BaseModel):
    """What `POST /runs` answers: the run's id, its status, and whether this submit queued it."""

    run_id: str
    status: Status
    created: bool = Field(description="False: the idempotency key named an earlier run.")


class StepOut(_Record):
    """A finished step execution (a visit of the step, or one loop item)."""

    step_id: str
    visit: int
    status: str
    output: Any = None
    error: str | None = None
    usage: Usage = Field(default_factory=dict)
    attempts: int = Field(1, description="Model calls, a retried call counted once.")
    items: int = Field(0, description="How many loop items it ran (0: not a loop).")
    started_at: float | None = Field(None, description="Unix seconds (none: skipped).")
    finished_at: float | None = None
    model_calls: int = Field(0, description="Model calls, retries included.")
    tool_calls: int = 0
    duration: float | None = None
    waited: float = Field(
        0.0,
        description="Seconds of `duration` it waited (its model calls for their endpoint's "
        "limits, its tool calls for approval) rather than worked.",
    )
    reused_from: str | None = Field(
        None, description="For a step a rerun reused (status `reused`): the run that ran it."
    )
    reused_usage: Usage = Field(
        default_factory=dict, description="For a reused step: its original execution's usage."
    )
    loop_items: list[StepOut] = Field(
        default_factory=list, description="Its loop items (`step[0]`, `step[1]`...), in order."
    )


class ApprovalOut(_Record):
    call_id: str
    step_id: str
    tool: str
    arguments: Any = None
    requested_at: float
    decided_at: float | None = None
    approved: bool | None = None
    reason: str | None = None
    decided_by: str | None = Field(
        None,
        description="Who decided: a key's name, `token` (the server's token), `cli:USER`, or "
        "`timeout` (nobody decided in time).",
    )
    due_at: float | None = Field(
        None, description="When it times out undecided (the recipe's `approval.timeout`)."
    )
    on_timeout: str | None = Field(
        None, description="What its timeout does: `reject` the call or `fail` the run."
    )
    escalate_at: float | None = Field(
        None, description="When it is escalated undecided (`approval.escalate_after`)."
    )
    escalated_at: float | None = Field(None, description="When it was escalated.")


class Ticket(BaseModel):
    ticket: str = Field(description="Pass as `?ticket=` to the run's event stream.")
    expires_at: int = Field(description="When it stops opening the stream (Unix seconds).")


class GraphNode(_Record):
    id: str
    kind: str
    depends_on: list[str] = Field(default_factory=list)
    next: list[str] = Field(default_factory=list)


class RunSummary(_Record):
    run_id: str
    recipe: str = Field(validation_alias=AliasChoices("recipe", "recipe_id"))
    status: Status
    outcome: Outcome = Field(
        description="How the run stands for a person: its status, but `rejected` for a run "
        "that failed after a person rejected one of its calls (its status stays `failed`)."
    )
    rejected_by: str | None = Field(
        None, description="For a rejected outcome: who rejected (the latest rejection)."
    )
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    usage: Usage = Field(default_factory=dict)
    error: str | None = None
    executor_id: str | None = None
    schedule: str | None = Field(None, description="The schedule that fired the run.")
    slot: float | None = Field(None, description="The schedule's slot it was fired for.")
    project: str = Field("default", description="The run's project.")
    held_back: str | None = Field(
        None,
        description="Why a queued run waits: its project is at a limit (`max_runs_in_flight`, "
        "`tokens_per_day`); a worker queues it when there is room.",
    )


class RunOut(RunSummary):
    inputs: dict[str, Any] = Field(default_factory=dict)
    output: Any = None
    steps: list[StepOut] = Field(default_factory=list)
    approvals: list[ApprovalOut] = Field(default_factory=list)
    graph: list[GraphNode] = Field(default_factory=list, description="The recipe's steps.")
    parent_run_id: str | None = Field(None, description="For a rerun: the run it reran.")
    from_step: str | None = Field(None, description="For a rerun: the step it reran from.")
    rerun_from: list[str] = Field(
        default_factory=list,
        description="The steps a rerun of it is offered from (`POST /runs/{run_id}/rerun`): "
        "none before it ends; then those that ran in it (completed, failed or reused, or a "
        "call of theirs waited for a decision).",
    )
    queued_by: str | None = Field(
        None,
        description="Who queued its current attempt (submitted, reran or resumed it): a key's "
        "name, `token`, `cli:USER`, `schedule:NAME` (null: a worker took it over).",
    )
    cancelled_by: str | None = Field(None, description="Who asked for its cancel.")


class HistoryOut(_Record):
    """How far the stored runs go back."""

    oldest_at: float | None = Field(description="When the oldest stored run was created.")
    pruned_before: float | None = Field(
        None, description="Runs that finished before this were pruned (null: never pruned)."
    )
    pruned_at: float | None = Field(None, description="When that prune ran.")
    pruned_by: str | None = Field(None, description="Who ran that prune.")


class RunPage(BaseModel):
    runs: list[RunSummary]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")
    history: HistoryOut | None = Field(None, description="How far the stored runs go back.")
    total: int = Field(description="The runs of every page with these filters.")


class MessageOut(_Record):
    """One message of a model call's request, as content capture kept it."""

    role: str
    text: str


class ModelCallOut(_Record):
    """One attempt of a model call of the step."""

    item: int | None = Field(None, description="The loop item it belongs to.")
    visit: int
    turn: int
    attempt: int
    model: str = ""
    started_at: float
    finished_at: float | None = Field(None, description="None: not over (or cut short).")
    usage: Usage = Field(default_factory=dict)
    finish_reason: str | None = None
    tool_calls: list[str] = Field(default_factory=list, description="The calls it asked for.")
    output_mode: str | None = None
    error: str | None = None
    messages: list[MessageOut] = Field(
        default_factory=list,
        description="The request's messages, bounded; empty when content capture was off "
        "(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true where the run ran keeps them).",
    )
    messages_omitted: int = Field(
        0, description="Messages of the request left out of `messages` to keep it bounded."
    )
    answer: str | None = Field(
        None, description="The answer's text, bounded; None when not captured (or failed)."
    )


class ToolCallOut(_Record):
    """A tool call of the step, its attempts together."""

    item: int | None = None
    visit: int
    call_id: str
    name: str
    arguments: Any = None
    attempts: int = 1
    result: str | None = Field(None, description="What the tool returned (as the model saw it).")
    error: str | None = None
    started_at: float
    finished_at: float | None = None


class RetryOut(_Record):
    """A model call, answer or tool call tried again."""

    item: int | None = None
    visit: int
    at: float
    target: str = Field(description="`model`, `output` (an answer re-asked) or `tool`.")
    attempt: int = Field(description="The attempt that failed.")
    delay: float = 0.0
    reason: str


class DecisionOut(_Record):
    """A completion link's decision on an answer."""

    item: int | None = None
    visit: int
    at: float
    link: str
    decision: str
    reason: str


class StepDetail(BaseModel):
    """One step of a run, from its stored events: every visit and loop item, the model calls
    (each attempt), tool calls (arguments and results), retries (with their reasons),
    completion decisions and approvals. Prompts and the model's text are not in the event
    log; a tool call's arguments and result are."""

    run_id: str
    step_id: str
    kind: str | None = Field(None, description="As in the run's graph.")
    status: str = Field(description="The last visit's: `pending` when it never started.")
    executions: list[StepOut] = Field(
        default_factory=list, description="Its finished visits, in order."
    )
    started_at: float | None = None
    finished_at: float | None = None
    waited: float | None = Field(
        None,
        description="Seconds its last visit waited (for its endpoint's limits, for approvals) "
        "rather than worked, once it ended.",
    )
    waiting: WaitKind | None = Field(
        None,
        description="What its last visit (or one of its loop items) waits for now: `approval` "
        "(a call waits for a person's decision) or `limit` (a model call waits for its "
        "endpoint's limits), as the kinds of `waits`; none while it works or once it ended.",
    )
    skipped: str | None = Field(None, description="Why it was skipped.")
    error: str | None = None
    usage: Usage = Field(
        default_factory=dict, description="The last visit's tokens (a failed one's too)."
    )
    model_calls: list[ModelCallOut] = Field(default_factory=list)
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    retries: list[RetryOut] = Field(default_factory=list)
    decisions: list[DecisionOut] = Field(default_factory=list)
    approvals: list[ApprovalOut] = Field(default_factory=list)


class WaitOut(_Record):
    """A wait inside an execution: for a person's decision on a call (`kind` `approval`), or
    for a model endpoint's limits before a model call is sent (`kind` `limit`)."""

    kind: WaitKind
    started_at: float
    ended_at: float | None = Field(None, description="None: it goes on.")
    call_id: str | None = Field(None, description="The call waiting for a decision.")
    name: str = Field("", description="The tool of that call.")
    approved: bool | None = Field(None, description="The decision (None: not made yet).")
    reason: str | None = Field(None, description="Why the call was rejected.")
    endpoint: str = Field("", description="The limits' entry that holds the model call.")
    model: str = ""
    limit: str | None = Field(
        None,
        description="Which limit holds it: `max_concurrent`, `requests_per_minute`, "
        "`tokens_per_minute` or `retry_after`.",
    )
    delay: float | None = Field(None, description="Seconds it should wait, when known.")


class ExecutionOut(_Record):
    """One execution of a step (a visit of it, or one of its loop items) as the run's events
    tell it, with what the store kept of it once it ended."""

    step_id: str = Field(description="`step`, or `step[2]` for a loop item.")
    step: str = Field(description="The step's id.")
    item: int | None = Field(description="The loop item's index (none: the step itself).")
    visit: int
    status: ExecutionStatus
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    skipped: str | None = Field(None, description="Why it was skipped.")
    usage: Usage = Field(default_factory=dict, description="Its tokens, told when it ended.")
    spent: Usage = Field(
        default_factory=dict, description="The tokens of its own model calls so far."
    )
    model_calls: int = Field(0, description="Its model call attempts that ended.")
    tool_calls: int = Field(0, description="Its tool calls that ended.")
    items_started: int = Field(0, description="A loop step's items started in this visit.")
    items_done: int = Field(0, description="And ended.")
    starts: int = Field(
        0,
        description="How many times it started (more than once: its run went on after a "
        "failure or a crash, and it ran again).",
    )
    reused_from: str | None = Field(None, description="For a reused step: the run that ran it.")
    waited: float = Field(
        0.0,
        description="Seconds of its time it waited (its model calls for their endpoint's "
        "limits, its tool calls for approval) rather than worked, told when it ended.",
    )
    retries: list[RetryOut] = Field(default_factory=list)
    waits: list[WaitOut] = Field(default_factory=list)


class StepStates(BaseModel):
    """A run's steps as the one fold of its events tells them: `GET /runs/{run_id}/steps`,
    and the `states` messages of its event stream (with `?states=true`)."""

    run_id: str
    seq: int = Field(description="The last event folded in.")
    full: bool = Field(
        True,
        description="True: every execution (replace what you have); false, in a message of "
        "the stream: only those its last event changed.",
    )
    steps: dict[str, ExecutionStatus] = Field(
        description="Each step's status (its latest visit's), loop items left out."
    )
    executions: list[ExecutionOut]

    @classmethod
    def of(
        cls, run_id: str, states: RunStates, changed: list[Execution] | None = None
    ) -> StepStates:
        """What `states` tell: every execution, or only those an event `changed` (and the
        status of their steps)."""
        if changed is None:
            executions, steps = states.executions, states.steps()
        else:
            executions = changed
            steps = {e.step_id: states.status_of(e.step_id) for e in changed if e.item is None}
        return cls(
            run_id=run_id,
            seq=states.seq,
            full=changed is None,
            steps=steps,
            executions=[ExecutionOut.model_validate(e) for e in executions],
        )


class RecipeOut(BaseModel):
    id: str
    description: str = ""
    file: str = Field(description="The file, relative to the recipes folder.")
    inputs: dict[str, Any] = Field(description="A JSON Schema of the inputs.")


class WorkerOut(_Record):
    """A worker as its heartbeats tell of it, with the runs it holds now."""

    executor_id: str
    started_at: float
    heartbeat_at: float = Field(description="Its last heartbeat (Unix seconds).")
    stopped_at: float | None = Field(None, description="When it stopped (None: it did not).")
    alive: bool = Field(description="It beat within the dead-worker timeout and did not stop.")
    version: str = Field(description="Its application version (minions' durable format).")
    runs: list[str] = Field(description="The runs it runs now, under its lease.")
    places: int | None = Field(
        None, description="Runs it runs at a time: its own --concurrency (None: not said)."
    )
    host: str | None = None
    pid: int | None = None


class EndpointLoadOut(_Record):
    in_flight: int = Field(description="Calls holding a place now, over every worker.")
    waiting: int = Field(description="Workers whose callers wait in the store's line.")
    requests: int = Field(description="Calls started within the last minute.")
    tokens: int = Field(description="Their tokens (estimated at the start, then reported).")
    paused_until: float = Field(
        description="No call goes before this (a 429's Retry-After; Unix seconds, 0: none)."
    )


class LearnedOut(_Record):
    model: str
    output_mode: str | None = Field(description="The structured-output mode that worked.")
    rejected: list[str] = Field(description="What it refused.")
    learned_at: float
    expires_at: float


class EndpointStatusOut(_Record):
    """A model endpoint: its load under the limits and what it taught."""

    endpoint: str = Field(description="The limits' match (base URL or URL#model).")
    load: EndpointLoadOut | None = Field(description="None: no entry of the limits holds it.")
    learned: list[LearnedOut]


class QueuedRunOut(_Record):
    run_id: str
    recipe_id: str
    created_at: float
    schedule: str | None = None


class RecipeBacklog(_Record):
    recipe: str = Field(validation_alias=AliasChoices("recipe", "recipe_id"))
    queued: int
    oldest_queued_at: float


class QueueOut(_Record):
    """The backlog now."""

    at: float
    queued: int
    oldest_queued_at: float | None
    oldest_queued_seconds: float = Field(
        validation_alias=AliasChoices("oldest_queued_seconds", "oldest_queued_age"),
        description="How long the oldest queued run waited.",
    )
    running: int
    waiting: int = Field(description="Runs waiting for a person (they hold no worker place).")
    by_recipe: list[RecipeBacklog]
    oldest: list[QueuedRunOut] = Field(description="The oldest queued runs, oldest first.")


class UsageRowOut(_Record):
    day: str | None = None
    recipe: str | None = None
    schedule: str | None = None
    model: str | None = None
    project: str | None = None
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    calls: int = Field(description="Model call attempts (retries included).")
    unknown_calls: int = Field(description="Attempts whose server reported no usage.")
    cost: float | None = Field(
        description="US dollars of the attempts the price table prices (None: none is)."
    )
    unpriced_calls: int = Field(
        description="Attempts not in `cost`: unknown model, endpoint or tokens."
    )


class UsageOut(_Record):
    """Tokens and cost of the model calls of a span of time."""

    since: float
    until: float
    group_by: list[str]
    rows: list[UsageRowOut]
    total: UsageRowOut
    prices: str = Field(description="The price table: its package and version.")


class Streams(BaseModel):
    """The event streams of this process (each back to 0 once its clients have gone)."""

    open: int = Field(description="Event streams open now.")
    runs_followed: int = Field(description="Runs read for them (one reader per run).")
    live_subscriptions: int = Field(
        description="Their subscriptions to the in-process worker's live events."
    )


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    version: str
    streams: Streams
    worker: Literal["none", "starting", "running", "degraded", "stopped", "failed"] = Field(
        description="The worker in the server's process (`none`: served with --no-worker)."
    )
    error: str | None = Field(
        None, description="Why it is unavailable: the run store, or the worker, is not usable."
    )


class Probe(BaseModel):
    """A liveness or readiness probe's answer."""

    status: Literal["ok", "unavailable"]
    reason: str | None = Field(None, description="Why it is not ready.")


class DeliveryOut(_Record):
    """How notifications to one target fared."""

    target: str = Field(description="Its origin and id (never its path: often a secret).")
    delivered: int
    pending: int = Field(description="Not delivered yet: being retried.")
    failed: int = Field(description="Given up after the last retry.")
    last_delivered_at: float | None
    last_error: str | None = Field(description="The last send's error (None: it worked).")
    last_attempt_at: float | None
