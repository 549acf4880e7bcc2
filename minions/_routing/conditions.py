"""Transition conditions: what they read about the step that just ended, and how they are
evaluated (a JMESPath expression or ``{{ template }}`` over that state, or a callable)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from minions._templates import render
from minions._text import jsonable

if TYPE_CHECKING:
    from minions._routing.transition import Transition
    from minions._step.execution import StepExecution

__all__: list[str] = []


def condition_state(execution: StepExecution, state: Mapping[str, Any]) -> dict[str, Any]:
    """What a transition's condition reads: the run state, plus the source step's ``output``,
    ``status``, ``error`` and ``visit`` at the top level."""
    return {
        **state,
        "output": _readable(execution.output),
        "status": execution.status.value,
        "error": execution.error,
        "visit": execution.visit,
    }


def _readable(output: Any) -> Any:
    """The output a condition reads: a text reply that is a JSON object or array (what a model
    answers without an output schema) is read as that value, so ``output.topic`` works."""
    if isinstance(output, str):
        text = output.strip()
        if text[:1] in ("{", "["):
            try:
                return json.loads(text)
            except ValueError:
                return output
        return output
    return jsonable(output)


def as_template(condition: str) -> str:
    """A condition as a template: a bare JMESPath expression is wrapped in ``{{ }}``."""
    return condition if "{{" in condition else "{{ " + condition + " }}"


async def evaluate_condition(
    transition: Transition, execution: StepExecution, state: Mapping[str, Any]
) -> bool:
    """Whether `transition`'s condition holds after `execution` (true without a condition).

    `state` is what expressions read: `condition_state` of the execution and the run state,
    built once for all the transitions of one step.

    Raises:
        TemplateError: the expression failed (a JMESPath function given the wrong type, say),
            or has no value (`missing`; the caller reads that as false, and says so).
    """
    when = transition.when
    if when is None:
        return True
    if isinstance(when, str):
        return bool(render(as_template(when), state))
    value = when(execution.output)
    if inspect.isawaitable(value):
        value = await value
    return bool(value)
