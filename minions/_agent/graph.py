"""StepGraph: a recipe checked and turned into the structure a run walks.

Checks (all problems are collected, each naming its step and field): step definitions
(including unknown tools), duplicate ids, unknown ids in ``depends_on``, transitions, aliases
and ``output_step``, cycles among ``depends_on`` (shown as a path), loops through transitions
that can never end, and templates that refer to nothing, or to a step that never runs before.

Structure: steps in order, each one's dependencies and dependents, transitions by source and
by target, and which transitions are *loops* (they lead back to a step the run has already
been through) and which are *forward* (their targets run only when chosen).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from minions._agent.mermaid import to_mermaid
from minions._routing.transition import Transition
from minions._step.step import Step
from minions.errors import RecipeError
from minions.recipes import AgentRecipe
from minions.recipes._internal import Analysis

if TYPE_CHECKING:
    from minions.tools import ToolRegistry

__all__ = ["StepGraph"]


class StepGraph:
    """A validated recipe: its steps and the edges between them.

    Build one with ``StepGraph(recipe)``; `recipe_problems` lists the problems without raising.

    Args:
        recipe: the recipe.
        tools: the tools runs will have; when not given, tool names are not checked.
        mcp_servers: names of MCP servers runs will have besides the recipe's own.

    Raises:
        RecipeError: every problem of the recipe, each naming its step and field.
    """

    def __init__(
        self,
        recipe: AgentRecipe,
        *,
        tools: ToolRegistry | None = None,
        mcp_servers: Collection[str] = (),
    ) -> None:
        analysis = Analysis(recipe, tools, mcp_servers)
        if analysis.problems:
            raise RecipeError(analysis.problems)
        self.recipe = recipe
        self.tools = tools
        """The tools the graph was checked against (``None``: tool names were not checked)."""
        self.steps: Mapping[str, Step] = analysis.steps
        """Steps by id, in recipe order."""
        self.index: Mapping[str, int] = {s: i for i, s in enumerate(self.steps)}
        """Each step's position in the recipe."""
        self.order: tuple[str, ...] = analysis.order
        """Step ids in an order where every step comes after its dependencies."""
        self.dependencies: Mapping[str, tuple[str, ...]] = {
            s: step.depends_on for s, step in self.steps.items()
        }
        self.dependents: Mapping[str, tuple[str, ...]] = analysis.dependents
        self.transitions: tuple[Transition, ...] = tuple(recipe.transitions)
        self.outgoing: Mapping[str, tuple[Transition, ...]] = analysis.outgoing
        """Transitions by source, in declaration order."""
        self.loops: frozenset[tuple[str, str]] = analysis.loops
        """``(source, target)`` of the transitions that lead back to an earlier step."""
        self.gates: Mapping[str, tuple[str, ...]] = analysis.gates
        """For each step that runs only when a transition chooses it: the sources of its
        forward transitions."""
        self.regions: Mapping[str, frozenset[str]] = analysis.regions
        """For each loop target: the steps a loop back to it runs again (itself and what
        follows it)."""
        self.followers: Mapping[str, tuple[str, ...]] = {
            s: tuple(dict.fromkeys((*self.dependents[s], *(t.target for t in self.outgoing[s]))))
            for s in self.steps
        }
        """What may change when a step ends: its dependents and its transitions' targets."""
        self.sinks: frozenset[str] = frozenset(
            s for s in self.steps if not self.dependents[s] and not self.outgoing[s]
        )
        """Steps nothing comes after."""

    def to_mermaid(self) -> str:
        """The graph as a Mermaid flowchart (see `minions._agent.mermaid`).

        Solid arrows are dependencies; dotted arrows are transitions, labelled with their
        condition (loops back are marked ``loop``). Steps show their mode when it is not
        ``async``, and ``optional`` when they are.
        """
        return to_mermaid(self.steps, self.dependencies, self.transitions, self.loops)

    def __repr__(self) -> str:
        return f"StepGraph({self.recipe.id!r}, steps={list(self.steps)})"
