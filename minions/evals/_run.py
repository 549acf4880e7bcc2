"""What a check sees of one case run: `CaseRun`, and the result document that `expr:` checks
and judges' rubrics read."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minions._messages import Usage
from minions._text import jsonable

if TYPE_CHECKING:
    from minions._step.execution import StepExecution
    from minions._step.result import AgentResult
    from minions.evals._dataset import Case

__all__ = ["CaseRun"]


@dataclass(frozen=True, kw_only=True)
class CaseRun:
    """One repetition of one case, run: what every check is given.

    Attributes:
        case: the case.
        target: the id of the recipe it ran.
        repetition: 1 for the case's first run, 2 for the second...
        run_id: the run's id (on its events; in the report).
        status: ``"completed"`` or ``"failed"``.
        output: the run's output (plain JSON data).
        error: why the run failed.
        document: the result document (see docs/evals.md): what `expr:` checks read.
        result: the run's `AgentResult` (``None`` for a run done elsewhere, e.g. on a worker).
        usage: the tokens of the run's model calls.
        duration: seconds the run took.
        problem: why the run cannot be graded (a replay that has no reply for a call, a model
            that cannot be reached): the case run is then an error, not a failure.
        stopped: the run was cut short by the eval's token budget (`max_tokens`); it is not
            graded.
        models: tokens by the model that answered (what prices apply to).
    """

    case: Case
    target: str
    repetition: int
    run_id: str
    status: str
    output: Any = None
    error: str | None = None
    document: Mapping[str, Any] = field(default_factory=dict)
    result: AgentResult | None = field(default=None, repr=False)
    usage: Usage = field(default_factory=Usage)
    duration: float = 0.0
    problem: str | None = None
    stopped: bool = False
    models: Mapping[str, Usage] = field(default_factory=dict)

    @property
    def inputs(self) -> Mapping[str, Any]:
        """The run's inputs."""
        found = self.document.get("inputs")
        return found if isinstance(found, Mapping) else self.case.inputs

    @property
    def expected(self) -> Any:
        """The case's expected output (`Case.expected`; ``None`` when it has none)."""
        return self.case.expected if self.case.has_expected else None

    @property
    def completed(self) -> bool:
        return self.status == "completed"


def _usage(usage: Usage) -> dict[str, int]:
    return {**dataclasses.asdict(usage), "total_tokens": usage.total_tokens}


def _tool_calls(execution: StepExecution) -> list[dict[str, Any]]:
    calls = []
    for call in execution.tool_calls:
        response = call.response
        calls.append(
            {
                "name": call.name,
                "arguments": jsonable(dict(call.arguments)),
                "result": jsonable(response.result) if response is not None else None,
                "error": response.error if response is not None else None,
            }
        )
    return calls


def result_document(result: AgentResult, *, target: str, expected: Any = None) -> dict[str, Any]:
    """The result document of a run, as `expr:` checks and rubrics read it::

        {"run_id", "target", "status", "output", "error", "inputs", "expected",
         "usage": {"prompt_tokens", "completion_tokens", "total_tokens", "calls"},
         "duration", "model_calls",
         "steps": {step_id: {"status", "output", "error", "visits", "model_calls",
                             "usage", "duration", "tool_calls": [...]}},
         "tool_calls": [{"step", "name", "arguments", "result", "error"}, ...],
         "step_order": [step ids, in the order they started]}

    A step that ran several times (a loop back to it) is there as its last visit, with
    `visits` and the tool calls of every visit.
    """
    ran = sorted(
        (e for e in result.executions if e.started_at is not None),
        key=lambda e: e.started_at or 0.0,
    )
    steps: dict[str, dict[str, Any]] = {}
    for execution in result.executions:
        previous = steps.get(execution.step_id)
        calls = _tool_calls(execution)
        steps[execution.step_id] = {
            "status": execution.status.value,
            "output": jsonable(execution.output),
            "error": execution.error,
            "visits": (previous["visits"] + 1) if previous else 1,
            "model_calls": len(execution.model_calls)
            + (previous["model_calls"] if previous else 0),
            "usage": _usage(execution.usage),
            "duration": execution.duration,
            "tool_calls": [*(previous["tool_calls"] if previous else []), *calls],
        }
    tool_calls = [
        {"step": execution.step_id, **call} for execution in ran for call in _tool_calls(execution)
    ]
    return {
        "run_id": result.run_id,
        "target": target,
        "status": "completed" if result.ok else "failed",
        "output": jsonable(result.output),
        "error": result.error,
        "inputs": jsonable(dict(result.inputs)),
        "expected": jsonable(expected),
        "usage": _usage(result.usage),
        "duration": result.duration,
        "model_calls": sum(len(e.model_calls) for e in result.executions),
        "steps": steps,
        "tool_calls": tool_calls,
        "step_order": [e.step_id for e in ran],
    }
