"""What `minions run --dry-run` shows: steps in waves, what each does, what it renders to.

Nothing here calls a model or a tool: templates are rendered from the inputs alone, and those
that read other steps' results are shown as written, with the steps they wait for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from minions._agent.graph import StepGraph
from minions._config import ExecutionConfig
from minions._kinds.loop import LoopStep
from minions._step.step import Step
from minions._templates import has_template, render, template_roots
from minions._text import jsonable
from minions.cli._model_choice import model_text
from minions.errors import TemplateError
from minions.models import FallbackModel
from minions.recipes import RecipeStep

__all__ = []


@dataclass(frozen=True, kw_only=True)
class RenderedField:
    """A templated field of a step: its value from the inputs, or what it waits for."""

    name: str
    template: Any
    value: Any = None
    rendered: bool = False
    waits_for: tuple[str, ...] = ()
    """The steps whose results the field reads."""
    per_item: bool = False
    """The field reads ``loop.item`` or ``loop.index``: it renders once per loop item."""


@dataclass(frozen=True, kw_only=True)
class DryRunStep:
    id: str
    kind: str
    """The step's `Step.kind` (``agent``, ``analysis``, ``tool``, ``custom``...); ``recipe ID``
    for a sub-recipe step, ``loop of ...`` for a loop step."""
    description: str = ""
    depends_on: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    uses_model: bool = False
    """The step may call a model (`Step.uses_model`)."""
    model: str | None = None
    """The step's own model, when it has one."""
    notes: tuple[str, ...] = ()
    fields: tuple[RenderedField, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DryRunTool:
    """A tool an MCP server listed, as the model would be offered it."""

    name: str
    """The name the model sees (``server_tool``)."""
    mcp_name: str
    """The server's own name for it."""
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    """The JSON Schema of its arguments, as the model is offered it."""


@dataclass(frozen=True, kw_only=True)
class DryRunServer:
    """An MCP server of the run and the tools it listed (listed, never called)."""

    name: str
    server: str
    """How it is reached (``stdio: python server.py``, ``http: URL``), without secrets."""
    tools: tuple[DryRunTool, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DryRun:
    """A run as `--dry-run` shows it (not a `minions.Plan`, which a model writes)."""

    recipe_id: str
    inputs: Mapping[str, Any]
    waves: tuple[tuple[DryRunStep, ...], ...]
    model: str
    """The model the run would use (as chosen, not resolved)."""
    max_parallel: int = 8
    """How many steps may run at once (`max_parallel_steps`)."""
    transitions: tuple[str, ...] = ()
    mcp_servers: tuple[DryRunServer, ...] = ()

    @property
    def steps(self) -> tuple[DryRunStep, ...]:
        return tuple(step for wave in self.waves for step in wave)

    def to_data(self) -> dict[str, Any]:
        """The dry run as JSON-ready data (`--dry-run --json`)."""
        return {
            "recipe_id": self.recipe_id,
            "model": self.model,
            "inputs": jsonable(dict(self.inputs)),
            "waves": [
                [
                    {
                        "id": s.id,
                        "kind": s.kind,
                        "description": s.description,
                        "depends_on": list(s.depends_on),
                        "tools": list(s.tools),
                        "uses_model": s.uses_model,
                        "model": s.model,
                        "notes": list(s.notes),
                        "fields": {
                            f.name: (
                                {"value": jsonable(f.value)}
                                if f.rendered
                                else {
                                    "template": jsonable(f.template),
                                    "waits_for": list(f.waits_for),
                                    "per_item": f.per_item,
                                }
                            )
                            for f in s.fields
                        },
                    }
                    for s in wave
                ]
                for wave in self.waves
            ],
            "max_parallel_steps": self.max_parallel,
            "transitions": list(self.transitions),
            "mcp_servers": {
                server.name: {
                    "server": server.server,
                    "tools": [
                        {
                            "name": t.name,
                            "mcp_name": t.mcp_name,
                            "description": t.description,
                            "input_schema": jsonable(dict(t.input_schema)),
                        }
                        for t in server.tools
                    ],
                }
                for server in self.mcp_servers
            },
        }


def make_dry_run(
    graph: StepGraph,
    inputs: Mapping[str, Any],
    *,
    model: str,
    mcp_servers: tuple[DryRunServer, ...] = (),
) -> DryRun:
    """The dry run of `graph` with `inputs` (defaults already filled in), and the MCP
    servers' tools, as listed."""
    waves = _waves(graph)
    aliases = graph.recipe.aliases
    state = {"inputs": dict(inputs)}
    planned = tuple(
        tuple(_planned(graph.steps[step_id], state, aliases, graph) for step_id in wave)
        for wave in waves
    )
    config = ExecutionConfig().merged(graph.recipe.config)
    return DryRun(
        recipe_id=graph.recipe.id,
        inputs=dict(inputs),
        waves=planned,
        model=model,
        max_parallel=config.max_parallel_steps,
        transitions=tuple(str(t) for t in graph.transitions),
        mcp_servers=mcp_servers,
    )


def _waves(graph: StepGraph) -> list[list[str]]:
    """Steps grouped by how many dependencies deep they are: a wave can start once the waves
    before it are done (the executor starts each step as soon as its own are)."""
    depth: dict[str, int] = {}
    for step_id in graph.order:
        deps = [d for d in graph.dependencies[step_id] if d in depth]
        depth[step_id] = 1 + max((depth[d] for d in deps), default=-1)
    waves: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for step_id in graph.steps:  # recipe order within a wave
        waves[depth[step_id]].append(step_id)
    return waves


def _kind(step: Step) -> str:
    """The step's `kind`, with what a loop repeats and which recipe a sub-recipe step runs."""
    if isinstance(step, LoopStep):
        return f"loop of {_kind(step.body)}"
    if isinstance(step, RecipeStep):
        return f"recipe {step.recipe.id}"
    return step.kind


def _planned(
    step: Step, state: Mapping[str, Any], aliases: Mapping[str, str], graph: StepGraph
) -> DryRunStep:
    notes: list[str] = []
    if step.mode != "async":
        notes.append(step.mode)
    if step.optional:
        notes.append("optional")
    if step.timeout is not None:
        notes.append(f"timeout {step.timeout:g}s")
    if isinstance(step, LoopStep) and step.parallel > 1:
        notes.append(f"{step.parallel} items at once")
    gates = graph.gates.get(step.id)
    if gates:
        notes.append(f"runs only when chosen after {', '.join(gates)}")
    model = model_text(step.model) if isinstance(step.model, str | FallbackModel) else None
    return DryRunStep(
        id=step.id,
        kind=_kind(step),
        description=step.description,
        depends_on=step.depends_on,
        tools=tuple(sorted(step.tool_names())),
        uses_model=step.uses_model(),
        model=model,
        notes=tuple(notes),
        fields=tuple(
            _field(name, value, state, aliases)
            for name, value in step.templates().items()
            if value not in (None, "", {}, [])
        ),
    )


def _field(
    name: str, value: Any, state: Mapping[str, Any], aliases: Mapping[str, str]
) -> RenderedField:
    if not has_template(value):
        return RenderedField(name=name, template=value, value=value, rendered=True)
    roots = template_roots(value)
    waits = tuple(sorted(aliases.get(r, r) for r in roots if r not in ("inputs", "loop")))
    per_item = "loop" in roots
    if not waits and not per_item:
        try:
            return RenderedField(
                name=name, template=value, value=render(value, state), rendered=True
            )
        except TemplateError:
            pass  # An input with no value: shown as written.
    return RenderedField(name=name, template=value, waits_for=waits, per_item=per_item)
