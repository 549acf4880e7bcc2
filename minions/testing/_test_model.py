"""`TestModel`: a model for tests that needs no script."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Final, Literal

from minions._item import ItemId
from minions._messages import (
    COMPLETION_TOOL,
    SELECT_TOOL,
    Message,
    ModelCallResponse,
    OutputMode,
    Prompt,
    ToolCall,
    Usage,
)
from minions._text import estimate_tokens, jsonable
from minions.errors import ModelError, OutputValidationError
from minions.models import Model, TokenCallback
from minions.testing._schema_data import SchemaDataError, example_for
from minions.testing._scripted import chunks, prompt_tokens

__all__ = ["TestModel"]

NO_TOOL_CALLS: Final = "success (no tool calls)"
"""`TestModel`'s text answer when it called no tool (and was given no `custom_output_text`)."""
_UNSET: Final = object()
_MODES: Final = ("json_schema", "tool", "prompted_json")
_ROUTE: Final = "/route"
"""How the scope of a choice of the next step ends (``choose#2/route``)."""


def _route(prompt: Prompt, schema: Mapping[str, Any], arguments: Any) -> Any:
    """A choice of the next step: the candidate of the choosing step's visit (the first at
    its first visit, the second at its second...), so a loop back runs again and then ends."""
    candidates = schema.get("properties", {}).get("step", {}).get("enum")
    scope = prompt.scope
    visit = ItemId.visit_of(scope.removesuffix(_ROUTE)) if scope.endswith(_ROUTE) else None
    if not candidates or visit is None or not isinstance(arguments, dict):
        return arguments
    return {**arguments, "step": candidates[(visit - 1) % len(candidates)]}


