"""AgentResult: what a whole run did."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from minions._messages import Usage
from minions._step.execution import StepExecution, StepStatus
from minions._values import preview, tokens_text

if TYPE_CHECKING:
    from minions._step.step import Step

_T = TypeVar("_T")

__all__ = ["AgentResult"]


@dataclass(frozen=True, kw_only=True)
class AgentResult:
    """The record of one run of a recipe.

    Attributes:
        run_id: the run's id (also on every event of the run).
        recipe_id: the recipe that ran.
        status: `StepStatus.COMPLETED`, or `StepStatus.FAILED` when a step that is neither
            optional nor fire-and-forget failed, or the run could not go on (`error`).
        executions: every `StepExecution`, in completion order; skipped steps are there as
            SKIPPED executions whose `error` says why; a step a loop brought back appears
            once per visit.
        output: the output of `AgentRecipe.output_step`, or else of the last step to complete
            among those nothing comes after.
        error: why the run failed.
        usage: tokens of every model call of the run (all steps, retries and routing).
        inputs: the inputs the run had.
        state: the final template state (``inputs``, each step's result by id, aliases).
        started_at: when the run started (epoch seconds).
        finished_at: when it ended.
        waited: seconds of its duration it was blocked: every step it was running was
            waiting (for an endpoint's limits, a person's approval).
    """

    run_id: str
    recipe_id: str
    status: StepStatus
    executions: tuple[StepExecution[Any], ...]
    output: Any = None
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict, repr=False)
    started_at: float = 0.0
    finished_at: float = 0.0
    waited: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the run completed."""
        return self.status is StepStatus.COMPLETED

    @property
    def duration(self) -> float:
        """Seconds from start to end."""
        return self.finished_at - self.started_at

    @overload
    def step(self, step: Step[_T]) -> StepExecution[_T]: ...
    @overload
    def step(self, step: str) -> StepExecution[Any]: ...
    def step(self, step: Step[Any] | str) -> StepExecution[Any]:
        """The latest execution of a step (its last visit), by the step itself or its id: a
        step object gives its typed execution (``result.step(advise)`` of a
        ``DefaultStep[Advice]`` is a ``StepExecution[Advice]``).

        Raises:
            KeyError: the step did not run and was not skipped in this run.
        """
        step_id = step if isinstance(step, str) else step.id
        for execution in self.executions[::-1]:
            if execution.step_id == step_id:
                return execution
        raise KeyError(step_id)

    @overload
    def visits(self, step: Step[_T]) -> tuple[StepExecution[_T], ...]: ...
    @overload
    def visits(self, step: str) -> tuple[StepExecution[Any], ...]: ...
    def visits(self, step: Step[Any] | str) -> tuple[StepExecution[Any], ...]:
        """Every execution of a step (by the step or its id), in order."""
        step_id = step if isinstance(step, str) else step.id
        return tuple(e for e in self.executions if e.step_id == step_id)

    def _with(self, status: StepStatus) -> tuple[str, ...]:
        latest = {e.step_id: e.status for e in self.executions}
        return tuple(step_id for step_id, s in latest.items() if s is status)

    @property
    def completed(self) -> tuple[str, ...]:
        """Ids of the steps whose latest execution completed."""
        return self._with(StepStatus.COMPLETED)

    @property
    def failed(self) -> tuple[str, ...]:
        """Ids of the steps whose latest execution failed."""
        return self._with(StepStatus.FAILED)

    @property
    def skipped(self) -> tuple[str, ...]:
        """Ids of the steps whose latest execution was skipped."""
        return self._with(StepStatus.SKIPPED)

    def usage_by_step(self) -> dict[str, Usage]:
        """Tokens per step, summed over its visits."""
        totals: dict[str, Usage] = {}
        for execution in self.executions:
            totals[execution.step_id] = totals.get(execution.step_id, Usage()) + execution.usage
        return totals

    def __repr__(self) -> str:
        # Short, in the calls' style: the fields hold every detail.
        parts = [
            f"recipe={self.recipe_id!r}",
            f"run_id={self.run_id!r}",
            f"status={self.status.value!r}",
            f"steps={len(self.executions)}",
        ]
        if self.error:
            parts.append(f"error={preview(self.error)}")
        elif self.output is not None:
            parts.append(f"output={preview(self.output)}")
        if self.usage.calls:
            parts += [f"model_calls={self.usage.calls}", f"tokens={tokens_text(self.usage)}"]
        return f"AgentResult({', '.join(parts)})"
