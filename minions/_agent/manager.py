"""StepManager: which steps are ready, running, done or skipped, and what happens after each.

The manager owns a run's bookkeeping; `AgentExecutor` owns the tasks. The executor asks for
ready steps (`peek`, `start`), runs them, and hands every finished execution back to
`advance`, the one place a run moves on:

* the execution is recorded and published to the template state (``state[step_id]``);
* its routing (the selection chain's choice, see `route`) is applied: chosen forward targets
  may run, a chosen loop target makes the steps from it onwards run again;
* the steps that may change (its dependents and transition targets) are evaluated: ready,
  still waiting, or skipped with a reason, and skipping spreads to what follows.

Skips come in two kinds. A step that depends on a failure (a failed step that is not
`optional`, or a step skipped for such a failure) is skipped *for the failure*, and so is
everything after it. A step that only unchosen branches lead to is skipped *as unchosen*; a
step that joins a chosen and an unchosen branch still runs, without the unchosen one's output.
"""

from __future__ import annotations

import operator
from bisect import insort
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from minions._routing.selection import (
    Routing,
    SelectionRequest,
    StepSelectionChain,
)
from minions._step.execution import StepExecution, StepStatus
from minions._step.executor import StepExecutor
from minions._text import jsonable
from minions.events import RoutingDecided, StepSkipped

if TYPE_CHECKING:
    from minions._agent.graph import StepGraph
    from minions._step.context import AgentContext
    from minions._step.step import Step

__all__ = ["StepManager"]

NodeStatus = Literal["waiting", "ready", "running", "completed", "failed", "skipped"]
_SETTLED_BY_START = ("running", "completed", "failed")
_UNDECIDED = ("waiting", "ready", "running")


class _Node:
    """The run-time record of one step."""

    __slots__ = (
        "activated",
        "deps",
        "fire_and_forget",
        "fork_base",
        "gate",
        "id",
        "index",
        "looped_by",
        "optional",
        "routing",
        "skip_failure",
        "stale",
        "status",
        "step",
        "visits",
    )

    def __init__(self, step: Step, index: int, gate: tuple[str, ...]) -> None:
        self.id = step.id
        self.step = step
        self.index = index
        self.deps = step.depends_on
        self.gate = gate
        self.optional = step.optional
        self.fire_and_forget = step.mode == "fire_and_forget"
        self.status: NodeStatus = "waiting"
        self.visits = 0
        self.activated = False
        self.stale = False
        self.skip_failure = False
        self.routing: Routing | None = None
        self.looped_by: tuple[str, str] | None = None
        self.fork_base = 0


_BY_INDEX = operator.attrgetter("index")


