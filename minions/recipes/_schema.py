"""The YAML recipe format, as pydantic models (and so as a JSON Schema for editors)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from minions._step.step import (
    MAX_ID_LENGTH,
    RECIPE_ID_PATTERN,
    STEP_ID_PATTERN,
    recipe_id_problem,
    step_id_problem,
)
from minions.models._internal import model_string_problem

__all__ = ["InputSpec", "RecipeSpec"]

InputType = Literal["string", "integer", "number", "boolean", "array", "object"]
KIND_KEYS = ("goal", "tool", "analyze", "recipe")


def _checked(problem: Callable[[object], str | None]) -> AfterValidator:
    """A validator that refuses what `problem` finds wrong, with its message."""

    def check(value: str) -> str:
        found = problem(value)
        if found is not None:
            raise ValueError(found)
        return value

    return AfterValidator(check)


def _id_schema(pattern: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": pattern, "maxLength": MAX_ID_LENGTH})


StepId = Annotated[str, _checked(step_id_problem), _id_schema(STEP_ID_PATTERN)]
RecipeId = Annotated[str, _checked(recipe_id_problem), _id_schema(RECIPE_ID_PATTERN)]


def _distinct(models: list[str]) -> list[str]:
    twice = sorted({m for m in models if models.count(m) > 1})
    if twice:
        raise ValueError(
            f"model {twice[0]!r} is listed twice; a fallback tries each model once, in order"
        )
    return models


ModelString = Annotated[str, _checked(model_string_problem)]
MODEL_TAGS: Final = ("model-string", "model-list")
"""The branches of `ModelSpec` (taken out of problems' locations)."""
ModelSpec = (
    Annotated[
        Annotated[ModelString, Tag(MODEL_TAGS[0])]
        | Annotated[
            list[ModelString], Field(min_length=1), AfterValidator(_distinct), Tag(MODEL_TAGS[1])
        ],
        # One branch by the value's shape, so a problem is told once, about that branch.
        Discriminator(lambda value: MODEL_TAGS[isinstance(value, list)]),
    ]
    | None
)
"""A model string, or a list of them: a `FallbackModel` trying each in order."""
_MODEL_HELP: Final = (
    "A model string, e.g. 'ollama:llama3.2:3b' or 'openai:gpt-4o-mini', or a list of them "
    "tried in order when one is down (connection errors, 5xx, 429)."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class InputSpec(_Strict):
    """An input of the recipe, checked when a run starts."""

    type: InputType = Field("string", description="The JSON type of the value.")
    default: Any = Field(None, description="The value when none is given; absent: required.")
    description: str = ""
    enum: list[Any] | None = Field(None, description="The only values allowed.")
    required: bool | None = Field(
        None, description="Defaults to true without a default, false with one."
    )


class NextSpec(_Strict):
    """A transition to another step, taken when `when` is true (or always)."""

    step: str = Field(description="The id of the step to go to.")
    when: str | None = Field(
        None,
        description="A JMESPath condition over this step's result, e.g. "
        '"output.approved == `true`" or a {{ template }}.',
    )


class LoopSpec(_Strict):
    """Run the step once per item."""

    items: Any = Field(description="A list, or a {{ template }} giving one.")
    parallel: int = Field(1, ge=1, description="How many items may run at once.")
    continue_on_error: bool = Field(False, description="Complete even when items failed.")


class HttpSpec(_Strict):
    """Enables the built-in `http_get` tool."""

    enabled: bool = True
    allowed_hosts: list[str] | None = None


class MCPStdioSpec(_Strict):
    """An MCP server started as a child process (stdio). `${VAR}` in any value is read from
    the environment when the recipe loads."""

    command: str = Field(description="The program, e.g. python or npx.")
    args: list[str] = Field(default_factory=list, description="Its arguments.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Its environment; besides these it gets only HOME, LOGNAME, PATH, SHELL, "
        "TERM and USER.",
    )
    cwd: str | None = Field(None, description="Its folder, relative to the recipe's.")
    timeout: float = Field(
        30, gt=0, description="Seconds to start and list its tools, and to answer each call."
    )


class MCPHttpSpec(_Strict):
    """An MCP server reached over streamable HTTP."""

    url: str = Field(description="Its endpoint, e.g. http://127.0.0.1:8000/mcp.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Sent with every request (`${TOKEN}` expands)."
    )
    timeout: float = Field(
        30, gt=0, description="Seconds to connect and list its tools, and to answer each call."
    )


def _servers(value: Any) -> Any:
    # Each server is checked when the recipe is built, where its line is known (see
    # minions.tools._mcp.server_config); the models above are the JSON Schema of them.
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of server names to servers")
    return value


def _shorthands(schema: dict[str, Any]) -> None:
    """The JSON Schema says what the loader accepts: the one-string and list shorthands the
    validators below turn into the full form."""
    properties = schema["properties"]
    properties["loop"]["anyOf"][1:1] = [
        {"type": "string", "description": "A {{ template }} giving the items."},
        {"type": "array", "description": "The items."},
    ]
    for name in ("depends_on", "tools", "next", "reads", "artifacts"):
        full = properties[name]
        kept = {key: full[key] for key in ("title", "description") if key in full}
        properties[name] = {"anyOf": [{"type": "string"}, full], **kept}


def _rule(
    message: str,
    *,
    about: tuple[str, ...],
    leave_out: Sequence[str] | None = None,
    put: Mapping[str, Any] | None = None,
) -> PydanticCustomError:
    """A rule of a whole step broken: `message`, the fields it is `about`, and what the loader
    changes in the step (fields to `leave_out`, by default the first one it is about; values
    to `put`) to check the rest of the recipe in the same pass."""
    return PydanticCustomError(
        "step_rule",
        message,
        {
            "about": about,
            "leave_out": tuple(about[:1] if leave_out is None else leave_out),
            "put": dict(put or {}),
        },
    )


class CacheSpec(_Strict):
    """A step's use of the step cache."""

    ttl: float | str | None = Field(
        None,
        description="How long an entry serves: seconds, or '90s', '30m', '1h', '2d', '2w' "
        "(default: as long as the cache keeps it).",
    )
    side_effects: bool = Field(
        False,
        description="Cache the step even though its tools have side effects or need approval "
        "(a hit skips them).",
    )

    @field_validator("ttl")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        from minions._step.cache import duration
        from minions.errors import StepDefinitionError

        try:
            duration(value)
        except StepDefinitionError as exc:
            raise ValueError(str(exc)) from None
        return value


def _switch_or_mapping(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    return "mapping" if isinstance(value, dict | BaseModel) else None


def _switch_or(form: str) -> Discriminator:
    """``true``, ``false`` or a spec's mapping: one error, about the form given."""
    return Discriminator(
        _switch_or_mapping,
        custom_error_type="switch_or_mapping",
        custom_error_message=f"must be true, false or {form}",
    )


CacheForm = Annotated[
    Annotated[bool, Tag("bool")] | Annotated[CacheSpec, Tag("mapping")],
    _switch_or("{ttl: ..., side_effects: ...}"),
]


class StepSpec(_Strict):
    """One step. Its kind comes from the key it has: `goal` (agent step), `tool` (tool step),
    `analyze` (analysis step) or `recipe` (sub-recipe step)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra=_shorthands)

    id: StepId = Field(
        description="Unique within the recipe: letters, digits, '_' or '-', not starting with "
        "a digit."
    )
    description: str = ""

    # agent step
    goal: str | None = Field(None, description="What the model must do (agent step).")
    system: str | None = Field(None, description="The system prompt.")
    tools: list[str] = Field(
        default_factory=list,
        description="Tools the model may call: names, or SERVER.TOOL / SERVER.* of an MCP server.",
    )
    completion_marker: str | None = None

    # task step (a step of a plan: an agent step with `type`)
    type: Literal["analyze", "generate", "modify", "validate", "cleanup"] | None = Field(
        None,
        description="Makes an agent step a task step of a plan: its goal, the files in "
        "`reads` and its dependencies' artifacts, nothing else (see docs/plans.md).",
    )
    reads: list[str] = Field(
        default_factory=list, description="Task step: workspace files whose content it needs."
    )
    artifacts: list[str] = Field(
        default_factory=list, description="Task step: what it produces (file paths, results)."
    )

    # tool step
    tool: str | None = Field(None, description="A tool to call directly (tool step).")
    params: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")
    requires_approval: bool = Field(
        False, description="A person approves the call first (tool step); see docs/runs.md."
    )
    fill_missing: Literal["model"] | None = Field(
        None, description="Let the model extract parameters whose templates have no value."
    )

    # analysis step (also `tool: llm_analyze` with context / input / output_format)
    analyze: str | None = Field(None, description="What to work out from `input`.")
    input: Any = Field(None, description="The data an analysis step works on.")
    context: str | None = Field(None, description="For `tool: llm_analyze`: the instructions.")
    output_format: Any = Field(None, description="For `tool: llm_analyze`: the output.")

    # sub-recipe step
    recipe: str | None = Field(None, description="Another recipe file, run as one step.")
    inputs: dict[str, Any] = Field(default_factory=dict, description="The sub-recipe's inputs.")

    # every kind
    output: Any = Field(None, description="A JSON Schema, or an example object to infer one from.")
    depends_on: list[str] = Field(default_factory=list)
    next: list[NextSpec] = Field(default_factory=list)
    save_as: str | None = Field(None, description="Another name for this step's result.")
    loop: LoopSpec | None = Field(
        None, description="Run once per item: a list, a {{ template }}, or {items, parallel}."
    )
    parallel: int | None = Field(None, ge=1, description="With `loop`: items at once.")
    optional: bool = False
    mode: Literal["async", "sync", "fire_and_forget"] = "async"
    timeout: float | None = Field(None, gt=0, description="Seconds.")
    memory: Literal["step", "agent"] = "step"
    model: ModelSpec = Field(None, description=_MODEL_HELP)
    max_visits: int = Field(10, ge=1)
    config: dict[str, Any] = Field(default_factory=dict, description="ExecutionConfig overrides.")
    cache: CacheForm = Field(
        False,
        description="Reuse the output of an earlier execution with the same rendered prompt, "
        "model, tools and output schema instead of calling the model: true, or {ttl, "
        "side_effects}.",
    )

    @field_validator("depends_on", "tools", "reads", "artifacts", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("loop", mode="before")
    @classmethod
    def _loop_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str | list):
            return {"items": value}
        return value

    @field_validator("next", mode="before")
    @classmethod
    def _next_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"step": value}]
        if isinstance(value, list):
            return [{"step": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        present = [key for key in KIND_KEYS if getattr(self, key) is not None]
        if len(present) != 1:
            found = f"it has {', '.join(present)}" if present else "it has none"
            # Checked on as the first kind it has (an agent step when none), so that the
            # rest of the recipe is checked in the same pass (the loader says this problem).
            raise _rule(
                f"a step needs exactly one of goal (agent step), tool (tool step), analyze "
                f"(analysis step) or recipe (sub-recipe step); {found}",
                about=KIND_KEYS,
                leave_out=present[1:],
                put={} if present else {"goal": "(a step of no kind, checked as an agent step)"},
            )
        if self.parallel is not None and self.loop is None:
            raise _rule("`parallel` needs `loop`", about=("parallel", "loop"))
        if (self.reads or self.artifacts) and self.type is None:
            raise _rule(
                "`reads` and `artifacts` are for task steps: give the step a `type`",
                about=("reads", "artifacts", "type"),
                leave_out=("reads", "artifacts"),
            )
        if self.type is not None and self.goal is None:
            raise _rule(
                "`type` makes an agent step a task step: it needs a `goal`",
                about=("type", *KIND_KEYS),
            )
        if self.requires_approval and self.kind != "tool":
            raise _rule(
                "`requires_approval` is for tool steps; for a tool an agent step may call, "
                "declare it with @tool(requires_approval=True)",
                about=("requires_approval", *KIND_KEYS),
            )
        return self

    @property
    def kind(self) -> Literal["agent", "tool", "analysis", "recipe"]:
        if self.goal is not None:
            return "agent"
        if self.analyze is not None or self.tool == "llm_analyze":
            return "analysis"
        if self.tool is not None:
            return "tool"
        return "recipe"


CatchUp = Literal["none", "one", "all"]
Overlap = Literal["skip", "buffer_one", "allow"]


def _every_problem(value: object) -> str | None:
    from minions._duration import duration_seconds

    try:
        duration_seconds(str(value), whole=True)
    except ValueError as exc:
        return f"every: {exc}"
    return None


def _timezone_problem(value: object) -> str | None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(str(value))
    except (ZoneInfoNotFoundError, ValueError):
        return f"timezone: unknown time zone {value!r} (an IANA name, e.g. Europe/Paris or UTC)"
    return None


def cron_problem(value: object) -> str | None:
    """What is wrong with a cron expression (None: nothing, or no cron library to tell)."""
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:  # checked when the schedule is added (minions[durable] has it)
        return None
    from datetime import datetime

    try:
        CronSim(str(value), datetime.now(UTC))
    except CronSimError as exc:
        return f"cron: {value!r} is not a cron expression: {exc}"
    return None


class ScheduleSpec(_Strict):
    """When a recipe runs by itself: `minions schedules add RECIPE` registers it."""

    cron: Annotated[str, _checked(cron_problem)] | None = Field(
        None, description="A cron expression: minute hour day-of-month month day-of-week."
    )
    every: Annotated[str, _checked(_every_problem)] | None = Field(
        None,
        description="Or an interval: 30s, 5m, 1h, 1d (slots are multiples of it since "
        "1970-01-01 UTC).",
    )
    inputs: dict[str, Any] = Field(default_factory=dict, description="The runs' inputs.")
    name: Annotated[str, _checked(recipe_id_problem)] | None = Field(
        None, description="The schedule's name (default: the recipe's id), a slug."
    )
    timezone: Annotated[str, _checked(_timezone_problem)] = Field(
        "UTC", description="The time zone of the cron expression (an IANA name)."
    )
    catch_up: CatchUp = Field(
        "one",
        description="Slots missed while no worker ran (or the store was down): none (skip "
        "them, and a slot over a minute late), one (fire the latest), all (fire each).",
    )
    overlap: Overlap = Field(
        "skip",
        description="What a slot does while a run of the schedule is still active: skip "
        "(the default: it is skipped, and flagged late), buffer_one (one run waits in the "
        "queue behind it, no more) or allow (it fires all the same).",
    )

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleSpec:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give either `cron` or `every`")
        return self


def duration_problem(value: object) -> str | None:
    """What is wrong with a duration (the one grammar's words), None when nothing."""
    from minions._duration import duration_seconds

    try:
        duration_seconds(value)  # type: ignore[arg-type]
    except ValueError as exc:
        return str(exc)
    return None


Duration = Annotated[float | str, _checked(duration_problem)]


class ApprovalSpec(_Strict):
    """How long the calls of a durable run wait for a person's decision, and what then."""

    timeout: Duration | None = Field(
        None,
        description="Undecided this long (90s, 30m, 4h, 2d), a call times out (default: it "
        "waits as long as it takes).",
    )
    on_timeout: Literal["reject", "fail"] | None = Field(
        None,
        description="What a timeout does: reject (the default: the call is not made and the "
        "model is told why) or fail (the run fails, saying which call timed out).",
    )
    escalate_after: Duration | None = Field(
        None,
        description="Undecided this long, a call is escalated: an `approval_escalated` event "
        "(what notifications deliver); shorter than `timeout`.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ApprovalSpec:
        from minions._duration import duration_seconds

        if self.on_timeout is not None and self.timeout is None:
            raise ValueError("`on_timeout` says what a timeout does: give `timeout` too")
        if self.timeout is None and self.escalate_after is None:
            raise ValueError("give `timeout`, `escalate_after` or both")
        if (
            self.timeout is not None
            and self.escalate_after is not None
            and duration_seconds(self.escalate_after) >= duration_seconds(self.timeout)
        ):
            raise ValueError(
                f"`escalate_after` ({self.escalate_after}) must be shorter than `timeout` "
                f"({self.timeout}): a call that timed out is not escalated"
            )
        return self


class RecipeSpec(_Strict):
    """A recipe file as data: the YAML format of docs/recipes.md as a pydantic model, checked
    but not built (no tools module imported, no step made).

    `parse_spec` reads one from YAML text, with every problem named by line; a
    `RecipeFile` keeps the one it was built from (`RecipeFile.spec`). Its JSON Schema
    (``RecipeSpec.model_json_schema()``; ``minions schema`` prints it) is what editors check
    recipe files against.
    """

    # The schema keeps its one-line description: the docstring is for people reading code.
    model_config = ConfigDict(json_schema_extra={"description": "A recipe file."})

    id: RecipeId = Field(
        description="The recipe's name, a slug: letters, digits, '_' or '-', starting with a "
        "letter or a digit. It names the run's workspace folder."
    )
    description: str = ""
    model: ModelSpec = Field(None, description="The default model. " + _MODEL_HELP)
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="ExecutionConfig fields: max_parallel_steps, fail_fast, budgets, retries...",
    )
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    tools: list[str] = Field(
        default_factory=list,
        description="Python tools as 'package.module:function' (or 'package.module' for all "
        "tools of a module); built-ins are available by name.",
    )
    workspace: str | None = Field(
        None,
        description="The folder file tools may use (relative to the file); by default the "
        "run's own folder .minions/workspace/<recipe id> in the current directory.",
    )
    http: Annotated[
        Annotated[bool, Tag("bool")] | Annotated[HttpSpec, Tag("mapping")],
        _switch_or("{enabled: ..., allowed_hosts: [...]}"),
    ] = Field(False, description="Enable the http_get tool.")
    execution_mode: Literal["planned", "sequential"] = Field(
        "planned",
        description="planned: follow depends_on, in parallel; sequential: file order, one at a "
        "time.",
    )
    mcp_servers: Annotated[
        dict[str, Any],
        PlainValidator(_servers, json_schema_input_type=dict[str, MCPStdioSpec | MCPHttpSpec]),
    ] = Field(
        default_factory=dict,
        description="MCP servers whose tools steps may call, by name: a step's `tools` names "
        "one as SERVER.TOOL, or all of them as SERVER.*.",
    )
    steps: list[StepSpec] = Field(min_length=1)
    schedule: ScheduleSpec | None = Field(
        None,
        description="When the recipe runs by itself, once `minions schedules add` registered "
        "it (running the file directly ignores it).",
    )
    approval: ApprovalSpec | None = Field(
        None,
        description="How long its calls wait for a person's approval when it runs on a worker "
        "(`timeout`, `on_timeout`, `escalate_after`); `minions run` asks on the terminal.",
    )

    @field_validator("inputs", mode="before")
    @classmethod
    def _input_shorthand(cls, value: Any) -> Any:
        # `topic: string` is short for `topic: {type: string}`.
        if isinstance(value, dict):
            return {k: {"type": v} if isinstance(v, str) else v for k, v in value.items()}
        return value
