"""PLAN — plan and execute versus full history: prompt tokens, token ratio, speedup.

The seed's example, made exact: the requirements "Create a user management system with
authentication" over the small project in ``plan_project/`` (6 files of ~400 tokens). The
planner answers (scripted) with a 6-step plan: analyze (reads 2 files) -> generate the user
model (reads 1) -> generate the auth service and generate the API endpoints (each reads 1,
both after the model, independent of each other) -> validate (after both) -> cleanup. Each
step answers with an artifact of ~300 tokens.

* plan and execute: `PlanGenerator.generate`, then `PlanGenerator.execute`: each step's request
  holds its goal, the files it names and its dependencies' artifacts (the runner reads the
  files that exist before the run once, up front, at the same time).
* full history: the same work as one agent step with one conversation: for each step, a reply
  asking for its file reads as tool calls, the reads, then the same artifact as text (and the
  step's "continue" note), every request carrying everything before it.

Tokens: one deterministic counter, ``ceil(len(text) / 4)`` over every message of each request
the model received (tool calls included), planner included. ``overhead_vs_minimum`` divides
plan and execute's prompt tokens by the least any plan-and-execute run of this plan can send:
the planner's request, then for each step one system prompt and one message holding its goal,
its files and its dependencies' artifacts, nothing else (no labels). ``speedup``: the two runs
again with every tool call sleeping 100 ms and every model reply 50 ms: full-history makespan /
plan-and-execute makespan (median of 5 each).
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import emit, fail, mark_imported, summary

from minions import (
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    Message,
    MessageBundle,
    ModelCallResponse,
    PlanGenerator,
    Prompt,
    ToolCall,
    Usage,
    tool,
)
from minions._kinds.task import TASK_SYSTEM
from minions.testing import FunctionModel

mark_imported()

PROJECT = Path(__file__).with_name("plan_project")
REQUIREMENTS = "Create a user management system with authentication"
TOOL_DELAY = 0.1
MODEL_DELAY = 0.05
MARKER = "ALL STEPS DONE"

STEPS: list[dict[str, Any]] = [
    {
        "id": "analyze",
        "type": "analyze",
        "goal": "Read the README and the models; list what a user system must add: entities, "
        "fields, and where authentication fits.",
        "inputs": ["README.md", "app/models.py"],
        "artifacts": ["analysis"],
    },
    {
        "id": "user_model",
        "type": "generate",
        "goal": "Write the User model and its storage, following the analysis and app/db.py.",
        "inputs": ["app/db.py"],
        "depends_on": ["analyze"],
        "artifacts": ["user model"],
    },
    {
        "id": "auth",
        "type": "generate",
        "goal": "Write the authentication service (password hashing, login, tokens) for the "
        "User model, reading its settings as app/config.py does.",
        "inputs": ["app/config.py"],
        "depends_on": ["user_model"],
        "artifacts": ["auth service"],
    },
    {
        "id": "api",
        "type": "generate",
        "goal": "Write the API endpoints for users (register, login, me) in the style of "
        "app/api.py.",
        "inputs": ["app/api.py"],
        "depends_on": ["user_model"],
        "artifacts": ["user routes"],
    },
    {
        "id": "validate",
        "type": "validate",
        "goal": "Check that the auth service and the endpoints fit together; list problems.",
        "depends_on": ["auth", "api"],
        "artifacts": ["review"],
    },
    {
        "id": "cleanup",
        "type": "cleanup",
        "goal": "Summarise the work and what is left to do, for the release notes.",
        "depends_on": ["validate"],
        "artifacts": ["summary"],
    },
]
PLAN = {"id": "user-management", "description": REQUIREMENTS, "steps": STEPS}
SENTENCE = "Point {n} of {step}: the change keeps the existing style and is checked by a test. "


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def prompt_tokens(prompt: Prompt) -> int:
    total = 0
    for message in prompt.messages:
        total += tokens(message.content)
        for call in message.tool_calls:
            total += tokens(call.name + json.dumps(dict(call.arguments), default=str))
    return total


def artifact(step_id: str) -> str:
    """A distinct ~300-token (~1,200-character) artifact for each step."""
    parts, n = [], 0
    while sum(map(len, parts)) < 1200:
        n += 1
        parts.append(SENTENCE.format(n=n, step=step_id))
    return "".join(parts)[:1200]


def counted(answer: Callable[[Prompt], ModelCallResponse | str], delay: float) -> FunctionModel:
    """A model whose replies report the counter's tokens for the request it received."""

    async def reply(prompt: Prompt) -> ModelCallResponse:
        if delay:
            await asyncio.sleep(delay)
        found = answer(prompt)
        response = (
            found
            if isinstance(found, ModelCallResponse)
            else ModelCallResponse(message=Message.assistant(found))
        )
        out = response.message.content + "".join(
            c.name + json.dumps(dict(c.arguments)) for c in response.message.tool_calls
        )
        usage = Usage.of_call(prompt_tokens(prompt), tokens(out))
        return ModelCallResponse(
            message=response.message, usage=usage, finish_reason=response.finish_reason
        )

    return FunctionModel(reply, name="counting")


def slow_read(delay: float) -> Any:
    @tool(name="read_file")
    async def read_file(path: str) -> str:
        """Read a text file of the project.

        Args:
            path: the file's path inside the project.
        """
        if delay:
            await asyncio.sleep(delay)
        return (PROJECT / path).read_text()

    return read_file


