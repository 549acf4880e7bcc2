"""Checking a recipe: every problem found, each naming its step and field.

Checks: step definitions (including unknown tools), duplicate ids, unknown ids in
``depends_on``, transitions, aliases and ``output_step``, cycles among ``depends_on`` (shown as
a path), loops through transitions that can never end, and templates that refer to nothing, or
to a step that never runs before. The same pass computes the structure `StepGraph` keeps.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from minions._kinds.loop import LoopStep
from minions._kinds.tool import ToolStep
from minions._output import OutputInstructions
from minions._routing.conditions import as_template
from minions._routing.transition import Transition
from minions._step.step import Step
from minions._templates import (
    bare_comparands,
    check_template,
    field_paths,
    template_expressions,
    template_roots,
)
from minions.errors import Problem, did_you_mean
from minions.recipes._recipe import AgentRecipe
from minions.recipes._subrecipe import RecipeStep

if TYPE_CHECKING:
    from minions.tools import ToolRegistry

__all__ = ["recipe_problems"]

RESULT_FIELDS = ("output", "status", "error", "visit")
"""What a transition's condition reads about its source, besides the run state."""


def recipe_problems(
    recipe: AgentRecipe,
    tools: ToolRegistry | None = None,
    *,
    mcp_servers: Collection[str] = (),
) -> list[Problem]:
    """Every problem of `recipe` (see the module docstring). Empty when it is valid.

    `mcp_servers` names MCP servers the run has besides the recipe's own (an executor's): a
    step's ``server.tool`` must name one of them or of the recipe's.
    """
    return Analysis(recipe, tools, mcp_servers).problems


