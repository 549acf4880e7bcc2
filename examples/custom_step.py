"""Extend minions in Python: a `Step` subclass with its own prompt, and a completion link.

    python examples/custom_step.py            # offline, with a scripted model
    MINIONS_MODEL=ollama:llama3.2:3b python examples/custom_step.py

`CitedAnswerStep` builds its conversation from numbered sources instead of dependency
outputs. `RequireCitations` is a completion link: an answer without a ``[n]`` citation is not
accepted; the model gets one short note and answers again (and the failed attempt leaves no
trace in the conversation).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence
from typing import Any

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    CompletionDecision,
    DefaultStep,
    Message,
    Model,
    StepCompletionChain,
    StepCompletionLink,
    StepExecution,
    StepInput,
)
from minions.testing import ScriptedModel

SOURCES = [
    "Bees pollinate about three quarters of the leading food crops (IPBES 2016).",
    "US beekeepers lost around 30 % of colonies each winter over the last decade.",
    "Flower strips along fields raise wild bee numbers.",
]


class CitedAnswerStep(DefaultStep):
    """Answers a question from numbered sources, citing them as [n]."""

    def __init__(self, id: str, question: str, sources: Sequence[str], **options: Any) -> None:
        super().__init__(id, question, **options)
        self.sources = list(sources)

    def build_messages(self, step_input: StepInput) -> list[Message]:
        numbered = "\n".join(f"[{i}] {text}" for i, text in enumerate(self.sources, 1))
        return [
            Message.system("Answer in one or two sentences. Cite sources as [n]."),
            Message.user(f"Sources:\n{numbered}\n\nQuestion: {self.bundle.goal}"),
        ]


class RequireCitations(StepCompletionLink):
    """A text answer must cite at least one source that exists."""

    name = "require_citations"

    def __init__(self, count: int) -> None:
        self.count = count

    def check(self, execution: StepExecution, context: AgentContext) -> CompletionDecision | None:
        response = execution.last_response
        if response is None or response.tool_calls:
            return None  # not a final answer: let the next link decide
        cited = {int(n) for n in re.findall(r"\[(\d+)\]", response.text)}
        if not cited or not cited <= set(range(1, self.count + 1)):
            return CompletionDecision.reask(
                f"Cite the sources you used as [n], n from 1 to {self.count}.",
                reason="no valid citation",
            )
        return None  # cited: the default text-answer link completes the step


def build(model: Model | str | None = None) -> AgentRecipe:
    chain = StepCompletionChain.default().add_first(RequireCitations(len(SOURCES)))
    step = CitedAnswerStep(
        "answer", "Why do bees matter, and what helps them?", SOURCES, completion=chain
    )
    return AgentRecipe(id="cited", steps=[step], model=model)


def main() -> None:
    model: Model | str = os.environ.get("MINIONS_MODEL") or ScriptedModel(
        [
            "Bees pollinate most food crops, and flower strips help them.",  # no citation
            "Bees pollinate most leading food crops [1]; flower strips help wild bees [3].",
        ]
    )
    result = asyncio.run(AgentExecutor().execute(build(model)))
    execution = result.step("answer")
    print(result.output)
    for decision in execution.decisions:
        print(f"  {decision.link}: {decision.kind} ({decision.reason})")
    if not result.ok:
        raise SystemExit(result.error)


if __name__ == "__main__":
    main()
