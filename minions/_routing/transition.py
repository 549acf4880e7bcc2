"""Transitions: where a run may go after a step, and on what condition."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any, TypeAlias

__all__ = ["Condition", "Transition"]

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
