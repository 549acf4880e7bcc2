"""Steps: what one unit of agent work is, and how its prompt, tools and completion are built."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Never, TypeGuard, get_args

from minions._config import ExecutionConfig
from minions._generic import OutputT_co
from minions._messages import Message
from minions._output import OutputInstructions
from minions._step.cache import CachePolicy
from minions._step.completion import StepCompletionChain
from minions._text import as_text
from minions.errors import Problem, StepDefinitionError, did_you_mean
from minions.models import Model

if TYPE_CHECKING:
    from typing import TypedDict

    from minions._step.context import AgentContext
    from minions._step.run import StepRun
    from minions.tools import Tool, ToolRegistry

    class StepOptions(TypedDict, total=False):
        """The options every kind of step takes, as keyword arguments (see `Step`): what a step
        kind's ``**options: Unpack[StepOptions]`` passes on."""

        description: str
        depends_on: Iterable[str | Step[Any]]
        mode: StepMode
        optional: bool
        timeout: float | None
        max_visits: int
        memory: MemoryScope
        model: Model | str | None
        config: Mapping[str, Any] | ExecutionConfig | None
        completion: StepCompletionChain | None
        cache: CachePolicy | bool | Mapping[str, Any] | None


__all__ = ["MemoryScope", "Step", "StepInput", "StepMode"]

StepMode = Literal["async", "sync", "fire_and_forget"]
MemoryScope = Literal["step", "agent"]
_MODES = get_args(StepMode)
_SCOPES = get_args(MemoryScope)
MAX_ID_LENGTH = 64
"""The most characters of a step or recipe id: ids key database rows and name folders, so
they are bounded and hold no character a path or a URL would read."""
_STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
STEP_ID_PATTERN = f"^{_STEP_ID.pattern}$"
"""What a step id may be, as the recipe's JSON Schema states it."""


def step_id_problem(value: object) -> str | None:
    """Why `value` cannot be a step id, or ``None`` when it can."""
    if isinstance(value, str) and _STEP_ID.fullmatch(value):
        return None
    return (
        "id must be letters, digits, '_' or '-', not starting with a digit, and at most "
        f"{MAX_ID_LENGTH} characters long"
    )


_RECIPE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
RECIPE_ID_PATTERN = f"^{_RECIPE_ID.pattern}$"
"""What a recipe id may be, as the recipe's JSON Schema states it: a slug, one folder name
(the run's workspace is ``.minions/workspace/<recipe id>``), never a path."""


