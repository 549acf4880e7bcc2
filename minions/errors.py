"""The exceptions of minions: one root, `MinionsError`, and a subclass per kind of problem.

Two families matter to users:

* **Definition errors** (`StepDefinitionError`, `ToolDefinitionError`, `TemplateSyntaxError`, ...)
  are raised before anything runs: the recipe, step or tool is wrong and no model call is made.
* **Run-time failures** never escape `StepExecutor.execute()`: they end the step as FAILED with a
  reason. Providers raise `TransientModelError`, `ModelOutputError` and `ModelError` to tell the
  step loop whether to retry, re-ask or give up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from minions._values import ModeDemotion, OutputMode, Usage

__all__ = [
    "BudgetExceededError",
    "ConfigError",
    "DiffTooLargeError",
    "InputError",
    "KeyExistsError",
    "MCPServerError",
    "IdempotencyConflictError",
    "MinionsError",
    "MissingDepsError",
    "MissingExtraError",
    "ModelError",
    "ModelOutputError",
    "OutputValidationError",
    "PlanError",
    "Problem",
    "ApprovalRequiredError",
    "Reask",
    "RecipeError",
    "RecordingError",
    "RerunError",
    "RunStateError",
    "ScheduleExistsError",
    "ScriptExhaustedError",
    "StepDefinitionError",
    "StepFailed",
    "StoreError",
    "StreamingWarning",
    "TemplateError",
    "TemplateSyntaxError",
    "ToolDefinitionError",
    "ToolError",
    "TransientModelError",
    "UnknownLinkError",
    "UnknownRecipeError",
    "UnknownKeyError",
    "UnknownProjectError",
    "UnknownRunError",
    "UnknownScheduleError",
    "UnknownStepError",
]


class MinionsError(Exception):
    """The root of every error minions raises on purpose."""


class MissingExtraError(MinionsError, ImportError):
    """A feature needs packages of an optional extra that are not installed; the message
    says what to install (``pip install 'minions[otel]'``)."""


class StepDefinitionError(MinionsError):
    """A step is wrongly defined (unknown tool, empty goal, invalid output schema, ...).

    Raised before any model call. `problems` lists every problem found, each naming the step.
    """

    def __init__(self, problems: Sequence[str | Problem] | str) -> None:
        given = [problems] if isinstance(problems, str) else problems
        self.problems = [p if isinstance(p, str) else p.describe() for p in given]
        super().__init__("; ".join(self.problems))


class ConfigError(MinionsError, ValueError):
    """An `ExecutionConfig` value is out of range, or an override names no config field."""


class UnknownLinkError(MinionsError, LookupError):
    """A completion or selection chain has no link with the name (or class) asked for."""


class RecordingError(MinionsError):
    """A recording file cannot be used: missing, not JSON, or not in the recording format."""


class ToolDefinitionError(MinionsError):
    """A function cannot be turned into a tool (bad annotations, non-serializable return type)."""


class ToolError(MinionsError):
    """A tool call failed: unknown tool, invalid arguments, or the tool raised.

    The message goes back to the model as the result of that tool call.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class TemplateError(MinionsError):
    """A `{{ expression }}` could not be rendered, e.g. its value is missing from run state."""

    def __init__(self, message: str, *, expression: str, missing: bool = False) -> None:
        super().__init__(message)
        self.expression = expression
        self.missing = missing
        """The expression has no value (rather than failing to evaluate)."""


class TemplateSyntaxError(TemplateError):
    """A `{{ expression }}` is not valid JMESPath or refers to nothing that can exist."""


class ModelError(MinionsError):
    """A model call failed in a way that retrying will not fix (HTTP 400/401/403/404, ...).

    `demoted` lists the structured-output modes the call learned the endpoint cannot do;
    `usage` is what the failed call cost, when that is known (zero tokens for a request that
    never reached the server).
    """

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.demoted: tuple[ModeDemotion, ...] = ()
        self.usage: Usage | None = None


