"""AnalysisStep: one structured model call over given data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

from minions._kinds.example import schema_from_example
from minions._messages import MessageBundle
from minions._output import OutputInstructions
from minions._step.agent import DefaultStep
from minions._step.step import StepInput
from minions._templates import render

if TYPE_CHECKING:
    from minions._step.step import StepOptions

__all__ = ["AnalysisStep"]


ANALYSIS_SYSTEM = (
    "You analyse data carefully and answer with JSON only, following the rules you are given."
)
"""An analysis step's system prompt unless it gives its own."""
ANALYSIS_CONFIG: Mapping[str, Any] = {"max_model_calls_per_step": 1}
"""An analysis step's config unless it gives its own: one structured call."""


class AnalysisStep(DefaultStep):
    """One structured model call over given data.

    Args:
        id: the step id.
        input: the data to analyse (a template such as ``"{{ fetch.output }}"`` or a value).
        output: a JSON Schema, or an example object from which one is inferred (such as
            ``{"ids": [], "reasoning": ""}``), or `OutputInstructions`.
        goal: what to work out from the data (the rules to apply, the question to answer).
        system: the system prompt.
        **options: the `Step` options (`depends_on`, `model`, ...).
    """

    kind: ClassVar[str] = "analysis"

    def __init__(
        self,
        id: str,
        *,
        input: Any,
        output: Any,
        goal: str = "Analyse the data.",
        system: str | None = None,
        **options: Unpack[StepOptions],
    ) -> None:
        instructions = (
            output
            if isinstance(output, OutputInstructions)
            else OutputInstructions(schema_from_example(output), name=f"{id}_result")
        )
        options.setdefault("config", ANALYSIS_CONFIG)
        super().__init__(
            id,
            MessageBundle(
                goal=goal,
                system=system or ANALYSIS_SYSTEM,
            ),
            output=instructions,
            **options,
        )
        self.input = input

    def templates(self) -> Mapping[str, Any]:
        return {**super().templates(), "input": self.input}

    def extra_parts(self, step_input: StepInput) -> list[str]:
        """The data, once: JSON, or text as it is."""
        data = render(self.input, step_input.state)
        if isinstance(data, str):
            return [f"The data:\n```\n{data}\n```"]
        text = json.dumps(data, ensure_ascii=False, indent=1, default=str)
        return [f"The data:\n```json\n{text}\n```"]
