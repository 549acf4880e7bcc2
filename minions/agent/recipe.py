"""Recipes: the steps of an agent, how they depend on each other, and where runs may branch."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from minions.config import ExecutionConfig
from minions.models.base import Model
from minions.step.completion import StepCompletionChain
from minions.step.step import Step
from minions.tools import Tool

if TYPE_CHECKING:
    from minions.agent.graph import StepGraph
    from minions.agent.selection import StepSelectionChain
    from minions.recipes.source import Problem
    from minions.tools import ToolRegistry

__all__ = ["AgentRecipe", "Condition", "Transition"]

Condition: TypeAlias = str | Callable[[Any], bool | Awaitable[bool]]
"""A transition's condition: a JMESPath expression or a ``{{ template }}`` over the source
step's result (``output``, ``status``, ``error``, ``visit``, plus the run state: ``inputs`` and
steps by id), or a callable receiving the source step's output (sync or async)."""


@dataclass(frozen=True)
class Transition:
    """A possible next step after `source`: the run may go on to `target`.

    After `source` completes, the selection chain picks among its transitions: those whose
    condition holds, or the step's own suggestion, or a model's choice, or the first. Targets
    not chosen are skipped, with what only they lead to. A transition back to an earlier step
    is a loop, bounded by the target's `max_visits`.

    Args:
        source: the step the transition leaves.
        target: the step it leads to.
        when: the condition (see `Condition`); ``None`` means no condition.
        description: what taking this transition means (shown in Mermaid when there is no
            condition).

    Example::

        Transition("review", "draft", when="output.approved == `false`")
        Transition("review", "publish", when=lambda output: output.approved)
    """

    source: str
    target: str
    _: KW_ONLY
    when: Condition | None = None
    description: str = ""

    @property
    def condition_text(self) -> str:
        """The condition as text (a callable's name), empty without one."""
        if self.when is None:
            return ""
        if isinstance(self.when, str):
            return self.when
        return f"{getattr(self.when, '__name__', type(self.when).__name__)}(output)"

    def __str__(self) -> str:
        condition = f" when {self.condition_text}" if self.when is not None else ""
        return f"{self.source} -> {self.target}{condition}"


