"""The model ⇄ tool loop of one step."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import FAST, add, assert_tool_invariant

from minions import (
    AgentContext,
    DefaultStep,
    ExecutionConfig,
    MessageBundle,
    Model,
    StepDefinitionError,
    StepExecution,
    StepExecutor,
    StepStatus,
    Tool,
    tool,
)
from minions.testing import FunctionModel, ScriptedModel


def run(
    step: DefaultStep,
    model: Model,
    *tools: Tool | Callable[..., Any],
    **context: Any,
) -> StepExecution:
    ctx = AgentContext(model=model, tools=list(tools) or [add], config=FAST, **context)
    return asyncio.run(StepExecutor(step, ctx).execute())


def test_text_answer_completes_the_step_with_the_goal_in_the_prompt() -> None:
    model = ScriptedModel(["Paris."])
    step = DefaultStep("capital", MessageBundle(system="Be brief.", goal="Capital of France?"))
    execution = run(step, model)
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "Paris."
    assert execution.error is None
    prompt = model.requests[0]
    assert [m.role for m in prompt.messages] == ["system", "user"]
    assert prompt.messages[1].content == "Capital of France?"
    assert execution.decisions[-1].link == "text_answer"


def test_tool_results_reach_the_model_and_the_loop_continues() -> None:
    model = ScriptedModel([[("add", {"a": 1, "b": 2})], [("add", {"a": 3, "b": 4})], "10"])
    execution = run(DefaultStep("s", "Add things.", tools={"add"}), model)
    assert execution.status is StepStatus.COMPLETED
    assert execution.turns == 3
    assert [c.response.result for c in execution.tool_calls if c.response] == [3, 7]
    last_prompt = model.requests[-1].messages
    assert [m.content for m in last_prompt if m.role == "tool"] == ["3", "7"]
    assert_tool_invariant(execution.messages)


def test_parallel_tool_calls_run_at_the_same_time() -> None:
    both_started = asyncio.Event()
    running = 0

    @tool
    async def wait(name: str) -> str:
        """Wait for the other call."""
        nonlocal running
        running += 1
        if running == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), timeout=5)
        return name

    model = ScriptedModel([[("wait", {"name": "a"}), ("wait", {"name": "b"})], "done"])
    execution = run(DefaultStep("s", "Wait.", tools={"wait"}), model, wait)
    assert execution.status is StepStatus.COMPLETED
    assert [c.response.result for c in execution.tool_calls if c.response] == ["a", "b"]


def test_sequential_tool_calls_run_in_the_models_order() -> None:
    order: list[str] = []
    running = 0
    peak = 0

    @tool
    async def record(name: str) -> str:
        """Record a name, giving the other calls a chance to run meanwhile."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        order.append(f"start {name}")
        await asyncio.sleep(0)  # a yield to the event loop, not a wait on the clock
        order.append(f"end {name}")
        running -= 1
        return name

    calls = [("record", {"name": "first"}), ("record", {"name": "second"})]
    model = ScriptedModel([calls, "done"])
    step = DefaultStep("s", "Go.", tools={"record"}, config={"sequential_tool_calls": True})
    assert run(step, model, record).status is StepStatus.COMPLETED
    assert order == ["start first", "end first", "start second", "end second"]
    assert peak == 1

    order.clear()
    peak = 0
    parallel = DefaultStep("p", "Go.", tools={"record"})
    assert run(parallel, ScriptedModel([calls, "done"]), record).status is StepStatus.COMPLETED
    assert peak == 2  # both calls were running at once
    assert order[:2] == ["start first", "start second"]


def test_call_limit_fails_the_step_with_that_reason() -> None:
    model = FunctionModel(lambda prompt: [("add", {"a": 1, "b": 1})])
    step = DefaultStep("s", "Loop forever.", tools={"add"}, config={"max_model_calls_per_step": 3})
    execution = run(step, model)
    assert execution.status is StepStatus.FAILED
    assert execution.error == "reached max_model_calls_per_step (3) without completing"
    assert len(model.requests) == 3
    assert_tool_invariant(execution.messages)


def test_default_config_matches_the_java_module() -> None:
    config = ExecutionConfig()
    assert config.max_model_calls_per_step == 10
    assert config.max_tool_call_retries == 2
    assert config.sequential_tool_calls is False


def test_step_config_overrides_the_context_config() -> None:
    model = FunctionModel(lambda prompt: [("add", {"a": 1, "b": 1})])
    context = AgentContext(
        model=model, tools=[add], config=ExecutionConfig(max_model_calls_per_step=5)
    )
    step = DefaultStep("s", "Loop.", tools={"add"}, config={"max_model_calls_per_step": 2})
    execution = asyncio.run(StepExecutor(step, context).execute())
    assert execution.error == "reached max_model_calls_per_step (2) without completing"
    assert len(model.requests) == 2


