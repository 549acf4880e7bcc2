"""The values that flow through a step: messages, tool calls, model calls, prompts and usage.

All of them are frozen dataclasses; change one with `dataclasses.replace`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from minions._values import ModeDemotion, OutputMode, Usage, preview, tokens_text
from minions.errors import ModelOutputError

if TYPE_CHECKING:
    from minions._output import OutputInstructions

__all__ = [
    "Message",
    "MessageBundle",
    "ModelCall",
    "ModelCallResponse",
    "OutputMode",
    "Prompt",
    "ToolCall",
    "ToolCallResponse",
    "ToolSpec",
    "Usage",
]

Role = Literal["system", "user", "assistant", "tool"]

COMPLETION_TOOL: Final = "complete_step"
"""The name of the tool a model calls to say a step is done (when the step offers it)."""
SELECT_TOOL: Final = "select_next_step"
"""The name of the tool a model calls to choose the next step among candidates (its `step`
argument is an enum of their ids)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallResponse:
    """The outcome of one tool call: a result, or the error that went back to the model."""

    call_id: str
    name: str
    result: Any = None
    error: str | None = None
    content: str = ""
    """The text the model sees as this call's result (the serialized result, or the error)."""
    attempts: int = 1
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the tool returned a result (rather than an error for the model)."""
        return self.error is None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A tool call the model asked for; `response` is set once it has run."""

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    response: ToolCallResponse | None = None

    def __repr__(self) -> str:
        parts = [
            f"id={self.id!r}",
            f"name={self.name!r}",
            f"arguments={preview(dict(self.arguments))}",
        ]
        response = self.response
        if response is None:
            parts.append("status='pending'")
        elif response.error is not None:
            parts += ["status='failed'", f"error={preview(response.error)}"]
        else:
            parts += ["status='ok'", f"result={preview(response.content)}"]
        if response is not None and response.attempts > 1:
            parts.append(f"attempts={response.attempts}")
        return f"ToolCall({', '.join(parts)})"

    @classmethod
    def parse(cls, *, id: str, name: str, arguments: str | Mapping[str, Any] | None) -> ToolCall:
        """Build a call from the model's raw argument JSON.

        Raises:
            ModelOutputError: the arguments are not a JSON object; the step loop re-asks.
        """
        if arguments is None or arguments == "":
            return cls(id=id, name=name, arguments={})
        if isinstance(arguments, Mapping):
            return cls(id=id, name=name, arguments=dict(arguments))
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ModelOutputError(
                f"The arguments of your call to tool {name!r} were not valid JSON ({exc.msg} at "
                f"position {exc.pos}). Call it again with a JSON object.",
                reason=f"the arguments of a call to tool {name!r} were not valid JSON "
                f"({exc.msg} at position {exc.pos})",
            ) from None
        if not isinstance(parsed, dict):
            raise ModelOutputError(
                f"The arguments of your call to tool {name!r} must be a JSON object, "
                f"not {type(parsed).__name__}.",
                reason=f"the arguments of a call to tool {name!r} were a JSON "
                f"{type(parsed).__name__}, not an object",
            )
        return cls(id=id, name=name, arguments=parsed)

    @property
    def result(self) -> Any:
        """The tool's result (``None`` when it failed or has not run; see `response`)."""
        return None if self.response is None else self.response.result


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One message of a conversation, in the OpenAI chat shape."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    """For `role="tool"`: the id of the call this message answers."""
    name: str | None = None
    """For `role="tool"`: the name of the tool."""

    @classmethod
    def system(cls, content: str) -> Message:
        """A system message."""
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        """A user message."""
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: Sequence[ToolCall] = ()) -> Message:
        """An assistant message: text, tool calls, or both."""
        return cls(role="assistant", content=content, tool_calls=tuple(tool_calls))

    @classmethod
    def tool(cls, call_id: str, content: str, *, name: str | None = None) -> Message:
        """The result of tool call `call_id`, as the model reads it."""
        return cls(role="tool", content=content, tool_call_id=call_id, name=name)

    def __str__(self) -> str:
        text = f"{self.role}: {self.content}"
        for call in self.tool_calls:
            text += f"\n  -> {call.name}({json.dumps(dict(call.arguments), default=str)})"
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageBundle:
    """What a step says to the model: a system prompt, a goal, and optional extra messages
    (few-shot examples, fixed context) placed between the two.

    `system` and `goal` may hold `{{ expression }}` templates, rendered from run state.
    """

    goal: str
    system: str | None = None
    messages: tuple[Message, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """What a model is told about a tool: its name, description and JSON Schema parameters."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """One request to a model: the conversation so far, the tools it may call, and the
    structured output expected (if any)."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    output: OutputInstructions | None = None
    tool_choice: Literal["auto", "required", "none"] = "auto"
    step_id: str | None = None
    scope: str = ""
    """Which step execution asks: stable across runs of the same recipe (e.g. ``fetch#1`` for
    the first visit of step ``fetch``, ``apply#1[3]`` for item 3 of a loop). Recording and
    replay key model calls by it."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Provider settings such as `temperature`, passed through as they are."""
    stream: bool = False
    """The caller streams the step (`step.stream()`, `StepExecutor.stream()`,
    `AgentExecutor.stream()`): a model that can stream its answer does, whatever its own
    default (`OpenAIChatModel(stream=...)`), reporting each text delta to `on_token`."""

    def __str__(self) -> str:
        return "\n".join(str(message) for message in self.messages)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallResponse:
    """A model's answer: one assistant message with text and/or tool calls."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = "stop"
    model: str | None = None
    response_id: str | None = None
    """The provider's id of this answer (``chatcmpl-...``), when it gave one."""
    output: Any = None
    """Structured output the provider already parsed and validated, if it did."""
    output_mode: OutputMode | None = None
    """How structured output was produced: `json_schema`, `tool`, `prompted_json`, `text`..."""
    demoted: tuple[ModeDemotion, ...] = ()
    """Structured-output modes this call learned the endpoint cannot do (each becomes an
    `OutputModeDemoted` event)."""
    raw: Any = field(default=None, repr=False, compare=False)

    @property
    def text(self) -> str:
        """The answer's text (empty when it only asks for tools)."""
        return self.message.content

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls the answer asks for, in the model's order."""
        return self.message.tool_calls


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCall:
    """The record of one model call attempt: what was asked, what came back or went wrong."""

    step_id: str
    turn: int
    """1 for the step's first model call, 2 for the follow-up after tool results, ..."""
    attempt: int
    """1 for the first attempt of a turn; retries count up."""
    prompt: Prompt = field(repr=False)
    response: ModelCallResponse | None = None
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    output_mode: OutputMode | None = None
    """The structured-output mode of the answer: the one that produced its output, or, for an
    answer that failed as output, the one it was asked in; `None` without structured output."""
    model: str = ""
    """The name of the model asked (with a `FallbackModel`, the one of its models)."""
    endpoint: str | None = None
    """The base URL it was asked at, without credentials; `None` for a model not behind a
    server (test doubles, replays)."""
    started_at: float = 0.0
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the attempt got an answer (rather than an error)."""
        return self.error is None and self.response is not None

    def __repr__(self) -> str:
        parts = [f"step={self.step_id!r}", f"turn={self.turn}", f"attempt={self.attempt}"]
        if self.model:
            parts.append(f"model={self.model!r}")
        response = self.response
        if self.error is not None or response is None:
            parts += ["status='failed'", f"error={preview(self.error or 'no response')}"]
        else:
            parts.append("status='ok'")
            if response.output is not None:
                parts.append(f"output={preview(response.output)}")
            elif response.text:
                parts.append(f"answer={preview(response.text)}")
            if response.tool_calls:
                parts.append(f"tool_calls={[call.name for call in response.tool_calls]!r}")
        parts.append(f"tokens={tokens_text(self.usage)}")
        return f"ModelCall({', '.join(parts)})"