@dataclass(frozen=True, kw_only=True, eq=False)
class AgentRecipe:
    """An agent as data: its steps, the transitions between them, and run defaults.

    A recipe is validated into a `StepGraph` before anything runs (`validate`), and run by an
    `AgentExecutor`. Steps start as soon as their own `depends_on` are done, up to
    `ExecutionConfig.max_parallel_steps` at once.

    Args:
        id: the recipe's name (`AgentExecutor(recipes=[...]).execute(id)` runs it by it).
        steps: the steps, in order (the order breaks ties: it is the order ready steps start).
        transitions: where the run may branch or loop after a step.
        description: what the recipe does.
        model: the default model of its steps (a `Model` or a model string); the executor's
            when not set.
        config: `ExecutionConfig` fields for its runs, over the executor's (a mapping of
            overrides, or a whole `ExecutionConfig`).
        inputs: default input values; a run's inputs override them.
        tools: tools its steps may use, in addition to the executor's.
        aliases: more names in the template state, each holding a step's output
            (``{"since": "now"}`` makes ``{{ since }}`` the output of step ``now``).
        output_step: the step whose output is the run's output. By default, the output of the
            last step to complete among those nothing comes after.
        completion_chain: the completion chain of its steps (unless a step has its own).
        selection_chain: how the next step is chosen after each step with transitions.
        execution_mode: ``"planned"`` runs each step once its `depends_on` are done, several at
            once; ``"sequential"`` runs the steps one at a time in their order, and a step's
            templates may read any earlier step.
        input_specs: the declared inputs (name -> `minions.recipes.schema.InputSpec` or its
            fields as a mapping); when given, a run's inputs are checked and converted against
            them before anything runs.
        source: where a recipe loaded from YAML came from (its `RecipeFile`); `to_yaml` writes
            that file's content back.
    """

    id: str
    steps: Sequence[Step]
    transitions: Sequence[Transition] = ()
    description: str = ""
    model: Model | str | None = None
    config: ExecutionConfig | Mapping[str, Any] | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    tools: Sequence[Tool | Callable[..., Any]] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    output_step: str | None = None
    completion_chain: StepCompletionChain | None = None
    selection_chain: StepSelectionChain | None = None
    execution_mode: Literal["planned", "sequential"] = "planned"
    input_specs: Mapping[str, Any] = field(default_factory=dict)
    source: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Freeze the collections a caller might still hold and change.
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "transitions", tuple(self.transitions))
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "inputs", dict(self.inputs))
        object.__setattr__(self, "aliases", dict(self.aliases))
        object.__setattr__(self, "input_specs", dict(self.input_specs))

    @classmethod
    def from_yaml(cls, path: str | Path) -> AgentRecipe:
        """Load a YAML recipe file (see docs/recipes.md).

        Raises:
            RecipeError: every problem in the file, each with line, step and field.
        """
        from minions.recipes.build import load_recipe

        return load_recipe(path).recipe

    @classmethod
    def from_yaml_text(cls, text: str, *, base: str | Path = ".") -> AgentRecipe:
        """A recipe from YAML text; relative paths (tools, workspace, sub-recipes) are
        resolved from `base`."""
        from minions.recipes.build import build_recipe
        from minions.recipes.loader import parse_spec

        spec, located = parse_spec(text)
        return build_recipe(spec, located, base=Path(base).resolve()).recipe

    def to_yaml(self) -> str:
        """The recipe in the YAML format: `from_yaml` of it gives the same recipe.

        A recipe loaded from YAML writes back what it was loaded from.

        Raises:
            RecipeError: naming each part with no YAML form (a Python condition, a model
                object, a custom step class, a tool that cannot be imported by name).
        """
        from minions.recipes.dump import recipe_to_data, to_yaml_text

        if self.source is not None:
            return to_yaml_text(self.source.spec.model_dump(mode="json", exclude_defaults=True))
        return to_yaml_text(recipe_to_data(self))

    def check_inputs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs of a run given `given`: the recipe's default `inputs` under the given
        ones, checked and converted against `input_specs` when the recipe declares them (text
        from a command line becomes the declared type).

        Raises:
            InputError: naming every unknown, missing or ill-typed input.
        """
        checked = dict(given)
        if self.input_specs:
            from minions.recipes.loader import coerce_inputs
            from minions.recipes.schema import InputSpec

            specs = {
                name: spec if isinstance(spec, InputSpec) else InputSpec.model_validate(spec)
                for name, spec in self.input_specs.items()
            }
            source = getattr(self.source, "path", None)
            checked = coerce_inputs(specs, checked, file=str(source or ""))
        return {**self.inputs, **checked}

    def step(self, step_id: str) -> Step:
        """The step with this id.

        Raises:
            KeyError: no step has it.
        """
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def problems(self, tools: ToolRegistry | None = None) -> list[Problem]:
        """Everything wrong with this recipe, each problem naming its step and field.

        Args:
            tools: the tools runs will have; when not given, tool names are not checked.
        """
        from minions.agent.graph import recipe_problems

        return recipe_problems(self, tools)

    def validate(self, tools: ToolRegistry | None = None) -> StepGraph:
        """The recipe as a checked `StepGraph`.

        Raises:
            RecipeError: every problem found (see `problems`).
        """
        from minions.agent.graph import StepGraph

        return StepGraph(self, tools=tools)

    def to_mermaid(self) -> str:
        """The recipe as a Mermaid flowchart (see `StepGraph.to_mermaid`)."""
        return self.validate().to_mermaid()

    def __repr__(self) -> str:
        return f"AgentRecipe({self.id!r}, steps={[s.id for s in self.steps]})"