class TransientModelError(ModelError):
    """A model call failed in a way that may pass: timeout, connection error, 429 or 5xx.

    The step loop restores the conversation and retries with backoff. `retry_after` (seconds)
    is the server's hint, honoured when given.
    """

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class ModelOutputError(ModelError):
    """The model answered, but the answer is unusable (bad tool-argument JSON, a `length`
    cut-off, output that fails its schema).

    The step loop restores the conversation and re-asks with `note`, one short sentence
    saying what was wrong, written for the model ("Answer again, more briefly"); `reason` says
    it for a person (events, errors, logs), and is the message; by default the note.
    `usage` is what the failed answer cost, counted in the step's usage; `mode` is the
    structured-output mode the answer was asked in, recorded on the failed `ModelCall`.
    """

    def __init__(
        self,
        note: str,
        *,
        reason: str | None = None,
        usage: Usage | None = None,
        mode: OutputMode | None = None,
    ) -> None:
        super().__init__(reason or note)
        self.note = note
        self.reason = reason or note
        self.usage = usage
        self.mode = mode


class OutputValidationError(MinionsError):
    """Output did not validate against its `OutputInstructions` schema."""


class Reask(MinionsError, ValueError):
    """Raise it in a validator (`DefaultStep(validators=[...])`) to reject the model's output:
    the step re-asks the model with `message` (as it does for a `ValueError`), within
    `ExecutionConfig.max_output_retries`, and records the re-ask as a decision.

    Args:
        message: what was wrong, for the model ("amount_eur cannot be negative").
        reason: the same for people (events, decisions, the step's error when it gives up);
            `message` by default.
    """

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or message


class StepFailed(MinionsError):
    """A step did not complete, and its output was asked for (`StepExecution.result()`).

    Attributes:
        step_id: the step (``step[index]`` for a loop item).
        status: how it ended: ``failed`` or ``skipped`` (or ``pending`` / ``in_progress``
            for an execution that has not ended).
        reason: why, as `StepExecution.error` says it.
    """

    def __init__(self, step_id: str, status: str, reason: str) -> None:
        super().__init__(f"step {step_id!r} {status}: {reason}")
        self.step_id = step_id
        self.status = status
        self.reason = reason


class MissingDepsError(MinionsError):
    """A tool read `ToolContext.deps` in a run that was given no ``deps``.

    Not the model's to handle: the step fails with this message, which says where deps are
    given (`step.run(deps=...)`, `AgentExecutor.execute(..., deps=...)`, `AgentContext(deps=...)`,
    or a durable worker's ``deps`` factory).
    """


class StreamingWarning(UserWarning):
    """A model answered without streaming while something could have used its text deltas
    (`TokenDelta` events): said once per model. Filter it with the `warnings` module."""


class BudgetExceededError(MinionsError):
    """A token budget (per step or per run) would be exceeded by another model call."""


class ScriptExhaustedError(ModelError):
    """A `ScriptedModel` was asked for more replies than its script holds."""


class UnknownRecipeError(MinionsError, LookupError):
    """No recipe is registered under the id asked for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong with a recipe, located as precisely as possible."""

    message: str
    file: str = ""
    line: int | None = None
    step: str | None = None
    field: str | None = None

    def describe(self) -> str:
        """The problem as a step definition error says it: ``step 'x': message``."""
        return f"step {self.step!r}: {self.message}" if self.step is not None else self.message

    def __str__(self) -> str:
        where = self.file or "recipe"
        if self.line is not None:
            where += f":{self.line}"
        parts = []
        if self.step is not None:
            parts.append(f"step {self.step!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        context = ", ".join(parts)
        return f"{where}: {context + ': ' if context else ''}{self.message}"


class RecipeError(MinionsError):
    """A recipe is invalid. `problems` holds every problem found, not just the first."""

    what = "recipe"

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = "1 problem" if count == 1 else f"{count} problems"
        super().__init__(f"invalid {self.what} ({head}):\n" + "\n".join(f"  {p}" for p in problems))


class InputError(RecipeError):
    """A run's inputs do not match what the recipe declares (nothing has run)."""

    what = "inputs"


class PlanError(RecipeError):
    """A plan cannot be made or run: empty requirements, a planner answer that is not a valid
    plan (after one re-ask with the problems), a tool or a workspace that does not exist.
    Nothing has run."""

    what = "plan"


def is_transient(error: BaseException) -> bool:
    """Errors worth retrying (and then trying another model for): timeouts, connection
    errors, 408, 409, 429 and 5xx."""
    return isinstance(error, TransientModelError | TimeoutError | ConnectionError)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to a wrong one, else ``""``."""
    import difflib

    match = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


class StoreError(MinionsError):
    """The run store cannot be used: unreachable, not a minions store, or made by a newer
    minions."""


class UnknownRunError(MinionsError):
    """No run has this id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}")
        self.run_id = run_id


