"""TOKENS — prompt tokens of one task with per-step memory versus shared full history.

A 6-step task: each step depends on the previous one and produces ~2,000 tokens of output.
The same recipe runs with every step's `memory="step"` (each step gets its own conversation:
the system prompt, its goal and the output of its direct dependency) and with
`memory="agent"` (the steps share one conversation, the full-history style). The number is
the prompt tokens summed over the run, from `AgentResult.usage`.

How tokens are counted: the model is a `minions.testing.FunctionModel` whose function
counts the prompt tokens of the request it actually received and reports them as `Usage`:
for every message of the request (system, user, assistant, tool) ``ceil(len(text) / 4)``
tokens of its text, plus the same for the name and JSON arguments of each tool call it
carries. Each answer is ~8,000 characters (~2,000 tokens), counted the same way. The run's
total is checked against a recount over every request the model received, and the whole
comparison is repeated with a whitespace word count instead, to show the ratio does not
depend on the tokenizer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Literal

from _common import emit, fail, mark_imported, summary

from minions import (
    AgentExecutor,
    AgentRecipe,
    AgentResult,
    DefaultStep,
    Message,
    MessageBundle,
    ModelCallResponse,
    Prompt,
    StepStatus,
    Usage,
)
from minions.testing import FunctionModel

mark_imported()

STEPS = 6
OUTPUT_CHARS = 8000  # ~2,000 tokens at four characters a token.
SYSTEM = "You write a report one section at a time, building on the section before."
SENTENCE = (
    "The {n}th finding of section {section} holds across the sampled sites, with the "
    "measured effect within the expected range and no outlier left unexplained. "
)

Tokenizer = Callable[[str], int]
Memory = Literal["step", "agent"]


def char_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def word_tokens(text: str) -> int:
    return len(text.split())


def prompt_tokens(prompt: Prompt, tokenizer: Tokenizer) -> int:
    """Tokens of every message in the request, tool calls included."""
    total = 0
    for message in prompt.messages:
        total += tokenizer(message.content)
        for call in message.tool_calls:
            total += tokenizer(call.name + json.dumps(dict(call.arguments), default=str))
    return total


def section(step_id: str) -> str:
    """A distinct ~8,000-character answer for each step."""
    parts = [f"Section {step_id}. "]
    n = 0
    while sum(map(len, parts)) < OUTPUT_CHARS:
        n += 1
        parts.append(SENTENCE.format(n=n, section=step_id))
    return "".join(parts)[:OUTPUT_CHARS]


def token_model(tokenizer: Tokenizer) -> FunctionModel:
    def answer(prompt: Prompt) -> ModelCallResponse:
        text = section(prompt.step_id or "?")
        return ModelCallResponse(
            message=Message.assistant(text),
            usage=Usage.of_call(prompt_tokens(prompt, tokenizer), tokenizer(text)),
        )

    return FunctionModel(answer, name="token-counting")


def recipe(memory: Memory, model: FunctionModel) -> AgentRecipe:
    steps = []
    for i in range(STEPS):
        goal = f"Write section {i + 1} of {STEPS} of the report."
        steps.append(
            DefaultStep(
                f"s{i}",
                MessageBundle(system=SYSTEM, goal=goal),
                depends_on=[f"s{i - 1}"] if i else [],
                memory=memory,
                model=model,
            )
        )
    return AgentRecipe(id=f"tokens-{memory}", steps=steps)


def run(memory: Memory, tokenizer: Tokenizer) -> tuple[AgentResult, FunctionModel]:
    model = token_model(tokenizer)
    result = AgentExecutor().execute_sync(recipe(memory, model))
    if result.status is not StepStatus.COMPLETED:
        fail(f"TOKENS: the {memory} run failed: {result.error}")
    recount = sum(prompt_tokens(p, tokenizer) for p in model.requests)
    if len(model.requests) != STEPS or result.usage.prompt_tokens != recount:
        fail(f"TOKENS: usage {result.usage} does not match the {len(model.requests)} requests")
    if not result.usage.complete:
        fail("TOKENS: a model call reported no usage")
    # What each mode must put in front of the last step.
    last = str(model.requests[-1])
    earlier = [section(f"s{i}") for i in range(STEPS - 1)]
    if memory == "step" and (earlier[-1] not in last or any(e in last for e in earlier[:-1])):
        fail("TOKENS: with memory='step' the last step must see only its dependency's output")
    if memory == "agent" and not all(e in last for e in earlier):
        fail("TOKENS: with memory='agent' the last step must see the whole history")
    return result, model


def per_step(result: AgentResult) -> list[int]:
    usage = result.usage_by_step()
    return [usage[f"s{i}"].prompt_tokens for i in range(STEPS)]


def main() -> None:
    step, _ = run("step", char_tokens)
    agent, _ = run("agent", char_tokens)
    step_words, _ = run("step", word_tokens)
    agent_words, _ = run("agent", word_tokens)
    saved = 1 - step.usage.prompt_tokens / agent.usage.prompt_tokens
    saved_words = 1 - step_words.usage.prompt_tokens / agent_words.usage.prompt_tokens
    output = char_tokens(section("s0"))
    # With each step depending on the previous one, per-step memory still has to carry one
    # ~2,000-token output into each of steps 2..6, where full history carries 1, 2, ... 5.
    bound = 1 - (STEPS - 1) / sum(range(STEPS))
    for result, memory, headline in ((step, "step", True), (agent, "agent", False)):
        extra = {
            "steps": STEPS,
            "output_tokens_per_step": output,
            "prompt_tokens_per_step": per_step(result),
            "completion_tokens": result.usage.completion_tokens,
            "tokenizer": "ceil(len(text) / 4) over every message of each request",
        }
        if headline:
            extra |= {
                "full_history_prompt_tokens": agent.usage.prompt_tokens,
                "fewer_than_full_history_pct": round(saved * 100, 1),
                "fewer_with_word_count_pct": round(saved_words * 100, 1),
                "best_possible_pct_for_this_task": round(bound * 100, 1),
            }
        emit(
            "TOKENS",
            f'memory="{memory}"',
            headline=headline,
            primary="prompt_tokens",
            metrics={"prompt_tokens": summary([result.usage.prompt_tokens], "tokens")},
            extra=extra,
        )


if __name__ == "__main__":
    main()
