"""When is a step done? A chain of responsibility of completion links.

After every model answer (and its tool calls), the step asks its `StepCompletionChain`. Each
`StepCompletionLink` returns a `CompletionDecision`, or ``None`` to pass to the next link; the
first decision wins. When no link decides, the loop goes on with another model call.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal

from minions._chain import LinkChain, NamedLink
from minions._generic import OutputT
from minions._messages import COMPLETION_TOOL as COMPLETION_TOOL  # named here too (the links')
from minions._text import as_text
from minions.errors import OutputValidationError

if TYPE_CHECKING:
    from minions._step.context import AgentContext
    from minions._step.execution import StepExecution

__all__ = [
    "CallLimitLink",
    "CompletionDecision",
    "CompletionMarkerLink",
    "CompletionToolLink",
    "StepCompletionChain",
    "StepCompletionLink",
    "StructuredOutputLink",
    "TextAnswerLink",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionDecision(Generic[OutputT]):
    """What a completion link decided; generic in the output it completes with
    (``CompletionDecision.complete(expense)`` is a ``CompletionDecision[Expense]``).

    * ``complete``: the step is done with `output`;
    * ``incomplete``: not done; `note` is added to the conversation and the loop goes on;
    * ``fail``: the step fails with `reason`;
    * ``reask``: the answer is invalid; the conversation is restored to before it and the
      model is asked again with `note` (a transactional retry, bounded by
      `ExecutionConfig.max_output_retries`).
    """

    kind: Literal["complete", "incomplete", "fail", "reask"]
    output: OutputT | None = None
    note: str | None = None
    reason: str = ""
    next_step: str | None = None

    @staticmethod
    def complete(
        output: OutputT, *, reason: str = "", next_step: str | None = None
    ) -> CompletionDecision[OutputT]:
        """The step is done with `output` (and suggests `next_step` to run next)."""
        return CompletionDecision(
            kind="complete", output=output, reason=reason, next_step=next_step
        )

    @staticmethod
    def incomplete(note: str, *, reason: str = "") -> CompletionDecision[Any]:
        """Not done: `note` is added to the conversation and the loop goes on."""
        return CompletionDecision(kind="incomplete", note=note, reason=reason or note)

    @staticmethod
    def fail(reason: str) -> CompletionDecision[Any]:
        """The step fails with `reason`."""
        return CompletionDecision(kind="fail", reason=reason)

    @staticmethod
    def reask(note: str, *, reason: str = "") -> CompletionDecision[Any]:
        """The answer is invalid: back to before it, and ask again with `note` (within
        `ExecutionConfig.max_output_retries`)."""
        return CompletionDecision(kind="reask", note=note, reason=reason or note)


class StepCompletionLink(NamedLink, ABC):
    """One link of a completion chain.

    Subclass it and implement `check`, sync or async. Return ``None`` to let the next link
    decide. `name` identifies the link in the chain, in events and on the execution.
    """

    @abstractmethod
    def check(
        self, execution: StepExecution[Any], context: AgentContext
    ) -> CompletionDecision[Any] | Awaitable[CompletionDecision[Any] | None] | None:
        """Decide about the step's latest answer, or return ``None`` to pass."""


def _next_step_of(output: Any) -> str | None:
    value = (
        output.get("next_step") if isinstance(output, dict) else getattr(output, "next_step", None)
    )
    return value if isinstance(value, str) and value else None


class CompletionToolLink(StepCompletionLink):
    """The model called the completion tool (`complete_step`) offered to the step."""

    name = "completion_tool"

    def check(
        self, execution: StepExecution[Any], context: AgentContext
    ) -> CompletionDecision[Any] | None:
        response = execution.last_response
        if response is None:
            return None
        for call in response.tool_calls:
            if call.name != COMPLETION_TOOL:
                continue
            result = call.arguments.get("result")
            next_step = call.arguments.get("next_step") or None
            output = execution.step.output if execution.step is not None else None
            if output is not None:
                try:
                    result = output.validate_python(result)
                except OutputValidationError as exc:
                    return CompletionDecision.reask(str(exc))
            elif result is not None and not isinstance(result, str):
                # A step without an output schema answers text (`DefaultStep[str]`).
                result = as_text(result)
            return CompletionDecision.complete(
                result, reason=f"the model called {COMPLETION_TOOL}", next_step=next_step
            )
        return None


