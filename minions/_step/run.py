"""StepRun: what a step's `run` works with, instead of the whole `StepExecutor`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

if TYPE_CHECKING:
    from minions._messages import ToolCallResponse
    from minions._step.context import AgentContext
    from minions._step.execution import StepExecution
    from minions._step.step import Step
    from minions.events import Event

__all__ = ["StepRun"]


class StepRun(Protocol):
    """What `Step.run` works with: one execution of one step (a `StepExecutor` is one).

    A step kind of its own does its work through these, and ends with `complete` or `fail`;
    what it does is recorded on the step's `StepExecution` and in the run's events like the
    built-in kinds' work.
    """

    @property
    def step(self) -> Step:
        """The step being run."""

    @property
    def context(self) -> AgentContext:
        """The run's context: model, tools, memory, config, inputs, events."""

    @property
    def execution(self) -> StepExecution:
        """The record of this execution so far (its tool calls, model calls, usage...).

        Read it; change it only through the methods here (`call_tool`, `absorb`, `complete`,
        `fail`).
        """

    @property
    def name(self) -> str:
        """The execution's name: the step id, plus ``[index]`` for a loop item."""

    @property
    def scope(self) -> str:
        """A stable name for this execution within the run (``step#visit[item]``)."""

    @property
    def visit(self) -> int:
        """Which visit of the step this is (loops bring steps back)."""

    @property
    def item(self) -> int | None:
        """For one item of a loop step: its index; ``None`` otherwise."""

    @property
    def state(self) -> Mapping[str, Any]:
        """The run state templates read: ``inputs``, step results by id, ``loop``..."""

    @property
    def dependencies(self) -> Mapping[str, Any]:
        """The outputs of the step's direct dependencies, by step id."""

    async def run_model_loop(self) -> None:
        """The model and tool loop (the default `Step.run`), until the completion chain
        decides; it completes or fails the step."""

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolCallResponse:
        """Call one of the step's tools (with the run's tool retries) and record the call.

        Never raises for a tool's failure: the response's `error` says what went wrong.
        """

    async def run_step(
        self,
        step: Step,
        *,
        state: Mapping[str, Any] | None = None,
        dependencies: Mapping[str, Any] | None = None,
        item: int | None = None,
        scope: str | None = None,
        checked: bool = False,
    ) -> StepExecution:
        """Run another step inside this one (a loop item, a helper call) and return its
        execution; count it in this one with `absorb`.

        Args:
            step: the step to run.
            state: its template state (this execution's by default).
            dependencies: the dependency outputs its prompt shows (this execution's by
                default).
            item: the index of a loop item (it is named ``step[item]``).
            scope: its scope (``{this scope}/{step id}`` by default).
            checked: its definition was checked already.
        """

    def absorb(self, executions: Sequence[StepExecution], *, items: bool = False) -> None:
        """Count the model calls, tool calls and usage of inner executions in this one, and
        with `items` keep them as this execution's `items` (a loop's items, in order)."""

    def complete(self, output: Any, *, next_step: str | None = None) -> None:
        """End the step as COMPLETED with `output` (and a suggestion of what runs next)."""

    def fail(self, reason: str, *, output: Any = None) -> NoReturn:
        """End the step as FAILED with `reason` (keeping a partial `output`); does not
        return."""

    def emit(self, event: Event) -> None:
        """Emit one of the run's events (`minions.events`), stamped with run id and order."""