# -- the two variants --------------------------------------------------------------------------


async def plan_and_execute(delay: bool) -> tuple[int, int, list[Prompt], float]:
    planner = counted(lambda prompt: json.dumps(PLAN), MODEL_DELAY if delay else 0)
    worker = counted(
        lambda prompt: json.dumps({"text": artifact(prompt.step_id or "")}),
        MODEL_DELAY if delay else 0,
    )
    started = time.perf_counter()
    generator = PlanGenerator(planner)
    read = slow_read(TOOL_DELAY if delay else 0)
    plan = await generator.generate(REQUIREMENTS, tools=[read], workspace=PROJECT)
    result = await generator.execute(
        plan, executor=AgentExecutor(model=worker), workspace=PROJECT, tools=[read]
    )
    elapsed = time.perf_counter() - started
    if not result.ok:
        fail(f"PLAN: the plan run failed: {result.error}")
    total = result.total()
    if total.source != "reported":
        fail("PLAN: a call reported no usage")
    recount = sum(prompt_tokens(p) for p in [*planner.requests, *worker.requests])
    if recount != total.prompt_tokens:
        fail(f"PLAN: the report says {total.prompt_tokens} prompt tokens, the requests {recount}")
    return total.prompt_tokens, prompt_tokens(planner.requests[0]), worker.requests, elapsed


def full_history_replies() -> list[ModelCallResponse | str]:
    replies: list[ModelCallResponse | str] = []
    for index, step in enumerate(STEPS):
        if step.get("inputs"):
            calls = tuple(
                ToolCall(id=f"{step['id']}-{i}", name="read_file", arguments={"path": p})
                for i, p in enumerate(step["inputs"])
            )
            replies.append(
                ModelCallResponse(message=Message.assistant("", calls), finish_reason="tool_calls")
            )
        last = index == len(STEPS) - 1
        replies.append(artifact(step["id"]) + (f"\n{MARKER}" if last else ""))
    return replies


async def full_history(delay: bool) -> tuple[int, int, float]:
    replies = iter(full_history_replies())
    model = counted(lambda prompt: next(replies), MODEL_DELAY if delay else 0)
    todo = "\n".join(f"{i + 1}. {s['id']} ({s['type']}): {s['goal']}" for i, s in enumerate(STEPS))
    step = DefaultStep(
        "work",
        MessageBundle(
            system=TASK_SYSTEM, goal=f"{REQUIREMENTS}. Work through these steps:\n{todo}"
        ),
        tools=["read_file"],
        completion_marker=MARKER,
        memory="agent",
        config={"max_model_calls_per_step": 30},
    )
    recipe = AgentRecipe(
        id="full-history", steps=[step], tools=[slow_read(TOOL_DELAY if delay else 0)]
    )
    started = time.perf_counter()
    result = await AgentExecutor(model=model).execute(recipe)
    elapsed = time.perf_counter() - started
    if not result.ok:
        fail(f"PLAN: the full-history run failed: {result.error}")
    recount = sum(prompt_tokens(p) for p in model.requests)
    if recount != result.usage.prompt_tokens:
        fail("PLAN: full-history usage does not match its requests")
    return result.usage.prompt_tokens, len(model.requests), elapsed


def minimum(planner_request: int) -> int:
    """The least a plan-and-execute run of this plan can send: the planner's request, then per
    step its system prompt and one message of its goal, its files and its dependencies'
    artifacts."""
    total = planner_request
    for step in STEPS:
        content = step["goal"]
        content += "".join((PROJECT / p).read_text() for p in step.get("inputs", []))
        content += "".join(artifact(d) for d in step.get("depends_on", []))
        total += tokens(TASK_SYSTEM) + tokens(content)
    return total


def main() -> None:
    planned, planner_request, requests, _ = asyncio.run(plan_and_execute(delay=False))
    history, history_calls, _ = asyncio.run(full_history(delay=False))
    least = minimum(planner_request)
    plan_times = [asyncio.run(plan_and_execute(delay=True))[3] for _ in range(5)]
    history_times = [asyncio.run(full_history(delay=True))[2] for _ in range(5)]
    speedup = statistics.median(history_times) / statistics.median(plan_times)
    emit(
        "PLAN",
        "plan and execute",
        primary="token_ratio",
        metrics={
            "prompt_tokens": summary([planned], "tokens"),
            "token_ratio": summary([planned / history], "ratio"),
            "overhead_vs_minimum": summary([planned / least], "ratio"),
            "speedup": summary([speedup], "x"),
            "makespan": summary(plan_times, "s"),
        },
        extra={
            "full_history_prompt_tokens": history,
            "minimum_prompt_tokens": least,
            "planner_prompt_tokens": planner_request,
            "step_calls": len(requests),
            "full_history_calls": history_calls,
            "full_history_makespan_s": round(statistics.median(history_times), 3),
            "tokenizer": "ceil(len(text) / 4) over every message of each request",
            "targets": {"overhead_vs_minimum": "<= 1.10", "speedup": ">= 1.8"},
        },
    )
    emit(
        "PLAN",
        "full history",
        headline=False,
        primary="prompt_tokens",
        metrics={
            "prompt_tokens": summary([history], "tokens"),
            "makespan": summary(history_times, "s"),
        },
    )


if __name__ == "__main__":
    main()