class CompletionMarkerLink(StepCompletionLink):
    """A completion marker (e.g. ``TASK_COMPLETE``) or pattern in the text ends the step.

    Active only for steps that set `completion_marker` or `completion_pattern`. The output is
    the text without the marker, or the pattern's ``output`` group when it has one. A text
    answer without the marker asks the model to go on.
    """

    name = "completion_marker"

    def check(
        self, execution: StepExecution[Any], context: AgentContext
    ) -> CompletionDecision[Any] | None:
        step = execution.step
        response = execution.last_response
        if step is None or response is None:
            return None
        marker, pattern = step.completion_marker, step.completion_pattern
        if marker is None and pattern is None:
            return None
        text = response.text
        if marker is not None and marker in text:
            return CompletionDecision.complete(
                text.replace(marker, "").strip(), reason=f"marker {marker!r} found"
            )
        if pattern is not None:
            match = re.search(pattern, text, re.DOTALL)
            if match is not None:
                output = match.group("output") if "output" in match.re.groupindex else text
                return CompletionDecision.complete(
                    output.strip(), reason=f"pattern {pattern!r} matched"
                )
        if response.tool_calls:
            return None
        expected = f"end your reply with {marker}" if marker else f"match {pattern!r}"
        return CompletionDecision.incomplete(
            f"Continue with the task. When it is done, {expected}.",
            reason="no completion marker in the answer",
        )


class StructuredOutputLink(StepCompletionLink):
    """The step wants structured output: validate it, or re-ask with what was wrong.

    Output is accepted as provider-validated output, as the arguments of a call to the output
    tool, or as JSON text (bare, fenced, or in prose).
    """

    name = "structured_output"

    def check(
        self, execution: StepExecution[Any], context: AgentContext
    ) -> CompletionDecision[Any] | None:
        step = execution.step
        output = step.output if step is not None else None
        response = execution.last_response
        if output is None or response is None:
            return None
        if response.output is not None:
            return CompletionDecision.complete(
                response.output,
                reason=f"structured output ({response.output_mode or 'provider'})",
                next_step=_next_step_of(response.output),
            )
        try:
            for call in response.tool_calls:
                if call.name == output.tool_name:
                    value = output.validate_python(dict(call.arguments))
                    return CompletionDecision.complete(
                        value,
                        reason="structured output (tool call)",
                        next_step=_next_step_of(value),
                    )
            if response.tool_calls:
                return None
            value = output.validate_json(response.text)
        except OutputValidationError as exc:
            return CompletionDecision.reask(str(exc))
        return CompletionDecision.complete(
            value, reason="structured output (text)", next_step=_next_step_of(value)
        )


class TextAnswerLink(StepCompletionLink):
    """The model answered with text and asked for no tool: that text is the output."""

    name = "text_answer"

    def check(
        self, execution: StepExecution[Any], context: AgentContext
    ) -> CompletionDecision[Any] | None:
        response = execution.last_response
        if response is None or response.tool_calls:
            return None
        if not response.text.strip():
            return CompletionDecision.reask(
                "Your reply was empty. Answer the task.", reason="the reply was empty"
            )
        return CompletionDecision.complete(response.text, reason="text answer without tool calls")


class CallLimitLink(StepCompletionLink):
    """The step reached its `max_model_calls_per_step` without finishing: it fails.

    The one place the limit is checked: the step loop asks this link too after an answer no
    link decided on, so a chain without it still stops at the limit.
    """

    name = "call_limit"

    def check(
        self, execution: StepExecution[Any], context: AgentContext
    ) -> CompletionDecision[Any] | None:
        limit = (execution.config or context.config).max_model_calls_per_step
        if execution.turns >= limit:
            return CompletionDecision.fail(
                f"reached max_model_calls_per_step ({limit}) without completing"
            )
        return None


class StepCompletionChain(LinkChain[StepCompletionLink]):
    """An ordered, immutable chain of completion links.

    Editing methods (`add_first`, `add_last`, `add_before`, `add_after`, `remove`, `replace`)
    return a new chain, so a shared chain (such as the default) is never changed behind
    anyone's back::

        chain = StepCompletionChain.default().add_before("text_answer", MyLink())
    """

    __slots__ = ()
    kind = "completion link"

    @classmethod
    def default(cls) -> StepCompletionChain:
        """Completion tool, marker, structured output, text answer, call limit."""
        return _DEFAULT

    async def check(
        self, execution: StepExecution[Any], context: AgentContext
    ) -> tuple[StepCompletionLink, CompletionDecision[Any]] | None:
        """Walk the links in order; the first decision wins. ``None``: nobody decided."""
        for link in self.links:
            # `answer_of` inlined: this loop runs after every answer, and most links are sync.
            decision = link.check(execution, context)
            if decision is not None and not isinstance(decision, CompletionDecision):
                decision = await decision
            if decision is not None:
                return link, decision
        return None


_DEFAULT = StepCompletionChain(
    (
        CompletionToolLink(),
        CompletionMarkerLink(),
        StructuredOutputLink(),
        TextAnswerLink(),
        CallLimitLink(),
    )
)