class StepManager:
    """The bookkeeping of one run of a `StepGraph`.

    Args:
        graph: the validated recipe.
        context: the run's context (inputs, memory, events, config).
        selection_chain: how next steps are chosen; the default chain when not given.

    Attributes:
        state: the template state: ``inputs``, each step's result by id (``output``,
            ``status``, ``error``, ``visit``) and the recipe's aliases.
        executions: every `StepExecution` of the run, in completion order (skipped steps
            included, as SKIPPED executions with the reason in `error`).
        failures: the executions whose failure fails the run, in the order they ended.
        error: set when the run cannot go on (a step would exceed `max_visits`).
    """

    def __init__(
        self,
        graph: StepGraph,
        context: AgentContext,
        *,
        selection_chain: StepSelectionChain | None = None,
    ) -> None:
        self.graph = graph
        self.context = context
        self.selection_chain = selection_chain or StepSelectionChain.default()
        self.state: dict[str, Any] = {"inputs": context.inputs}
        self._state_view: Mapping[str, Any] = MappingProxyType(self.state)
        self.executions: list[StepExecution] = []
        self.failures: list[StepExecution] = []
        self.error: str | None = None
        self._aliases: dict[str, list[str]] = {}
        for alias, step_id in graph.recipe.aliases.items():
            self._aliases.setdefault(step_id, []).append(alias)
        self._nodes: dict[str, _Node] = {
            step_id: _Node(step, graph.index[step_id], graph.gates.get(step_id, ()))
            for step_id, step in graph.steps.items()
        }
        self._ready: list[_Node] = []
        self._shared = f"{context.run_id}/agent"
        self._propagate(graph.order)

    # -- what the executor asks ----------------------------------------------------------------

    @property
    def ready(self) -> tuple[str, ...]:
        """Ids of the steps that may start now, in recipe order."""
        return tuple(node.id for node in self._ready)

    def peek(self) -> Step | None:
        """The step that would start next, if any."""
        return self._ready[0].step if self._ready else None

    def status(self, step_id: str) -> NodeStatus:
        """Where a step stands in the run."""
        return self._nodes[step_id].status

    def start(self, step_id: str) -> StepExecutor:
        """Mark a ready step as running and prepare its `StepExecutor`.

        The executor gets the step's template state, the outputs of its direct dependencies
        (``None`` for an optional one that failed; none for unchosen or fire-and-forget ones,
        nor, for an agent-memory step, for agent-memory ones already in its conversation), and
        for ``memory="agent"`` a fork of the run's shared conversation.
        """
        node = self._nodes[step_id]
        if node.status != "ready":
            raise RuntimeError(f"step {step_id!r} is {node.status}, not ready")
        self._ready.remove(node)
        node.status = "running"
        node.visits += 1
        step = node.step
        agent_memory = step.memory == "agent"
        dependencies: dict[str, Any] = {}
        for dep in node.deps:
            dep_node = self._nodes[dep]
            if dep_node.fire_and_forget or (agent_memory and dep_node.step.memory == "agent"):
                continue
            if dep_node.status == "completed":
                dependencies[dep] = self.state[dep]["output"]
            elif dep_node.status == "failed":
                dependencies[dep] = None
        conversation_id = None
        if agent_memory:
            # Each agent-memory step works on a fork of the shared conversation and its
            # messages join it in one piece when it completes (in `advance`), so parallel
            # steps never interleave messages and every tool call stays next to its result.
            memory = self.context.memory
            conversation_id = f"{self.context.run_id}/{step_id}#{node.visits}"
            shared = memory.snapshot(self._shared)
            memory.restore(shared, conversation_id)
            node.fork_base = shared.length
        executor = StepExecutor(
            step,
            self.context,
            state=self._state_view,
            dependencies=dependencies,
            visit=node.visits,
            conversation_id=conversation_id,
            checked=True,  # the graph checked every step before the run
        )
        if node.fire_and_forget:
            # Its dependents do not wait for it to finish, only for it to start.
            self._propagate(self.graph.dependents[step_id])
        return executor

    def _needs_routing(self, execution: StepExecution) -> bool:
        """Whether `route` has anything to decide after this execution."""
        if not self.graph.outgoing[execution.step_id]:
            return False
        status = execution.status
        return status is StepStatus.COMPLETED or (
            status is StepStatus.FAILED and self._nodes[execution.step_id].optional
        )

    async def route(self, execution: StepExecution) -> Routing | None:
        """Ask the selection chain where the run goes after `execution` (``None``: the step
        has no transitions, or failed and is not optional). It may call a model, so it runs
        before `advance`, in the step's own task."""
        if not self._needs_routing(execution):
            return None
        step_id = execution.step_id
        request = SelectionRequest(
            step=self._nodes[step_id].step,
            execution=execution,
            candidates=self.graph.outgoing[step_id],
            state=self._state_view,
            context=self.context,
            steps=self.graph.steps,
        )
        return await self.selection_chain.select(request)

    # -- the one place a run moves on ----------------------------------------------------------

    def advance(
        self, execution: StepExecution, routing: Routing | None = None, *, quiet: bool = False
    ) -> None:
        """Record a finished execution, apply its routing, and settle what follows it.
        `quiet`: the execution was restored from a checkpoint, and its routing decision was
        said when it was first made."""
        node = self._nodes[execution.step_id]
        if node.status != "running":
            raise RuntimeError(f"step {node.id!r} is {node.status}, not running")
        self.executions.append(execution)
        if node.stale:
            # A loop went back past this step while it ran: it runs again in the new round.
            node.stale = False
            node.status = "waiting"
            self._propagate((node.id,))
            return
        completed = execution.status is StepStatus.COMPLETED
        node.status = "completed" if completed else "failed"
        self._publish(node, execution.output if completed else None, execution)
        if completed and node.step.memory == "agent":
            self.context.memory.append(self._shared, *execution.messages[node.fork_base :])
        if not completed and not node.optional and not node.fire_and_forget:
            self.failures.append(execution)
        if routing is not None:
            self._apply(node, routing, quiet=quiet)
        self._propagate(self.graph.followers[node.id])

    def close(self, reason: str | None = None) -> None:
        """Skip every step that has not run and cannot any more, with `reason` (by default,
        why it was not reached)."""
        for node in self._nodes.values():
            if node.status in ("waiting", "ready"):
                if node.status == "ready":
                    self._ready.remove(node)
                why = reason
                if why is None:
                    why = (
                        "not reached: no transition chose it"
                        if node.gate and not node.activated
                        else "not reached"
                    )
                self._skip(node, why, failure=reason is not None)

    # -- internals -----------------------------------------------------------------------------

    def _publish(self, node: _Node, output: Any, execution: StepExecution) -> None:
        self.state[node.id] = {
            "output": jsonable(output),
            "status": execution.status.value,
            "error": execution.error,
            "visit": execution.visit,
        }
        for alias in self._aliases.get(node.id, ()):
            self.state[alias] = self.state[node.id]["output"]

    def _apply(self, node: _Node, routing: Routing, *, quiet: bool = False) -> None:
        node.routing = routing
        if self.context.events.active and not quiet:
            self.context.events.emit(
                RoutingDecided(
                    step_id=node.id,
                    chosen=routing.chosen,
                    skipped=routing.unchosen,
                    selector=routing.selector,
                    reason=routing.reason,
                )
            )
        for target in routing.chosen:
            if (node.id, target) in self.graph.loops:
                self._loop_back(node, target)
            self._nodes[target].activated = True

    def _loop_back(self, source: _Node, target: str) -> None:
        """Everything from `target` onwards runs again (what runs now finishes first)."""
        for step_id in self.graph.regions[target]:
            node = self._nodes[step_id]
            node.looped_by = (source.id, target)
            node.activated = False
            if node.status == "running":
                node.stale = True
            elif node.status == "ready":
                self._ready.remove(node)
                node.status = "waiting"
            else:
                node.status = "waiting"

    def _propagate(self, step_ids: Any) -> None:
        """Evaluate waiting steps; a skip queues what follows the skipped step."""
        todo = list(step_ids)
        todo.reverse()
        nodes = self._nodes
        while todo:
            node = nodes[todo.pop()]
            if node.status == "waiting" and self._evaluate(node):
                todo.extend(reversed(self.graph.followers[node.id]))

    def _evaluate(self, node: _Node) -> bool:
        """Make a waiting step ready, or skip it, or leave it waiting. True when skipped."""
        nodes = self._nodes
        satisfied = False
        unsettled = False
        void: list[str] = []
        for dep in node.deps:
            dep_node = nodes[dep]
            status = dep_node.status
            if status == "completed" or (dep_node.fire_and_forget and status in _SETTLED_BY_START):
                satisfied = True
            elif status == "failed":
                if not dep_node.optional:
                    return self._skip(node, f"dependency {dep!r} failed", failure=True)
                satisfied = True
            elif status == "skipped":
                if dep_node.skip_failure:
                    return self._skip(
                        node, f"dependency {dep!r} was skipped after a failure", failure=True
                    )
                void.append(dep)
            else:
                unsettled = True
        if node.gate and not node.activated:
            return self._close_gate(node)
        if unsettled:
            return False
        if void and not satisfied and not (node.gate and node.activated):
            shown = ", ".join(map(repr, void))
            return self._skip(node, f"only unchosen or unreached steps lead to it ({shown})")
        if node.visits >= node.step.max_visits:
            loop = ""
            if node.looped_by is not None:
                loop = f" (the loop {node.looped_by[0]} -> {node.looped_by[1]} did not end)"
            self.error = (
                f"step {node.id!r} reached its max_visits ({node.step.max_visits}): it cannot "
                f"run again{loop}"
            )
            return False
        node.status = "ready"
        insort(self._ready, node, key=_BY_INDEX)
        return False

    def _close_gate(self, node: _Node) -> bool:
        """A step only transitions lead to, none chose yet: skip it once all have decided."""
        failed: str | None = None
        reasons = []
        for source_id in node.gate:
            source = self._nodes[source_id]
            if source.status in _UNDECIDED:
                return False
            if (source.status == "failed" and not source.optional) or (
                source.status == "skipped" and source.skip_failure
            ):
                failed = source_id
            elif source.status == "skipped":
                reasons.append(f"{source_id!r} was skipped")
            elif source.routing is not None:
                chose = ", ".join(map(repr, source.routing.chosen)) or "nothing"
                reasons.append(f"{source_id!r} chose {chose} ({source.routing.reason})")
        if failed is not None:
            return self._skip(node, f"step {failed!r} failed before choosing it", failure=True)
        return self._skip(node, "not chosen: " + "; ".join(reasons))

    def _skip(self, node: _Node, reason: str, *, failure: bool = False) -> bool:
        node.status = "skipped"
        node.skip_failure = failure
        execution = StepExecution(
            step_id=node.id,
            status=StepStatus.SKIPPED,
            error=reason,
            visit=node.visits + 1,
            step=node.step,
        )
        self.executions.append(execution)
        self._publish(node, None, execution)
        self.context.events.emit(StepSkipped(step_id=node.id, reason=reason))
        return True
