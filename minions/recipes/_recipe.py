"""Recipes: the steps of an agent, how they depend on each other, and where runs may branch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from minions._config import ExecutionConfig
from minions._routing.selection import StepSelectionChain
from minions._routing.transition import Transition
from minions._step.completion import StepCompletionChain
from minions._step.step import Step, recipe_id_problem
from minions.errors import Problem, RecipeError
from minions.models import Model
from minions.tools import Tool

__all__ = ["AgentRecipe"]


@dataclass(frozen=True, kw_only=True, eq=False)
class AgentRecipe:
    """An agent as data: its steps, the transitions between them, and run defaults.

    A recipe is validated into a `StepGraph` before anything runs (``StepGraph(recipe)``;
    `recipe_problems` lists the problems without raising) and run by an `AgentExecutor`. Steps
    start as soon as their own `depends_on` are done, up to `ExecutionConfig.max_parallel_steps`
    at once.

    Args:
        id: the recipe's name (`AgentExecutor(recipes=[...]).execute(id)` runs it by it): 1
            to 64 letters, digits, ``_`` or ``-``, starting with a letter or a digit.
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
        input_specs: the declared inputs (name -> `minions.recipes.InputSpec` or its
            fields as a mapping); when given, a run's inputs are checked and converted against
            them before anything runs.
        mcp_servers: MCP servers whose tools its steps may call, by name: an
            `minions.tools.MCPStdioServer`, an `minions.tools.MCPHttpServer`, or the YAML form
            as a mapping (``{"command": "python", "args": ["server.py"]}``, ``{"url": ...}``),
            with ``${VAR}`` expanded from the environment now. A step asks for a server's tool
            as ``server.tool`` (all of them: ``server.*``); the model sees it as
            ``server_tool``. Each run connects to each server once (``pip install
            'minions[mcp]'``).
        source: where a recipe loaded from YAML came from (its `RecipeFile`); `dump_recipe` writes
            that file's content back.

    Raises:
        RecipeError: the id is not a slug (the problem names the field ``id``).
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
    mcp_servers: Mapping[str, Any] = field(default_factory=dict)
    source: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Safe by construction: no recipe exists whose id could name a path.
        problem = recipe_id_problem(self.id)
        if problem is not None:
            raise RecipeError([Problem(message=problem, field="id")])
        # Freeze the collections a caller might still hold and change.
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "transitions", tuple(self.transitions))
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "inputs", dict(self.inputs))
        object.__setattr__(self, "aliases", dict(self.aliases))
        object.__setattr__(self, "input_specs", dict(self.input_specs))
        if self.mcp_servers:
            from minions.tools._internal import server_configs

            object.__setattr__(self, "mcp_servers", server_configs(self.mcp_servers))
        else:
            object.__setattr__(self, "mcp_servers", {})

    def check_inputs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs of a run given `given`: the recipe's default `inputs` under the given
        ones, checked and converted against `input_specs` when the recipe declares them (text
        from a command line becomes the declared type).

        Raises:
            InputError: naming every unknown, missing or ill-typed input.
        """
        checked = dict(given)
        if self.input_specs:
            # The declared inputs are pydantic models: loaded only for recipes that have some.
            from minions.recipes._loader import coerce_inputs
            from minions.recipes._schema import InputSpec

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

    def __repr__(self) -> str:
        return f"AgentRecipe({self.id!r}, steps={[s.id for s in self.steps]})"