class Analysis:
    """Checks a recipe and computes its structure in one pass."""

    def __init__(
        self, recipe: AgentRecipe, tools: ToolRegistry | None, mcp_servers: Collection[str] = ()
    ) -> None:
        self.recipe = recipe
        self.problems: list[Problem] = []
        self.steps: dict[str, Step] = {}
        self._check_steps(tools)
        self._check_mcp_references({*recipe.mcp_servers, *mcp_servers})
        ids = self.steps
        self.dependents: dict[str, tuple[str, ...]] = dict.fromkeys(ids, ())
        self.outgoing: dict[str, tuple[Transition, ...]] = dict.fromkeys(ids, ())
        self._check_dependencies()
        self._check_transitions()
        self._check_names()
        self.order = self._topological_order()
        self.loops, self.gates = self._classify_transitions()
        self.regions = {t: self._reachable(t) for _, t in self.loops}
        self._check_loops()
        self._check_templates()

    def _add(self, message: str, step: str | None = None, field: str | None = None) -> None:
        self.problems.append(Problem(message=message, step=step, field=field))

    # -- steps, names, references ------------------------------------------------------------

    def _condition_problems(self, when: str, source: Step | None) -> list[str]:
        """A condition that reads a field the source's output schema does not have, or that
        compares with a whole step (an unquoted literal), can never hold as meant."""
        problems = []
        schema = None
        if source is not None and not isinstance(source, LoopStep):
            output = getattr(source, "output", None)
            schema = output.json_schema() if isinstance(output, OutputInstructions) else None
        for expression in template_expressions(as_template(when)):
            for name in sorted(bare_comparands(expression) & self.steps.keys()):
                problems.append(
                    f"{{{{ {expression} }}}} compares with the whole step {name!r}; to compare "
                    f"with the text, quote it: '{name}'"
                )
            if schema is None:
                continue
            for path in sorted(field_paths(expression)):
                if path[0] == "output" and len(path) > 1:
                    problem = _schema_field_problem(schema, path[1:])
                    if problem:
                        problems.append(f"{{{{ {expression} }}}}: {problem}")
        return problems

    def _check_steps(self, tools: ToolRegistry | None) -> None:
        seen: dict[str, int] = {}
        given: tuple[object, ...] = tuple(self.recipe.steps)
        for position, step in enumerate(given, start=1):
            if not isinstance(step, Step):
                self._add(f"step #{position} is a {type(step).__name__}, not a Step")
                continue
            if step.id in seen:
                self._add(
                    f"duplicate step id (steps #{seen[step.id]} and #{position})",
                    step.id,
                    "id",
                )
                continue
            seen[step.id] = position
            self.steps[step.id] = step
            self.problems.extend(step.problems(tools))
            problem = _uncached(step)
            if problem is not None:
                self._add(problem, step.id, "cache")
        if not self.steps and not self.problems:
            self._add("a recipe needs at least one step", field="steps")

    def _check_mcp_references(self, servers: set[str]) -> None:
        """A step's ``server.tool`` (or ``server.*``) must name an MCP server of the run (the
        server's tools are known only once a run connects to it)."""
        for step_id, step in self.steps.items():
            for name in sorted(step.tool_names()):
                if "." not in name:
                    continue
                server, _, tool = name.partition(".")
                if not tool:
                    self._add(
                        f"{name!r} names no tool: write {server}.TOOL, or {server}.* for all "
                        "of its tools",
                        step_id,
                        "tools",
                    )
                elif server not in servers:
                    known = ", ".join(sorted(servers)) or "none are declared in mcp_servers"
                    self._add(
                        f"{name!r}: unknown MCP server {server!r}"
                        f"{did_you_mean(server, servers)}; the MCP servers: {known}",
                        step_id,
                        "tools",
                    )

    def _unknown(self, name: str) -> str:
        return f"unknown step {name!r}{did_you_mean(name, self.steps)}"

    def _check_dependencies(self) -> None:
        dependents: dict[str, list[str]] = {s: [] for s in self.steps}
        for step_id, step in self.steps.items():
            if len(set(step.depends_on)) != len(step.depends_on):
                self._add("lists a step more than once", step_id, "depends_on")
            for dependency in dict.fromkeys(step.depends_on):
                if dependency == step_id:
                    self._add("a step cannot depend on itself", step_id, "depends_on")
                elif dependency not in self.steps:
                    self._add(self._unknown(dependency), step_id, "depends_on")
                else:
                    dependents[dependency].append(step_id)
        self.dependents = {s: tuple(d) for s, d in dependents.items()}

    def _check_transitions(self) -> None:
        outgoing: dict[str, list[Transition]] = {s: [] for s in self.steps}
        seen: set[tuple[str, str]] = set()
        given: tuple[object, ...] = tuple(self.recipe.transitions)
        for transition in given:
            if not isinstance(transition, Transition):
                self._add(f"{transition!r} is not a Transition", field="transitions")
                continue
            source, target = transition.source, transition.target
            known = True
            if source not in self.steps:
                self._add(
                    f"transition {transition}: {self._unknown(source)}", source, "transitions"
                )
                known = False
            if target not in self.steps:
                self._add(
                    f"transition {transition}: {self._unknown(target)}", source, "transitions"
                )
                known = False
            if (source, target) in seen:
                self._add(
                    f"two transitions lead from {source!r} to {target!r}", source, "transitions"
                )
                known = False
            when: object = transition.when
            if isinstance(when, str):
                roots = [*self._state_roots(), *RESULT_FIELDS]
                problems = check_template(as_template(when), roots)
                if not problems:
                    problems = self._condition_problems(when, self.steps.get(source))
                for text in problems:
                    self._add(f"condition of {source} -> {target}: {text}", source, "transitions")
            elif when is not None and not callable(when):
                self._add(
                    f"condition of {source} -> {target} must be a string or a callable, not "
                    f"{type(when).__name__}",
                    source,
                    "transitions",
                )
            if known:
                seen.add((source, target))
                outgoing[source].append(transition)
        self.outgoing = {s: tuple(t) for s, t in outgoing.items()}

    def _state_roots(self) -> list[str]:
        return ["inputs", *self.steps, *self.recipe.aliases]

    def _check_names(self) -> None:
        for alias, step_id in self.recipe.aliases.items():
            if alias in self.steps or alias in ("inputs", "loop", *RESULT_FIELDS):
                self._add(f"alias {alias!r} is already a name in the run state", field="aliases")
            if step_id not in self.steps:
                self._add(f"alias {alias!r}: {self._unknown(step_id)}", field="aliases")
        output_step = self.recipe.output_step
        if output_step is not None and output_step not in self.steps:
            self._add(self._unknown(output_step), field="output_step")

    # -- structure ---------------------------------------------------------------------------

    def _topological_order(self) -> tuple[str, ...]:
        """Kahn's algorithm, recipe order breaking ties; reports each cycle as a path."""
        waiting = {
            s: sum(1 for d in set(step.depends_on) if d in self.steps and d != s)
            for s, step in self.steps.items()
        }
        position = {s: i for i, s in enumerate(self.steps)}
        # The ready steps by position: a heap, as thousands of steps may be ready at once.
        ready = [(position[s], s) for s, n in waiting.items() if n == 0]
        order: list[str] = []
        while ready:
            _, current = heapq.heappop(ready)
            order.append(current)
            for dependent in self.dependents[current]:
                waiting[dependent] -= 1
                if waiting[dependent] == 0:
                    heapq.heappush(ready, (position[dependent], dependent))
        if len(order) < len(self.steps):
            placed = set(order)
            self._report_cycles({s for s in self.steps if s not in placed})
        return tuple(order)

    def _report_cycles(self, stuck: set[str]) -> None:
        reported: set[frozenset[str]] = set()
        for start in self.steps:
            if start not in stuck:
                continue
            path = self._cycle_from(start, stuck)
            if path is None or frozenset(path) in reported:
                continue
            reported.add(frozenset(path))
            shown = " -> ".join([*path, path[0]])
            self._add(
                f"depends_on forms a cycle: {shown} (each step waits for the next)",
                path[0],
                "depends_on",
            )

    def _cycle_from(self, start: str, stuck: set[str]) -> list[str] | None:
        path = [start]
        on_path = {start: 0}
        current = start
        while True:
            following = [d for d in self.steps[current].depends_on if d in stuck]
            if not following:
                return None
            current = following[0]
            if current in on_path:
                return path[on_path[current] :]
            on_path[current] = len(path)
            path.append(current)

    def _successors(self, step_id: str) -> list[tuple[str, bool]]:
        """``(next step, via a transition)``: dependents first, then transition targets."""
        return [(d, False) for d in self.dependents[step_id]] + [
            (t.target, True) for t in self.outgoing[step_id]
        ]

    def _classify_transitions(
        self,
    ) -> tuple[frozenset[tuple[str, str]], dict[str, tuple[str, ...]]]:
        """Depth-first from the steps in dependency order: a transition to a step still on
        the path is a loop; the other transitions are forward, and gate their targets."""
        loops: set[tuple[str, str]] = set()
        state: dict[str, int] = {}  # 1: on the path, 2: done
        ordered = set(self.order)
        roots = [*self.order, *(s for s in self.steps if s not in ordered)]
        for root in roots:
            if root in state:
                continue
            state[root] = 1
            stack = [(root, iter(self._successors(root)))]
            # Where each step of the path is, and whether a transition led to it.
            at = {root: 0}
            entered_by_transition = [False]
            while stack:
                current, successors = stack[-1]
                for successor, via_transition in successors:
                    seen = state.get(successor)
                    if seen == 1:
                        if via_transition:
                            loops.add((current, successor))
                        elif any(entered_by_transition[at[successor] + 1 :]):
                            # (Without a transition on the way, it is a cycle of depends_on,
                            # reported already.)
                            self._add(
                                f"waits for {current!r}, which can only run after "
                                f"{successor!r} itself (through transitions): neither could "
                                "start",
                                successor,
                                "depends_on",
                            )
                    elif seen is None:
                        state[successor] = 1
                        at[successor] = len(stack)
                        entered_by_transition.append(via_transition)
                        stack.append((successor, iter(self._successors(successor))))
                        break
                else:
                    state[current] = 2
                    stack.pop()
                    entered_by_transition.pop()
        gates: dict[str, list[str]] = {}
        for source, transitions in self.outgoing.items():
            for transition in transitions:
                if (source, transition.target) not in loops:
                    gates.setdefault(transition.target, []).append(source)
        return frozenset(loops), {t: tuple(dict.fromkeys(s)) for t, s in gates.items()}

    def _reachable(self, start: str, *, edges: Any = None) -> frozenset[str]:
        """Steps reachable from `start` (itself included) through dependencies and forward
        transitions; `edges` may restrict which transitions count."""
        seen = {start}
        todo = [start]
        while todo:
            current = todo.pop()
            nexts: Iterable[str] = self.dependents[current]
            targets = [
                t.target
                for t in self.outgoing[current]
                if (current, t.target) not in self.loops and (edges is None or edges(t))
            ]
            for following in (*nexts, *targets):
                if following not in seen:
                    seen.add(following)
                    todo.append(following)
        return frozenset(seen)

    def _check_loops(self) -> None:
        """A loop whose every transition is its source's only one, without a condition, can
        only end by exceeding `max_visits`."""

        def always(transition: Transition) -> bool:
            return transition.when is None and len(self.outgoing[transition.source]) == 1

        for source, target in sorted(self.loops):
            back = next(t for t in self.outgoing[source] if t.target == target)
            if always(back) and source in self._reachable(target, edges=always):
                self._add(
                    f"the loop {source} -> {target} has no condition and no other way out, so "
                    f"it could only end by exceeding max_visits; give one of its transitions a "
                    f"`when`, or add another transition out of it",
                    source,
                    "transitions",
                )

    # -- templates ---------------------------------------------------------------------------

    def _check_templates(self) -> None:
        before = self._runs_before()
        aliases = self.recipe.aliases
        state_roots = frozenset(self._state_roots())
        with_loop = state_roots | {"loop"}
        for step_id, step in self.steps.items():
            for field, value in step.templates().items():
                roots = with_loop if isinstance(step, LoopStep) and field != "loop" else state_roots
                for text in check_template(value, roots):
                    self._add(text, step_id, field)
                self._check_order(step_id, field, value, before, aliases)

    def _check_order(
        self,
        step_id: str,
        field: str,
        value: Any,
        before: _RunsBefore,
        aliases: Mapping[str, str],
    ) -> None:
        try:
            roots = template_roots(value)
        except Exception:
            return  # A syntax error is reported by check_template.
        for root in sorted(roots):
            referred = aliases.get(root, root)
            if referred not in self.steps or before.may_run_before(referred, step_id):
                continue
            expression = next((e for e in template_expressions(value) if root in e), root)
            what = "its own result" if referred == step_id else f"step {referred!r}"
            self._add(
                f"template {{{{ {expression} }}}} refers to {what}, which never runs before "
                f"{step_id!r}; add {referred!r} to depends_on",
                step_id,
                field,
            )

    def _runs_before(self) -> _RunsBefore:
        """Which steps may have run before each step: everything it is reachable from through
        dependencies and transitions (loops included), and in a sequential recipe every
        earlier step. Answered per question, so a big recipe is checked in linear time."""
        incoming: dict[str, set[str]] = {s: set() for s in self.steps}
        for step_id in self.steps:
            for following, _ in self._successors(step_id):
                incoming[following].add(step_id)
        if self.recipe.execution_mode == "sequential":
            for earlier, later in itertools.pairwise(self.steps):
                incoming[later].add(earlier)
        return _RunsBefore(incoming)