def test_unknown_config_field_is_named() -> None:
    step = DefaultStep("s", "x", config={"max_model_call": 2})
    with pytest.raises(
        StepDefinitionError, match=r"step 's': unknown config field.*'max_model_call'"
    ):
        StepExecutor(step, AgentContext(model=ScriptedModel([])))


def test_execute_sync_is_the_same_loop() -> None:
    step = DefaultStep("s", "Say hi.")
    execution = StepExecutor(step, AgentContext(model=ScriptedModel(["hi"]))).execute_sync()
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "hi"


def test_a_model_that_raises_unexpectedly_fails_the_step_without_raising() -> None:
    def broken(prompt: object) -> str:
        raise KeyError("oops")

    execution = run(DefaultStep("s", "x"), FunctionModel(broken))
    assert execution.status is StepStatus.FAILED
    assert execution.error == "KeyError: 'oops'"


def test_exhausted_script_fails_the_step_naming_it() -> None:
    execution = run(
        DefaultStep("lonely", "x", tools={"add"}), ScriptedModel([[("add", {"a": 1, "b": 1})]])
    )
    assert execution.status is StepStatus.FAILED
    assert "no reply left" in (execution.error or "")
    assert "'lonely'" in (execution.error or "")
    assert_tool_invariant(execution.messages)


def test_sync_tools_run_in_a_worker_thread_unless_told_otherwise() -> None:
    threads: dict[str, int] = {}

    @tool
    def threaded() -> str:
        """Note the thread."""
        threads["threaded"] = threading.get_ident()
        return "ok"

    @tool(run_in_thread=False)
    def inline() -> str:
        """Note the thread."""
        threads["inline"] = threading.get_ident()
        return "ok"

    model = ScriptedModel([[("threaded", {}), ("inline", {})], "done"])
    run(DefaultStep("s", "x", tools={"threaded", "inline"}), model, threaded, inline)
    assert threads["inline"] == threading.get_ident()
    assert threads["threaded"] != threading.get_ident()


def test_timeout_fails_the_step_and_closes_pending_tool_calls() -> None:
    @tool
    async def slow() -> str:
        """Take forever."""
        await asyncio.sleep(10)
        return "never"

    model = ScriptedModel([[("slow", {}), ("slow", {})]])
    step = DefaultStep("s", "x", tools={"slow"}, timeout=0.05)
    execution = run(step, model, slow)
    assert execution.status is StepStatus.FAILED
    assert execution.error == "step 's' timed out after 0.05s"
    assert_tool_invariant(execution.messages)
    assert [m.content for m in execution.messages if m.role == "tool"] == [
        "Not executed: cancelled."
    ] * 2


def test_cancellation_from_outside_is_recorded_then_propagates() -> None:
    started = asyncio.Event()

    @tool
    async def hang() -> str:
        """Hang."""
        started.set()
        await asyncio.sleep(10)
        return "never"

    async def main() -> StepExecutor:
        context = AgentContext(model=ScriptedModel([[("hang", {})]]), tools=[hang])
        executor = StepExecutor(DefaultStep("s", "x", tools={"hang"}), context)
        task = asyncio.create_task(executor.execute())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return executor

    executor = asyncio.run(main())
    assert executor.execution.status is StepStatus.FAILED
    assert executor.execution.error == "step 's' was cancelled"
    assert_tool_invariant(executor.execution.messages)


async def test_execute_sync_inside_a_running_loop_runs_in_a_thread_with_the_caller_s_context() -> (
    None
):
    from minions.models import OpenAIChatModel
    from minions.testing import block_real_models

    executor = StepExecutor(DefaultStep("s", "x"), AgentContext(model=ScriptedModel(["ok"])))
    assert executor.execute_sync().output == "ok"  # in an async function, as in a notebook
    real = OpenAIChatModel("gpt-4o-mini", base_url="http://127.0.0.1:9/v1")
    with block_real_models() as block:  # a context variable: it holds in the thread too
        refused = DefaultStep("r", goal="x").run_sync(model=real)
    assert refused.status is StepStatus.FAILED
    assert block.blocked == ["openai:gpt-4o-mini at http://127.0.0.1:9/v1"]

    async def fails() -> None:
        raise KeyError("from the thread")

    from minions._sync import run_sync

    with pytest.raises(KeyError, match="from the thread"):
        run_sync(fails, name="fails()")
