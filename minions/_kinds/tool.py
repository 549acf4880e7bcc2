"""ToolStep: one direct tool call with templated parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

from minions._messages import Message, MessageBundle
from minions._output import OutputInstructions
from minions._step.agent import DefaultStep
from minions._step.execution import StepStatus
from minions._step.run import StepRun
from minions._step.step import Step, StepInput
from minions._templates import has_template, render
from minions._text import as_text
from minions.errors import Problem, StepDefinitionError, TemplateError, ToolError
from minions.tools import ToolRegistry

if TYPE_CHECKING:
    from minions._step.step import StepOptions

__all__ = ["ToolStep"]


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
        requires_approval: bool = False,
        **options: Unpack[StepOptions],
    ) -> None:
        super().__init__(id, **options)
        self.tool = tool
        self.params = dict(params or {})
        self.fill_missing = fill_missing
        self.requires_approval = requires_approval
        if fill_missing not in (None, "model"):
            raise StepDefinitionError(
                f"step {id!r}: fill_missing must be 'model' or absent, not {fill_missing!r}"
            )

    def tool_names(self) -> frozenset[str]:
        return frozenset({self.tool})

    def problems(self, tools: ToolRegistry | None = None) -> list[Problem]:
        # Literal parameters are checked against the tool's schema now, not at run time.
        found = super().problems(tools)
        tool = tools.get(self.tool) if tools is not None else None
        if tool is None:
            return found
        known = tool.parameters["properties"]
        for name, value in self.params.items():
            # A templated value is known only at run time; its name can be checked now.
            if name in known and has_template(value):
                continue
            problem = tool.argument_problem(name, value)
            if problem is not None:
                found.append(Problem(message=problem, step=self.id, field="params"))
        return found

    def uses_model(self) -> bool:
        return self.fill_missing == "model"

    def templates(self) -> Mapping[str, Any]:
        return {"params": self.params}

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []

    async def run(self, run: StepRun) -> None:
        params, missing = self._render(run.state)
        if missing:
            if self.fill_missing != "model":
                name, error = next(iter(missing.items()))
                raise TemplateError(
                    f"step {self.id!r}, parameter {name!r}: {error}", expression=error.expression
                )
            params.update(await self._fill(run, missing))
        response = await run.call_tool(self.tool, params)
        if response.error is not None:
            raise ToolError(f"step {self.id!r}: {response.error}")
        run.complete(response.result)

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

    async def _fill(self, run: StepRun, missing: Mapping[str, TemplateError]) -> dict[str, Any]:
        tool = run.context.tools.require(self.tool)
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
            f"What the run knows so far:\n{_state_text(run.state)}"
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
        result = await run.run_step(extractor, dependencies={}, scope=f"{run.scope}/fill")
        run.absorb([result])
        if result.status is not StepStatus.COMPLETED:
            run.fail(
                f"step {self.id!r}: could not fill the missing parameters "
                f"{', '.join(missing)}: {result.error}"
            )
        # Validated against the tool's own schema with the other arguments at the call.
        values = dict(result.output or {})
        return {k: values[k] for k in missing if k in values}


def _state_text(state: Mapping[str, Any]) -> str:
    text = as_text(state, indent=1)
    return text if len(text) <= 8000 else text[:8000] + "\n... (truncated)"