class UnknownStepError(MinionsError, LookupError):
    """A run has no step (or loop item) of this id: none in its recipe, and none ran."""

    def __init__(self, run_id: str, step_id: str, steps: Sequence[str] = ()) -> None:
        known = f" (its steps: {', '.join(steps[:20])}{', ...' if len(steps) > 20 else ''})"
        super().__init__(
            f"run {run_id} has no step {step_id!r}{known if steps else ''}; a loop item is "
            "written step[i], e.g. each[0]"
        )
        self.run_id = run_id
        self.step_id = step_id


class UnknownScheduleError(MinionsError, LookupError):
    """No schedule has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule {name!r}")
        self.name = name


class UnknownProjectError(MinionsError, LookupError):
    """A project that is not the caller's (a key's projects are all it knows of; another
    project is as unknown as one that does not exist)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no project {name!r} for this key")
        self.name = name


class ScheduleExistsError(MinionsError):
    """A schedule with this name exists already (add it again with ``replace``)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"a schedule {name!r} exists already: add it with --replace (replace=True) to "
            "update its recipe and timing, or give another --name"
        )
        self.name = name


class UnknownKeyError(MinionsError, LookupError):
    """No API key that is not revoked has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no key {name!r} (`minions keys list` lists them)")
        self.name = name


class KeyExistsError(MinionsError):
    """An API key with this name exists already (revoke it first, or give another name)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"a key {name!r} exists already: revoke it first (`minions keys revoke {name}`) "
            "or give another name"
        )
        self.name = name


class RunStateError(MinionsError):
    """The run is in the wrong state for what was asked (resume a completed run, approve a
    run that waits for nothing, a call decided already). `status` is the run's status then."""

    def __init__(self, message: str, *, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class RerunError(MinionsError, ValueError):
    """A rerun cannot be made as asked: an unknown step, an output set on a step that runs
    again, or an output its step's schema refuses."""


class DiffTooLargeError(MinionsError):
    """Two runs' step outputs hold more values than a diff compares (see
    `RunStore.diff`'s `max_values`)."""

    def __init__(self, run_a: str, run_b: str, limit: int) -> None:
        super().__init__(
            f"runs {run_a} and {run_b} are too large to diff: their step outputs hold more "
            f"than {limit:,} JSON values (the most one diff compares)"
        )
        self.limit = limit


class IdempotencyConflictError(MinionsError):
    """An idempotency key named an earlier request that differs from this one (another
    recipe, recipe version or inputs, or another project: then `run_id` is None, the run is
    not the caller's to know): a key names one request."""

    def __init__(self, key: str, run_id: str | None) -> None:
        super().__init__(
            f"idempotency key {key!r} was used in another project: use a new key"
            if run_id is None
            else f"idempotency key {key!r} was used for run {run_id} with another recipe, "
            "recipe version or inputs: use a new key for a new request"
        )
        self.key = key
        self.run_id = run_id


class ApprovalRequiredError(MinionsError):
    """A tool needs a person's approval and the run has no way to ask for it (no approver:
    `minions run` asks on a terminal, or takes `--approve-all`)."""


class MCPServerError(MinionsError):
    """An MCP server of a run cannot be used: it did not start or list its tools in time, two
    tools would reach the model under one name, a step asks for a tool the server does not
    offer, or the MCP SDK is not installed (``pip install 'minions[mcp]'``)."""