def recipe_id_problem(value: object) -> str | None:
    """Why `value` cannot be a recipe id, or ``None`` when it can."""
    if isinstance(value, str) and _RECIPE_ID.fullmatch(value):
        return None
    shown = repr(value)
    if isinstance(value, str) and len(value) > MAX_ID_LENGTH:
        shown = f"{value[:40]!r}... ({len(value)} characters)"
    return (
        f"recipe id {shown} must be 1 to {MAX_ID_LENGTH} letters, digits, '_' or '-', "
        "starting with a letter or a digit (it names the run's workspace folder)"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepInput:
    """What a step builds its prompt from."""

    context: AgentContext
    state: Mapping[str, Any] = field(default_factory=dict)
    """Run state for templates: ``inputs``, step results by id, ``loop``..."""
    dependencies: Mapping[str, Any] = field(default_factory=dict)
    """Outputs of the step's direct dependencies, by step id (``None`` for a failed optional
    dependency)."""


class Step(ABC, Generic[OutputT_co]):
    """A unit of work in a run, generic in its output (a `StepExecutor` of a
    ``Step[Expense]`` gives a ``StepExecution[Expense]``).

    Subclass it to change how a step builds its prompt (`build_messages`), which tools it may
    use (`tool_names`), when it is complete (`completion_chain`) or what it does at all
    (`run`, which by default is the model and tool loop).

    Args:
        id: unique within a recipe; letters, digits, ``_`` and ``-``, not starting with a digit,
            at most 64 characters.
        description: what the step does (shown to a model choosing among next steps).
        depends_on: the steps (or their ids) that must finish first; their outputs reach this
            step.
        mode: ``async`` runs beside other steps, ``sync`` runs alone, ``fire_and_forget`` does
            not hold up its dependents and its failure does not fail the run.
        optional: a failure lets dependents run with this step's output as ``None``.
        timeout: seconds before the step is cancelled and fails.
        max_visits: how many times loops may bring the run back to this step.
        memory: ``step`` gives the step a fresh conversation; ``agent`` shares the run's.
        model: a model or model string for this step only.
        config: overrides of the run's `ExecutionConfig` fields for this step.
        completion: this step's own completion chain.
        cache: reuse the output of an earlier execution with the same rendered prompt, model,
            tools and output schema instead of calling the model: ``True``, a mapping
            ``{"ttl": "1h", "side_effects": False}`` or a `CachePolicy` (see
            `minions._step.cache`). Only steps that run the model loop are cached.
    """

    output: OutputInstructions[Any] | None = None
    """The structured output the step must produce (``None``: a text answer)."""
    validators: tuple[Callable[[Any], Any], ...] = ()
    """Checks of the model loop's output, in order (see `DefaultStep`'s ``validators``)."""
    own_tools: tuple[Tool, ...] = ()
    """Tools given to this step itself (as functions or `Tool` objects), registered for it
    alone: the run's other steps do not see them; `tool_names` names them too."""
    completion_marker: str | None = None
    """Text that ends the step when the model writes it (see `CompletionMarkerLink`)."""
    completion_pattern: str | None = None
    """A regex that ends the step when it matches; its ``output`` group is the output."""
    completion_tool: bool = False
    """Whether the model is offered the ``complete_step`` tool to end the step."""
    kind: ClassVar[str] = "custom"
    """What kind of step this is (``agent``, ``analysis``, ``tool``, ``loop``, ``recipe``), as
    `minions run --dry-run` shows it; ``custom`` unless a subclass names its own."""

    def __init__(
        self,
        id: str,
        *,
        description: str = "",
        depends_on: Iterable[str | Step[Any]] = (),
        mode: StepMode = "async",
        optional: bool = False,
        timeout: float | None = None,
        max_visits: int = 10,
        memory: MemoryScope = "step",
        model: Model | str | None = None,
        config: Mapping[str, Any] | ExecutionConfig | None = None,
        completion: StepCompletionChain | None = None,
        cache: CachePolicy | bool | Mapping[str, Any] | None = None,
        **unknown: Never,
    ) -> None:
        if unknown:
            raise StepDefinitionError(self._unknown_options(id, unknown))
        self.id = id
        self.description = description
        self.depends_on: tuple[str, ...] = _step_ids(id, depends_on)
        self.mode: StepMode = mode
        self.optional = optional
        self.timeout = timeout
        self.max_visits = max_visits
        self.memory: MemoryScope = memory
        self.model = model
        self.config = config
        self.completion = completion
        self.cache = CachePolicy.of(cache)

    def _unknown_options(self, id: object, unknown: Mapping[str, object]) -> list[Problem]:
        """A problem per option no step of this kind has, each with a "did you mean"."""
        import inspect

        known: set[str] = set()
        for cls in type(self).__mro__:
            init = cls.__dict__.get("__init__")
            if init is None or cls is object:
                continue
            for name, param in inspect.signature(init).parameters.items():
                if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                    known.add(name)
        options = ", ".join(sorted(known - {"id"}))
        step = id if isinstance(id, str) else None
        return [
            Problem(
                message=f"{type(self).__name__} has no option {name!r}"
                f"{did_you_mean(name, sorted(known))}; its options: {options}",
                step=step,
                field=name,
            )
            for name in unknown
        ]

    # -- hooks ---------------------------------------------------------------------------------

    @abstractmethod
    def build_messages(self, step_input: StepInput) -> list[Message]:
        """The messages that start this step's conversation.

        Raises:
            TemplateError: a template value is missing (the step fails, naming it).
        """

    def tool_names(self) -> frozenset[str]:
        """Names of the tools this step may call: the run's registered tools it names, and
        its own (`own_tools`)."""
        return frozenset()

    def uses_model(self) -> bool:
        """Whether running this step may call its model: its own `model`, else the run's.

        ``True`` unless a subclass knows better: `minions run` asks it so that a run whose steps
        call no model (tool calls, say) needs none. A step running other steps answers for
        them: whether one of them may call the model this step is given.
        """
        return True

    def completion_chain(self, default: StepCompletionChain) -> StepCompletionChain:
        """The chain deciding when this step is done: its own, else `default`."""
        return self.completion if self.completion is not None else default

    def templates(self) -> Mapping[str, Any]:
        """Fields holding `{{ templates }}`, by field name, so recipes can check them."""
        return {}

    async def run(self, run: StepRun) -> None:
        """Do the step's work through `run`. The default is the model and tool loop."""
        await run.run_model_loop()

    # -- checks --------------------------------------------------------------------------------

    def problems(self, tools: ToolRegistry | None = None) -> list[Problem]:
        """Everything wrong with this step's definition, each problem naming the step and the
        field it is about."""
        problems: list[Problem] = []

        def add(field: str, message: str) -> None:
            problems.append(Problem(message=message, step=self.id, field=field))

        id_problem = step_id_problem(self.id)
        if id_problem is not None:
            add("id", id_problem)
        if self.mode not in _MODES:
            add("mode", f"mode must be one of {_MODES}, not {self.mode!r}")
        if self.memory not in _SCOPES:
            add("memory", f"memory must be one of {_SCOPES}, not {self.memory!r}")
        if self.timeout is not None and not self.timeout > 0:
            add("timeout", f"timeout must be positive, not {self.timeout!r}")
        if not isinstance(self.max_visits, int) or self.max_visits < 1:
            add("max_visits", f"max_visits must be at least 1, not {self.max_visits!r}")
        if isinstance(self.config, Mapping):
            unknown = ExecutionConfig.unknown_fields(self.config)
            if unknown:
                add("config", unknown)
        if self.output is not None:
            for text in self.output.problems():
                add("output", text)
        own: frozenset[str] | None = None  # the step's own tools' names, asked for once
        for name in sorted(self.tool_names()):
            if "." in name:
                continue  # an MCP tool (`server.tool`): the recipe checks its server
            found = tools.get(name) if tools is not None else None
            if found is None:
                if own is None:
                    own = self._own_tool_problems(add)
                if name in own or tools is None:
                    continue
                known = ", ".join(tools.names) or "none are registered"
                hint = did_you_mean(name, tools.names)
                add("tools", f"unknown tool {name!r}{hint}; known tools: {known}")
            else:
                for text in found.problems():
                    add("tools", text)
        return problems

    def _own_tool_problems(self, add: Callable[[str, str], None]) -> frozenset[str]:
        """Check the step's own tools (`own_tools`); their names."""
        given = self.own_tools
        for tool in given:
            for text in tool.problems():
                add("tools", text)
        return frozenset(tool.name for tool in given)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"


_PLAIN_ITERABLES = frozenset({list, tuple, set, frozenset})


def iterable(value: object) -> TypeGuard[Iterable[Any]]:
    """`isinstance(value, Iterable)`, without `ABCMeta`'s dispatch for the lists, tuples and
    sets steps are given (a microsecond each, several times per step built)."""
    return type(value) in _PLAIN_ITERABLES or isinstance(value, Iterable)


def _step_ids(owner: object, depends_on: object) -> tuple[str, ...]:
    """The ids of the steps a step depends on, given as steps or ids."""
    if type(depends_on) not in _PLAIN_ITERABLES and isinstance(depends_on, str | Step):
        depends_on = (depends_on,)
    if not iterable(depends_on):
        raise StepDefinitionError(
            [
                Problem(
                    message="depends_on must be a list of steps or step ids, not "
                    f"{type(depends_on).__name__}",
                    step=owner if isinstance(owner, str) else None,
                    field="depends_on",
                )
            ]
        )
    ids = []
    for item in depends_on:
        if isinstance(item, Step):
            ids.append(item.id)
        elif isinstance(item, str):
            ids.append(item)
        else:
            raise StepDefinitionError(
                [
                    Problem(
                        message=f"depends_on holds {item!r}, which is neither a step nor a step id",
                        step=owner if isinstance(owner, str) else None,
                        field="depends_on",
                    )
                ]
            )
    return tuple(ids)


def format_dependencies(dependencies: Mapping[str, Any]) -> str:
    """The outputs of a step's dependencies as text, each labelled with its step id."""
    parts = []
    for step_id, output in dependencies.items():
        parts.append(f"[{step_id}]\n{output_text(output)}")
    return "Results of earlier steps:\n\n" + "\n\n".join(parts)


def output_text(value: Any) -> str:
    """A step output as prompt text: strings as they are, anything else as JSON."""
    if value is None:
        return "(no result: this step did not succeed)"
    return as_text(value, indent=1)