class _RunsBefore:
    """Whether a step may have run before another, from the steps leading to each one."""

    def __init__(self, incoming: Mapping[str, set[str]]) -> None:
        self._incoming = incoming
        self._ancestors: dict[str, frozenset[str]] = {}

    def may_run_before(self, earlier: str, step_id: str) -> bool:
        # Templates nearly always read a direct dependency: no walk needed for those.
        if earlier in self._incoming[step_id]:
            return True
        return earlier in self._ancestors_of(step_id)

    def _ancestors_of(self, step_id: str) -> frozenset[str]:
        found = self._ancestors.get(step_id)
        if found is None:
            seen: set[str] = set()
            todo = list(self._incoming[step_id])
            while todo:
                current = todo.pop()
                if current not in seen:
                    seen.add(current)
                    todo.extend(self._incoming[current])
            found = self._ancestors[step_id] = frozenset(seen)
        return found


def _uncached(step: Step) -> str | None:
    """Why a step that says ``cache`` is never served from the step cache, if it is not: the
    cache reuses a model loop's answer, and these kinds have none of their own."""
    if step.cache is None:
        return _uncached(step.body) if isinstance(step, LoopStep) else None
    if isinstance(step, LoopStep):
        return (
            "a loop step is not cached as a whole; give `cache` to its body (each item is "
            "cached on its own)"
        )
    if isinstance(step, ToolStep):
        return (
            "a tool step is never served from the step cache (it calls its tool directly: "
            "there is no model call to reuse); remove `cache`"
        )
    if isinstance(step, RecipeStep):
        return (
            "a sub-recipe step is not cached as a whole; give `cache` to the steps of the "
            "sub-recipe that may be reused"
        )
    return None