class TestModel(Model):
    """A model for tests that needs no script, like PydanticAI's ``TestModel``.

    For each request it calls every tool it is offered once, with arguments made up from the
    tool's JSON Schema (valid for it: required fields, types, enums, nested objects, arrays,
    formats and patterns; the same every time), then answers: with structured output valid for
    the step's schema when the step asks for one, else with text. A request offering the
    ``complete_step`` tool is answered by calling it. A tool counts as called once the
    conversation holds a call to it, so a step calls each tool once, then ends.

    A model choosing the next step among candidates (``select_next_step``, whose ``step`` is
    an enum of their ids) gets the first candidate at the choosing step's first visit, the
    second at its second visit, and so on round: a loop back to an earlier step runs again,
    then the run goes on.

    Args:
        call_tools: which offered tools it calls: ``"all"`` (the default), or a collection of
            names (``[]``: none).
        custom_output_text: the text of its final answer; by default the results of the tools
            it called, as a JSON object by tool name, or ``"success (no tool calls)"``.
        custom_output_args: its structured output (a dict, list or value for the schema)
            instead of a made-up one. Sent as it is: a value the schema refuses makes the step
            re-ask, and fail once its `max_output_retries` are spent.
        output_mode: how it gives structured output, like `OpenAIChatModel`'s rungs:
            ``"json_schema"`` (JSON text, the output already validated), ``"tool"`` (a call to
            the output tool), or ``"prompted_json"``. ``None`` (the default): ``"tool"`` when
            the request offers tools, else ``"json_schema"``, as `OpenAIChatModel` starts.
        name: the model's name in events.

    Attributes:
        requests: every prompt received, in order.

    Raises:
        ModelError: (from a call) a tool's schema or the output's schema cannot be satisfied
            by a made-up value; the message names the tool or the output and what to pass.
    """

    __test__ = False  # Not a test class for pytest, though its name starts with "Test".

    def __init__(
        self,
        *,
        call_tools: Literal["all"] | Collection[str] = "all",
        custom_output_text: str | None = None,
        custom_output_args: Any = _UNSET,
        output_mode: OutputMode | None = None,
        name: str = "test",
    ) -> None:
        if isinstance(call_tools, str) and call_tools != "all":
            raise ValueError(
                f"call_tools must be 'all' or a list of tool names ([] for none), not "
                f"{call_tools!r}"
            )
        if output_mode is not None and output_mode not in _MODES:
            raise ValueError(f"output_mode must be one of {_MODES}, not {output_mode!r}")
        self.call_tools = call_tools if call_tools == "all" else frozenset(call_tools)
        self.custom_output_text = custom_output_text
        self.custom_output_args = custom_output_args
        self.output_mode = output_mode
        self.name = name
        self.requests: list[Prompt] = []
        """Every prompt received, in order."""

    def __repr__(self) -> str:
        return f"TestModel({self.name!r})"

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        self.requests.append(prompt)
        pending = self._pending_tools(prompt)
        if pending:
            return self._respond(prompt, "", self._calls(prompt, pending), on_token)
        offered = {spec.name for spec in prompt.tools}
        if COMPLETION_TOOL in offered and prompt.tool_choice != "none":
            result = self._output(prompt) if prompt.output is not None else self._text(prompt)
            arguments = {"result": jsonable(result)}
            return self._respond(
                prompt, "", self._call(prompt, COMPLETION_TOOL, arguments), on_token
            )
        if prompt.output is None:
            return self._respond(prompt, self._text(prompt), (), on_token)
        return self._structured(prompt, on_token)

    # -- tools ---------------------------------------------------------------------------------

    def _pending_tools(self, prompt: Prompt) -> list[str]:
        """The offered tools it calls and has not called in this conversation yet."""
        if prompt.tool_choice == "none" or not prompt.tools:
            return []
        control = {COMPLETION_TOOL}
        if prompt.output is not None:
            control.add(prompt.output.tool_name)
        called = {
            call.name
            for message in prompt.messages
            if message.role == "assistant"
            for call in message.tool_calls
        }
        return [
            spec.name
            for spec in prompt.tools
            if spec.name not in control
            and spec.name not in called
            and (self.call_tools == "all" or spec.name in self.call_tools)
        ]

    def _calls(self, prompt: Prompt, names: list[str]) -> tuple[ToolCall, ...]:
        specs = {spec.name: spec for spec in prompt.tools}
        calls: list[ToolCall] = []
        for name in names:
            try:
                arguments = example_for(specs[name].parameters)
            except SchemaDataError as exc:
                raise ModelError(
                    f"TestModel cannot call tool {name!r} of step {prompt.step_id!r}: {exc}; "
                    "leave it out with call_tools=[...], or script the call with ScriptedModel"
                ) from None
            if name == SELECT_TOOL:
                arguments = _route(prompt, specs[name].parameters, arguments)
            calls += self._call(prompt, name, arguments, offset=len(calls))
        return tuple(calls)

    @staticmethod
    def _call(
        prompt: Prompt, name: str, arguments: Mapping[str, Any], *, offset: int = 0
    ) -> tuple[ToolCall]:
        # Ids numbered after the calls already in the conversation: unique in it, and the same
        # on every run (however parallel steps interleave).
        earlier = sum(len(message.tool_calls) for message in prompt.messages)
        return (ToolCall(id=f"call_{earlier + offset + 1}", name=name, arguments=dict(arguments)),)

    # -- answers -------------------------------------------------------------------------------

    def _text(self, prompt: Prompt) -> str:
        if self.custom_output_text is not None:
            return self.custom_output_text
        results: dict[str, Any] = {}
        for message in prompt.messages:
            if message.role == "tool" and message.name:
                try:
                    results[message.name] = json.loads(message.content)
                except ValueError:
                    results[message.name] = message.content
        return json.dumps(results, ensure_ascii=False, default=str) if results else NO_TOOL_CALLS

    def _output(self, prompt: Prompt) -> Any:
        """The structured output to give: `custom_output_args`, or one made up."""
        if self.custom_output_args is not _UNSET:
            return self.custom_output_args
        output = prompt.output
        assert output is not None
        try:
            return example_for(output.json_schema())
        except SchemaDataError as exc:
            raise ModelError(
                f"TestModel cannot make up output {output.tool_name!r} for step "
                f"{prompt.step_id!r}: {exc}; give it with TestModel(custom_output_args=...)"
            ) from None

    def _structured(self, prompt: Prompt, on_token: TokenCallback | None) -> ModelCallResponse:
        output = prompt.output
        assert output is not None
        value = self._output(prompt)
        try:
            validated = output.validate_python(value)
        except OutputValidationError as exc:
            if self.custom_output_args is _UNSET:
                raise ModelError(
                    f"TestModel cannot make up output {output.tool_name!r} for step "
                    f"{prompt.step_id!r}: {exc} Give it with TestModel(custom_output_args=...)"
                ) from None
            validated = None  # Sent as it is: the step sees a wrong answer and re-asks.
        mode = self.output_mode or ("tool" if prompt.tools else "json_schema")
        if mode == "tool" and isinstance(value, Mapping):
            calls = self._call(prompt, output.tool_name, value)
            response = self._respond(prompt, "", calls, on_token)
        else:
            mode = "json_schema" if mode == "tool" else mode
            text = json.dumps(jsonable(value), ensure_ascii=False)
            response = self._respond(prompt, text, (), on_token)
        if validated is None:
            return response
        return ModelCallResponse(
            message=response.message,
            usage=response.usage,
            finish_reason=response.finish_reason,
            model=self.name,
            output=validated,
            output_mode=mode,
        )

    def _respond(
        self,
        prompt: Prompt,
        text: str,
        calls: tuple[ToolCall, ...],
        on_token: TokenCallback | None,
    ) -> ModelCallResponse:
        if text and on_token is not None:
            for chunk in chunks(text):
                on_token(chunk)
        said = text + json.dumps([[c.name, dict(c.arguments)] for c in calls], default=str)
        return ModelCallResponse(
            message=Message.assistant(text, calls),
            usage=Usage.of_call(prompt_tokens(prompt), estimate_tokens(said)),
            finish_reason="tool_calls" if calls else "stop",
            model=self.name,
        )
