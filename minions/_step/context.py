"""The context a run (or a single step) executes in."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from minions._config import ExecutionConfig
from minions._emitter import EventEmitter
from minions._memory import InMemoryModelMemory, ModelMemory
from minions._messages import Usage
from minions._step.result import AgentResult
from minions._step.settings import RunSettings, with_given
from minions.errors import BudgetExceededError
from minions.models._base import Model
from minions.models._infer import infer_model
from minions.tools._tool import Tool, ToolRegistry

if TYPE_CHECKING:
    from minions._step.cache import StepCache
    from minions._step.checkpoints import ItemCheckpoints
    from minions._step.completion import StepCompletionChain
    from minions._tracing.tracer import RunTracer
    from minions.events import EventListener
    from minions.tools._approval import Approver

__all__ = ["AgentContext"]


class RecipeRunner(Protocol):
    """Runs a recipe (an `AgentRecipe`) inside another run, and returns its `AgentResult`.

    The arguments are the inner run's: its id, settings (model, resolver, wrapper, approver,
    tracer...), memory and configuration.
    """

    def __call__(
        self,
        recipe: Any,
        inputs: Mapping[str, Any],
        *,
        run_id: str,
        settings: RunSettings,
        memory: ModelMemory,
        config: ExecutionConfig,
    ) -> Awaitable[AgentResult]: ...


class AgentContext:
    """What steps share during a run: model, tools, memory, config, inputs, events and budgets.

    Args:
        settings: what the run shares with the other runs of its executor (model, model
            resolver and wrapper, approver, tracer, MCP servers, listeners; see
            `RunSettings`); the `AgentExecutor` gives its own. The keyword arguments below
            that are given win over its fields.
        model: a `Model`, a model string (``"openai:gpt-4o-mini"``, ``"ollama:llama3.2:3b"``),
            or ``None`` for the `MINIONS_MODEL` environment variable. Resolved on first use.
        tools: tools or plain functions, or a `ToolRegistry`.
        memory: where conversations live (in process memory by default).
        config: execution settings; steps may override fields.
        inputs: the run's inputs, visible to templates as ``inputs``.
        listeners: callables receiving every event, in order.
        completion_chain: the chain steps use unless they carry their own.
        run_id: defaults to a new random id.
        model_resolver: turns the model a recipe or step names (a `Model`, a model string, or
            ``None`` when none is named anywhere) into the model to call; the default is
            `minions.models.infer_model` (a `Model` as it is, ``None`` for `MINIONS_MODEL`).
            Give one to replay every model from a recording (``lambda _spec: replay``) or to
            map model strings to test doubles. Each string or object is resolved once per run.
        model_wrapper: applied once to every model the run uses (the default and each step's
            own), after `model_resolver`, e.g. to record replies (`RecordingModel`).
        recipe_runner: runs a recipe inside this run (what a `RecipeStep` calls); the
            `AgentExecutor` gives its own. ``None``: recipe steps cannot run in this context.
        approver: answers the approval requests of tools that need a person's say
            (`minions.tools.Approver`).
        tracer: writes the run's OpenTelemetry spans (``None``: no tracing; the
            `AgentExecutor` makes one from its `tracer_provider`).
        mcp_servers: the MCP servers of the run, by name (configs of `minions.tools`); a
            run (`AgentExecutor`) connects to them when it starts and adds their tools to
            `tools`.
    """

    checkpoints: ItemCheckpoints | None = None
    """Where a durable run keeps its loop items (``None``: nothing is checkpointed)."""
    step_cache: StepCache | None = None
    """Where steps that say ``cache`` keep their outputs (``None``: nothing is cached): the
    settings' `step_cache`, else the `AgentExecutor`'s in-memory one."""
    recipe_scope: Mapping[str, Any] = MappingProxyType({})
    """The run's recipe as the step cache's key names it: its id and version (the
    `AgentExecutor` sets it; empty for steps run without a recipe)."""

    def __init__(
        self,
        *,
        settings: RunSettings | None = None,
        model: Model | str | None = None,
        tools: ToolRegistry | Iterable[Tool | Callable[..., Any]] = (),
        memory: ModelMemory | None = None,
        config: ExecutionConfig | None = None,
        inputs: Mapping[str, Any] | None = None,
        listeners: Iterable[EventListener] = (),
        completion_chain: StepCompletionChain | None = None,
        run_id: str | None = None,
        model_resolver: Callable[[Model | str | None], Model] | None = None,
        model_wrapper: Callable[[Model], Model] | None = None,
        recipe_runner: RecipeRunner | None = None,
        approver: Approver | None = None,
        tracer: RunTracer | None = None,
        mcp_servers: Mapping[str, Any] | None = None,
    ) -> None:
        listeners = tuple(listeners)
        self.settings = with_given(
            settings,
            model=model,
            model_resolver=model_resolver,
            model_wrapper=model_wrapper,
            approver=approver,
            tracer=tracer,
            mcp_servers=mcp_servers,
            listeners=listeners or None,
        )
        """The run's model, resolver, wrapper, approver, tracer, MCP servers and listeners
        (see `RunSettings`): its executor's, with the recipe's and the run's own folded in."""
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._model: Model | None = None
        self._wrapped: dict[int, tuple[Model, Model]] = {}
        self._resolved: dict[str | int, tuple[Model | str | None, Model]] = {}
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.memory: ModelMemory = memory if memory is not None else InMemoryModelMemory()
        self.config = config or ExecutionConfig()
        self.inputs: Mapping[str, Any] = dict(inputs or {})
        self.events = EventEmitter(self.run_id, self.settings.listeners)
        self.completion_chain = completion_chain
        self.recipe_runner = recipe_runner
        self.usage = Usage()
        """Tokens of every model call of the run so far (all steps, all attempts)."""

    @property
    def model(self) -> Model:
        """The run's default model, resolved by the `model_resolver` on first use."""
        if self._model is None:
            self._model = self._resolve(self.settings.model)
        return self._model

    def resolve_model(self, override: Model | str | None) -> Model:
        """A step's model: its own override, else the run's model."""
        if override is None:
            return self.model
        return self._resolve(override)

    def _resolve(self, spec: Model | str | None) -> Model:
        # Resolve each model string or object once per run: one client, one wrapper. The entry
        # holds the object, so its id cannot be reused while it is cached.
        key = spec if isinstance(spec, str) else id(spec)
        found = self._resolved.get(key)
        if found is None:
            resolver = self.settings.model_resolver or resolve_model
            found = self._resolved[key] = (spec, self._wrap(resolver(spec)))
        return found[1]

    def wrap_model(self, model: Model) -> Model:
        """`model` as this run's steps see it: through the run's model wrapper, if any."""
        return self._wrap(model)

    def _wrap(self, model: Model) -> Model:
        wrapper = self.settings.model_wrapper
        if wrapper is None:
            return model
        # One wrapper per model object, so every step using it shares the same wrapper (the
        # entry holds the model, so its id is not reused while the run lasts).
        found = self._wrapped.get(id(model))
        if found is None:
            found = self._wrapped[id(model)] = (model, wrapper(model))
        return found[1]

    def record_usage(self, usage: Usage) -> None:
        self.usage = self.usage + usage

    def check_run_budget(self) -> None:
        """Raise `BudgetExceededError` when the run has used its token budget."""
        budget = self.config.run_token_budget
        if budget is not None and self.usage.total_tokens >= budget:
            raise BudgetExceededError(
                f"run token budget of {budget} exhausted: {self.usage.total_tokens} tokens used "
                f"over {self.usage.calls} model calls"
            )

    def __repr__(self) -> str:
        model = self._model or self.settings.model
        return f"AgentContext(run_id={self.run_id!r}, model={model!r})"


def resolve_model(spec: Model | str | None) -> Model:
    """The default `model_resolver`: `infer_model`, imported on first use."""
    if isinstance(spec, Model):
        return spec
    return infer_model(spec)
