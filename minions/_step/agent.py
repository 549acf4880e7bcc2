"""DefaultStep: the agent step (a goal, tools, an output), and how it runs on its own."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar, Unpack, overload

from minions._generic import OutputT_co
from minions._messages import Message, MessageBundle
from minions._output import OutputInstructions
from minions._step.context import AgentContext
from minions._step.executor import StepExecutor
from minions._step.step import Step, StepInput, format_dependencies
from minions._step.step import iterable as _iterable
from minions._sync import run_sync
from minions._templates import quoted_outputs, render_text
from minions.errors import Problem, StepDefinitionError, TemplateError, ToolDefinitionError
from minions.models import Model
from minions.tools import Tool

if TYPE_CHECKING:
    from minions._step.execution import StepExecution
    from minions._step.run import StepRun
    from minions._step.step import StepOptions
    from minions._step.stream import StepStream
    from minions.events import EventListener

__all__ = ["DefaultStep"]

_V = TypeVar("_V")
_M = TypeVar("_M")

Validator: TypeAlias = "Callable[[_V], _V | Awaitable[_V]]"
"""A check of a step's validated output: takes it, returns it (possibly changed), sync or
async; raising `ValueError` or `Reask` re-asks the model with the message."""

ToolLike: TypeAlias = "str | Tool | Callable[..., Any]"
"""A tool as a step takes it: the name of a tool the run registers, a `Tool`, or a function."""


class DefaultStep(Step[OutputT_co]):
    """An agent step: a goal for the model, the tools it may call, and optional structured
    output. Generic in its output: ``output=Expense`` makes a ``DefaultStep[Expense]``, no
    output a ``DefaultStep[str]`` (the text answer), a JSON Schema dict a ``DefaultStep[Any]``
    (a type a type checker cannot name, such as ``int | str``, goes through
    ``OutputInstructions(int | str)``).

    ::

        step = DefaultStep("categorise", goal="Categorise: {{ inputs.line }}", output=Expense)
        execution = await step.run(model="ollama:llama3.2:3b", inputs={"line": "..."})
        expense = execution.result()  # an Expense, or StepFailed with the reason

    Args:
        id: the step id.
        goal: what the step must do; may hold ``{{ templates }}`` (``{{ inputs.city }}``, an
            earlier step's ``{{ fetch.output }}``). A `MessageBundle` here (the older
            spelling) gives the system prompt, goal and extra messages at once.
        system: the system prompt (templates allowed).
        messages: extra messages between the system prompt and the goal (few-shot examples).
        tools: the tools the model may call: functions or `Tool` objects, registered for this
            step alone, and names of tools the run registers (``"read_file"``).
        output: the output the step must produce: a pydantic model (or any type pydantic
            validates), a JSON Schema dict, or `OutputInstructions`.
        validators: checks of the validated output, in order: each takes it and returns it
            (possibly changed), sync or async. Raising `ValueError` (a pydantic
            `ValidationError` is one) or `Reask` re-asks the model with the message, counted
            in `ExecutionConfig.max_output_retries` and recorded as a decision; raising
            anything else fails the step, naming the validator.
        completion_marker: text that ends the step when the model writes it.
        completion_pattern: a regex that ends the step when it matches (its ``output`` group,
            if any, is the output).
        completion_tool: offer the model a `complete_step` tool to end the step.
        description, depends_on, mode, optional, timeout, max_visits, memory, model, config,
            completion, cache: the `Step` options (`depends_on` takes steps or their ids).

    Raises:
        StepDefinitionError: every problem of the definition (an empty goal, a tool given the
            wrong way, an output that cannot be validated, an option no step has, with a
            "did you mean").
    """

    kind: ClassVar[str] = "agent"

    @overload
    def __init__(
        self: DefaultStep[str],
        id: str,
        goal: str | MessageBundle | None = None,
        *,
        system: str | None = None,
        messages: Sequence[Message] = (),
        tools: Iterable[ToolLike] = (),
        output: None = None,
        validators: Sequence[Validator[str]] = (),
        completion_marker: str | None = None,
        completion_pattern: str | None = None,
        completion_tool: bool = False,
        **options: Unpack[StepOptions],
    ) -> None: ...
    @overload
    def __init__(
        self: DefaultStep[_M],
        id: str,
        goal: str | MessageBundle | None = None,
        *,
        system: str | None = None,
        messages: Sequence[Message] = (),
        tools: Iterable[ToolLike] = (),
        output: type[_M] | OutputInstructions[_M],
        validators: Sequence[Validator[_M]] = (),
        completion_marker: str | None = None,
        completion_pattern: str | None = None,
        completion_tool: bool = False,
        **options: Unpack[StepOptions],
    ) -> None: ...
    @overload
    def __init__(
        self: DefaultStep[Any],
        id: str,
        goal: str | MessageBundle | None = None,
        *,
        system: str | None = None,
        messages: Sequence[Message] = (),
        tools: Iterable[ToolLike] = (),
        output: Mapping[str, Any],
        validators: Sequence[Validator[Any]] = (),
        completion_marker: str | None = None,
        completion_pattern: str | None = None,
        completion_tool: bool = False,
        **options: Unpack[StepOptions],
    ) -> None: ...
    def __init__(
        self,
        id: str,
        goal: str | MessageBundle | None = None,
        *,
        system: str | None = None,
        messages: Sequence[Message] = (),
        tools: Iterable[ToolLike] = (),
        output: object = None,
        validators: Sequence[Validator[Any]] = (),
        completion_marker: str | None = None,
        completion_pattern: str | None = None,
        completion_tool: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(id, **options)
        problems: list[Problem] = []

        def add(field: str, message: str) -> None:
            problems.append(Problem(message=message, step=id, field=field))

        if isinstance(goal, MessageBundle):
            if system is not None and goal.system is not None:
                add(
                    "system",
                    "the system prompt is given twice: in the MessageBundle and as system=",
                )
            self.bundle = MessageBundle(
                goal=goal.goal,
                system=system if system is not None else goal.system,
                messages=(*goal.messages, *messages),
            )
        else:
            self.bundle = MessageBundle(goal=goal or "", system=system, messages=tuple(messages))
        if not isinstance(tools, str) and _iterable(tools):
            tools = tuple(tools)  # read twice below: a generator would be empty the second time
        own = _own_tools(tools, add)
        self.own_tools = tuple(own.values())
        self.tools = frozenset(own) | _tool_names(tools)
        self.output = _instructions(output, add)
        self.validators = _validators(validators, add)
        self.completion_marker = completion_marker
        self.completion_pattern = completion_pattern
        self.completion_tool = completion_tool
        self._quoted: frozenset[str] | None = None
        problems.extend(self._own_problems())
        if problems:
            raise StepDefinitionError(problems)

    def _own_problems(self) -> list[Problem]:
        problems: list[Problem] = []

        def add(field: str, message: str) -> None:
            problems.append(Problem(message=message, step=self.id, field=field))

        if not isinstance(self.bundle.goal, str) or not self.bundle.goal.strip():
            add("goal", "goal is empty; say what the step must do (goal=...)")
        if self.output is not None:
            for text in self.output.problems():
                add("output", text)
        if self.completion_pattern is not None:
            try:
                re.compile(self.completion_pattern)
            except re.error as exc:
                add("completion_pattern", f"completion_pattern is not a regex: {exc}")
        return problems

    def tool_names(self) -> frozenset[str]:
        return self.tools

    def templates(self) -> Mapping[str, Any]:
        found: dict[str, Any] = {"goal": self.bundle.goal}
        if self.bundle.system:
            found["system"] = self.bundle.system
        return found

    def build_messages(self, step_input: StepInput) -> list[Message]:
        state = step_input.state
        messages = []
        if self.bundle.system:
            messages.append(Message.system(render_text(self.bundle.system, state)))
        messages.extend(self.bundle.messages)
        goal = render_text(self.bundle.goal, state).strip()
        if not goal:
            raise TemplateError(
                f"step {self.id!r}: the goal rendered to empty text", expression=self.bundle.goal
            )
        parts = []
        dependencies = self._unquoted(step_input.dependencies)
        if dependencies:
            parts.append(format_dependencies(dependencies))
        parts.append(f"Task: {goal}" if dependencies else goal)
        parts.extend(self.extra_parts(step_input))
        if self.output is not None and self.output.instructions:
            parts.append(self.output.instructions)
        messages.append(Message.user("\n\n".join(parts)))
        return messages

    def extra_parts(self, step_input: StepInput) -> list[str]:
        """More of the task message, after the goal and before the output instructions (which
        come last, where small models heed them best). None by default."""
        return []

    def _unquoted(self, dependencies: Mapping[str, Any]) -> Mapping[str, Any]:
        """The dependencies whose output the step's templates (goal, system prompt, data) do
        not already quote whole: an output is never shown to the model twice."""
        if not dependencies:
            return dependencies
        quoted = self._quoted
        if quoted is None:
            quoted = self._quoted = frozenset(quoted_outputs(list(self.templates().values())))
        if not quoted.intersection(dependencies):
            return dependencies
        return {k: v for k, v in dependencies.items() if k not in quoted}

    # -- running on its own --------------------------------------------------------------------

    @overload
    async def run(self, run: StepRun) -> None: ...
    @overload
    async def run(
        self,
        *,
        model: Model | str | None = None,
        inputs: Mapping[str, Any] | None = None,
        deps: object = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        listeners: Iterable[EventListener] = (),
    ) -> StepExecution[OutputT_co]: ...
    async def run(
        self,
        run: StepRun | None = None,
        *,
        model: Model | str | None = None,
        inputs: Mapping[str, Any] | None = None,
        deps: object = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        listeners: Iterable[EventListener] = (),
    ) -> StepExecution[OutputT_co] | None:
        """Run this step on its own and return its execution: ``await step.run(model=...,
        inputs=...)``. (Called with a `StepRun`, it is the hook every step kind has: the
        model and tool loop.)

        Args:
            model: the model for this run, a `Model` or a model string
                (``"ollama:llama3.2:3b"``); it wins over the step's own `model`. ``None``:
                the step's own, else the ``MINIONS_MODEL`` environment variable.
            inputs: what templates read as ``inputs``.
            deps: what tools taking a `ToolContext` read as ``ctx.deps`` (a database
                session, the current user...); never stored.
            tools: more tools (functions or `Tool`s) for the names the step lists.
            listeners: callables receiving each of the run's events.

        Never raises for a failure of the step: the execution is FAILED with a reason
        (`execution.result()` raises `StepFailed`).
        """
        if run is not None:
            await run.run_model_loop()
            return None
        return await self.executor(
            model=model, inputs=inputs, deps=deps, tools=tools, listeners=listeners
        ).execute()

    def run_sync(
        self,
        *,
        model: Model | str | None = None,
        inputs: Mapping[str, Any] | None = None,
        deps: object = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        listeners: Iterable[EventListener] = (),
    ) -> StepExecution[OutputT_co]:
        """`run` for code that is not async (the same arguments). Inside a running event loop
        (a notebook, an async function) the step runs in a thread of its own while the loop
        waits: ``await step.run(...)`` there keeps the loop free."""
        executor = self.executor(
            model=model, inputs=inputs, deps=deps, tools=tools, listeners=listeners
        )
        return run_sync(executor.execute, name="step.run(...)")

    def stream(
        self,
        *,
        model: Model | str | None = None,
        inputs: Mapping[str, Any] | None = None,
        deps: object = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        listeners: Iterable[EventListener] = (),
    ) -> StepStream[OutputT_co]:
        """Run this step on its own and stream it (the same arguments as `run`): the model
        streams because you do, whatever its own default::

            async with step.stream(model=model, inputs={"city": "Oslo"}) as stream:
                async for text in stream.text():
                    print(text, end="")
            execution = stream.execution  # a StepExecution[T], ended

        Leaving the block (or breaking out of the loop) before the end cancels the step.
        """
        return self.executor(
            model=model, inputs=inputs, deps=deps, tools=tools, listeners=listeners
        ).stream()

    def executor(
        self,
        *,
        model: Model | str | None = None,
        inputs: Mapping[str, Any] | None = None,
        deps: object = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        listeners: Iterable[EventListener] = (),
    ) -> StepExecutor[OutputT_co]:
        """The `StepExecutor` that `run`, `run_sync` and `stream` use: this step in a context
        of its own (the same arguments as `run`).

        Raises:
            StepDefinitionError: a tool the step names is not among its tools or `tools`.
        """
        resolver = None
        if model is not None:
            chosen = model if isinstance(model, Model) else resolve_model(model)

            def resolver(_spec: Model | str | None) -> Model:
                return chosen  # the run's model wins over the step's own

        context = AgentContext(
            model_resolver=resolver, tools=tools, inputs=inputs, listeners=listeners, deps=deps
        )
        return StepExecutor(self, context)


def resolve_model(model: str) -> Model:
    from minions.models import infer_model

    return infer_model(model)


def _tool_names(tools: object) -> frozenset[str]:
    if isinstance(tools, str):
        return frozenset((tools,))
    if not _iterable(tools):
        return frozenset()
    return frozenset(item for item in tools if isinstance(item, str))


def _own_tools(tools: object, add: Callable[[str, str], None]) -> dict[str, Tool]:
    """The tools given to a step as functions or `Tool`s, by name."""
    if isinstance(tools, str):
        return {}
    if isinstance(tools, Tool) or (callable(tools) and not _iterable(tools)):
        name = tools.name if isinstance(tools, Tool) else getattr(tools, "__name__", "tool")
        add("tools", f"tools must be a list: write tools=[{name}], not tools={name}")
        return {}
    if not _iterable(tools):
        add("tools", f"tools must be a list of functions, Tools or tool names, not {tools!r}")
        return {}
    own: dict[str, Tool] = {}
    for item in tools:
        if isinstance(item, str):
            continue
        if isinstance(item, Tool):
            made = item
        elif callable(item):
            try:
                made = Tool(item)
            except ToolDefinitionError as exc:
                add("tools", str(exc))
                continue
        else:
            add(
                "tools",
                f"tools holds {item!r}, which is neither a function, a Tool nor a tool name",
            )
            continue
        existing = own.get(made.name)
        if existing is not None and existing.fn is not made.fn:
            add("tools", f"two different tools are named {made.name!r}")
        own[made.name] = made
    return own


def _instructions(
    output: object, add: Callable[[str, str], None]
) -> OutputInstructions[Any] | None:
    if output is None or isinstance(output, OutputInstructions):
        return output
    if isinstance(output, str):
        add(
            "output",
            "output must be a type, a JSON Schema dict or OutputInstructions, not the string "
            f"{output!r}",
        )
        return None
    return OutputInstructions(output)


def _validators(
    validators: object, add: Callable[[str, str], None]
) -> tuple[Callable[[Any], Any], ...]:
    if callable(validators):
        name = getattr(validators, "__name__", "check")
        add("validators", f"validators must be a list: write validators=[{name}]")
        return ()
    if not _iterable(validators) or isinstance(validators, str):
        add("validators", f"validators must be a list of functions, not {validators!r}")
        return ()
    found = []
    for item in validators:
        if not callable(item):
            add("validators", f"validators holds {item!r}, which is not a function")
        else:
            found.append(item)
    return tuple(found)
