"""Step kinds beyond the agent step: a direct tool call, one structured analysis, a loop.

All three are `Step` subclasses, so they run in the same `StepExecutor` (events, usage,
timeouts, failure handling) and compose in recipes like any other step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from minions.errors import MinionsError, StepDefinitionError, TemplateError, ToolError
from minions.messages import Message, MessageBundle, ToolCall
from minions.output import OutputInstructions
from minions.step.execution import StepExecution, StepStatus
from minions.step.executor import StepExecutor
from minions.step.step import DefaultStep, Step, StepInput
from minions.templates import render

__all__ = ["AnalysisStep", "LoopStep", "ToolStep", "absorb", "schema_from_example"]

_SCHEMA_KEYS = {"properties", "$schema", "anyOf", "oneOf", "allOf", "enum", "$ref", "items"}
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def schema_from_example(example: Any) -> dict[str, Any]:
    """A JSON Schema for values shaped like `example`.

    ``{"ids": [], "reasoning": ""}`` gives an object with a required array ``ids`` and a required
    string ``reasoning``. A mapping that already is a JSON Schema (it has a ``type`` naming a
    JSON type, or ``properties``, ``anyOf``...) is returned as it is.
    """
    if isinstance(example, Mapping) and (
        _SCHEMA_KEYS & set(example) or example.get("type") in _JSON_TYPES
    ):
        return dict(example)
    return _infer(example)


def _infer(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list | tuple):
        return {"type": "array", "items": _infer(value[0])} if value else {"type": "array"}
    if isinstance(value, Mapping):
        return {
            "type": "object",
            "properties": {str(k): _infer(v) for k, v in value.items()},
            "required": [str(k) for k in value],
        }
    return {}


class ToolStep(Step):
    """One direct tool call with templated parameters; no model unless parameters are missing.

    Args:
        id: the step id.
        tool: the name of a registered tool.
        params: the arguments, with `{{ templates }}` rendered from run state.
        fill_missing: ``"model"`` lets the model extract parameters whose templates have no
            value, from the step description and the run state (one structured call, validated
            against the tool's schema). By default a missing value fails the step.
        **options: the `Step` options.
    """

    kind: ClassVar[str] = "tool"

    def __init__(
        self,
        id: str,
        tool: str,
        params: Mapping[str, Any] | None = None,
        *,
        fill_missing: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(id, **options)
        self.tool = tool
        self.params = dict(params or {})
        self.fill_missing = fill_missing
        if fill_missing not in (None, "model"):
            raise StepDefinitionError(
                f"step {id!r}: fill_missing must be 'model' or absent, not {fill_missing!r}"
            )

    def tool_names(self) -> frozenset[str]:
        return frozenset({self.tool})

    def uses_model(self) -> bool:
        return self.fill_missing == "model"

    def templates(self) -> Mapping[str, Any]:
        return {"params": self.params}

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []

    async def run(self, executor: StepExecutor) -> None:
        params, missing = self._render(executor.state)
        if missing:
            if self.fill_missing != "model":
                name, error = next(iter(missing.items()))
                raise TemplateError(
                    f"step {self.id!r}, parameter {name!r}: {error}", expression=error.expression
                )
            params.update(await self._fill(executor, missing))
        call = ToolCall(id=f"{executor.name}-call", name=self.tool, arguments=params)
        done = await executor.tools.execute(call)
        executor.execution.tool_calls.append(done)
        assert done.response is not None
        if done.response.error is not None:
            raise ToolError(f"step {self.id!r}: {done.response.error}")
        executor.complete(done.response.result)

    def _render(self, state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, TemplateError]]:
        params: dict[str, Any] = {}
        missing: dict[str, TemplateError] = {}
        for name, value in self.params.items():
            try:
                params[name] = render(value, state)
            except TemplateError as exc:
                if type(exc) is not TemplateError:  # a syntax error is never "missing"
                    raise
                missing[name] = exc
        return params, missing

    async def _fill(
        self, executor: StepExecutor, missing: Mapping[str, TemplateError]
    ) -> dict[str, Any]:
        tool = executor.context.tools.require(self.tool)
        properties = tool.parameters.get("properties", {})
        schema = {
            "type": "object",
            "properties": {name: properties.get(name, {}) for name in missing},
            "required": list(missing),
            "title": f"{self.tool}_parameters",
        }
        goal = (
            f"Give the values of the parameters {', '.join(map(repr, missing))} for a call to "
            f"the tool {self.tool!r} ({tool.description or 'no description'}).\n"
            f"The step: {self.description or self.id}.\n"
            f"What the run knows so far:\n{_state_text(executor.state)}"
        )
        extractor = DefaultStep(
            self.id,
            MessageBundle(
                system="You extract parameter values from the information given. "
                "Answer with JSON only.",
                goal=goal,
            ),
            output=OutputInstructions(schema),
            config={"max_model_calls_per_step": 1},
            model=self.model,
        )
        inner = StepExecutor(
            extractor,
            executor.context,
            state=executor.state,
            scope=f"{executor.scope}/fill",
        )
        result = await inner.execute()
        absorb(executor.execution, [result])
        if result.status is not StepStatus.COMPLETED:
            raise MinionsError(
                f"step {self.id!r}: could not fill the missing parameters "
                f"{', '.join(missing)}: {result.error}"
            )
        # Validated against the tool's own schema with the other arguments at the call.
        values = dict(result.output)
        return {k: values[k] for k in missing if k in values}


def _state_text(state: Mapping[str, Any]) -> str:
    text = json.dumps(state, ensure_ascii=False, default=str, indent=1)
    return text if len(text) <= 8000 else text[:8000] + "\n... (truncated)"


def absorb(execution: StepExecution, parts: Iterable[StepExecution]) -> None:
    """Count the model calls, tool calls and usage of inner executions in `execution`."""
    for part in parts:
        execution.model_calls.extend(part.model_calls)
        execution.tool_calls.extend(part.tool_calls)
        execution.usage = execution.usage + part.usage
        execution.turns += part.turns


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
        **options: Any,
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


class LoopStep(Step):
    """Runs a step once per item of a list and collects the outputs in item order.

    Inside the body, templates see ``loop.item`` and ``loop.index``. Items run one by one, or
    up to `parallel` at once. The output is the list of item outputs (``None`` for an item that
    failed); every item's execution is in `StepExecution.items`. An empty list completes with
    an empty output. When an item fails, the loop step fails naming the items, unless
    `continue_on_error` is set.

    Args:
        body: the step to run per item; its id is the loop step's id.
        items: a list, or a template giving one (``"{{ analyse.output.ids }}"``).
        parallel: how many items may run at once.
        continue_on_error: complete even when items failed.
        **options: the `Step` options; `depends_on`, `mode`, `timeout`... of the loop.
    """

    kind: ClassVar[str] = "loop"

    def __init__(
        self,
        body: Step,
        items: Any,
        *,
        parallel: int = 1,
        continue_on_error: bool = False,
        **options: Any,
    ) -> None:
        options.setdefault("description", body.description)
        options.setdefault("depends_on", body.depends_on)
        super().__init__(body.id, **options)
        self.body = body
        self.items = items
        self.parallel = parallel
        self.continue_on_error = continue_on_error
        if not isinstance(parallel, int) or parallel < 1:
            raise StepDefinitionError(f"step {body.id!r}: parallel must be at least 1")

    def tool_names(self) -> frozenset[str]:
        return self.body.tool_names()

    def uses_model(self) -> bool:
        # A model the body names is its own; otherwise it calls the one the loop is given.
        return self.body.model is None and self.body.uses_model()

    def templates(self) -> Mapping[str, Any]:
        return {"loop": self.items, **self.body.templates()}

    def problems(self, tools: Any = None) -> list[str]:
        # The body checks the tools; the loop's own checks are its options.
        return [*super().problems(None), *self.body.problems(tools)]

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []

    async def run(self, executor: StepExecutor) -> None:
        items = render(self.items, executor.state)
        if not isinstance(items, list | tuple):
            raise MinionsError(
                f"step {self.id!r}: loop needs a list, but {self.items!r} gave "
                f"{type(items).__name__}"
            )
        limit = asyncio.Semaphore(self.parallel)

        async def run_item(index: int, item: Any) -> StepExecution:
            async with limit:
                state = {**executor.state, "loop": {"item": item, "index": index}}
                inner = StepExecutor(
                    self.body,
                    executor.context,
                    state=state,
                    dependencies=executor.dependencies,
                    visit=executor.execution.visit,
                    item=index,
                    checked=True,  # checked with the loop step
                )
                return await inner.execute()

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run_item(i, item)) for i, item in enumerate(items)]
        done = [task.result() for task in tasks]
        execution = executor.execution
        execution.items = done
        absorb(execution, done)
        failed = [r for r in done if r.status is not StepStatus.COMPLETED]
        outputs = [r.output if r.status is StepStatus.COMPLETED else None for r in done]
        if failed and not self.continue_on_error:
            details = "; ".join(f"{r.step_id}: {r.error}" for r in failed[:3])
            more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
            execution.output = outputs
            raise MinionsError(f"{len(failed)} of {len(done)} loop items failed: {details}{more}")
        executor.complete(outputs)