def _schema_field_problem(schema: Mapping[str, Any], fields: tuple[str, ...]) -> str | None:
    """Why `output.<fields>` cannot exist in a value of `schema`, if it is sure: only objects
    with listed properties, no extra properties and no combinators are checked."""
    node: Any = schema
    for depth, name in enumerate(fields):
        node = _resolve(node, schema)
        if not isinstance(node, Mapping):
            return None
        properties = node.get("properties")
        open_ended = node.get("additionalProperties") not in (None, False)
        combined = any(k in node for k in ("anyOf", "oneOf", "allOf", "patternProperties"))
        if not isinstance(properties, Mapping) or open_ended or combined:
            return None
        if name not in properties:
            where = ".".join(("output", *fields[:depth]))
            known = sorted(map(str, properties))
            return (
                f"{where} has no field {name!r}{did_you_mean(name, known)}; its fields: "
                f"{', '.join(known) or 'none'}"
            )
        node = properties[name]
    return None


def _resolve(node: Any, root: Mapping[str, Any]) -> Any:
    """A local ``$ref`` (``#/$defs/Name``) followed, a few levels at most."""
    for _ in range(8):
        if not isinstance(node, Mapping) or not isinstance(node.get("$ref"), str):
            return node
        reference = node["$ref"]
        if not reference.startswith("#/"):
            return None
        target: Any = root
        for part in reference[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        node = target
    return None
