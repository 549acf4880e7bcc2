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
from minions._step.waits import RunWaits
from minions.errors import BudgetExceededError
from minions.models import FallbackModel, Model, infer_model
from minions.models._internal import is_fallback
from minions.tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from minions._step.cache import StepCache
    from minions._step.checkpoints import ItemCheckpoints
    from minions._step.completion import StepCompletionChain
    from minions._tracing.tracer import RunTracer
    from minions.events import EventListener
    from minions.tools import Approver

__all__ = ["AgentContext"]


class RecipeRunner(Protocol):
    """Runs a recipe (an `AgentRecipe`) inside another run, and returns its `AgentResult`.

    The arguments are the inner run's: its id, settings (model, resolver, wrapper, approver,
    tracer...), memory, configuration and deps (the outer run's).
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
        deps: object = None,
    ) -> Awaitable[AgentResult]: ...


class AgentContext:
    """What steps share during a run: model, tools, memory, config, inputs, events and budgets.

    The run's shared settings (model, resolver, wrapper, approver, tracer, MCP servers,
    listeners) are one `RunSettings`: give it as ``settings=``, or give its fields as the
    keywords below (a shorthand for a context built by hand), not both.

    Args:
        settings: what the run shares with the other runs of its executor (see
            `RunSettings`); the `AgentExecutor` gives its own.
        tools: tools or plain functions, or a `ToolRegistry`.
        memory: where conversations live (in process memory by default).
        config: execution settings; steps may override fields.
        inputs: the run's inputs, visible to templates as ``inputs``.
        deps: what tools taking a `ToolContext` read as ``ctx.deps`` (a database session,
            the current user...); ``None``: the run has none, and reading them fails the
            step saying so. Never stored: a durable worker makes them with its ``deps``
            factory.
        completion_chain: the chain steps use unless they carry their own.
        run_id: defaults to a new random id.
        model: (a `RunSettings` field) a `Model`, a model string (``"openai:gpt-4o-mini"``,
            ``"ollama:llama3.2:3b"``), or ``None`` for the `MINIONS_MODEL` environment
            variable. Resolved on first use.
        listeners: (a `RunSettings` field) callables receiving every event, in order.
        model_resolver: (a `RunSettings` field) turns the model a recipe or step names (a
            `Model`, a model string, or
            ``None`` when none is named anywhere) into the model to call; the default is
            `minions.models.infer_model` (a `Model` as it is, ``None`` for `MINIONS_MODEL`).
            Give one to replay every model from a recording (``lambda _spec: replay``) or to
            map model strings to test doubles. Each string or object is resolved once per run.
        model_wrapper: (a `RunSettings` field) applied once to every model the run uses (the
            default and each step's own), after `model_resolver`, e.g. to record replies
            (`RecordingModel`).
        recipe_runner: runs a recipe inside this run (what a `RecipeStep` calls); the
            `AgentExecutor` gives its own. ``None``: recipe steps cannot run in this context.
        approver: (a `RunSettings` field) answers the approval requests of tools that need a
            person's say (`minions.tools.Approver`).
        tracer: (a `RunSettings` field) writes the run's OpenTelemetry spans (``None``: no
            tracing; the `AgentExecutor` makes one from its `tracer_provider`).
        mcp_servers: (a `RunSettings` field) the MCP servers of the run, by name (configs of
            `minions.tools`); a run (`AgentExecutor`) connects to them when it starts and
            adds their tools to `tools`.

    Raises:
        ConfigError: ``settings=`` is given together with one of its fields as a keyword.
    """

    checkpoints: ItemCheckpoints | None = None
    """Where a durable run keeps its loop items (``None``: nothing is checkpointed)."""
    step_cache: StepCache | None = None
    """Where steps that say ``cache`` keep their outputs (``None``: nothing is cached): the
    settings' `step_cache`, else the `AgentExecutor`'s in-memory one."""
    streaming: bool = False
    """The caller streams the run (`AgentExecutor.stream()`): every model call asks its model
    to stream, whatever the model's own default."""
    recipe_scope: Mapping[str, Any] = MappingProxyType({})
    """The run's recipe as the step cache's key names it: its id and version (the
    `AgentExecutor` sets it; empty for steps run without a recipe)."""

    def __init__(
        self,
        *,
        settings: RunSettings | None = None,
        tools: ToolRegistry | Iterable[Tool | Callable[..., Any]] = (),
        memory: ModelMemory | None = None,
        config: ExecutionConfig | None = None,
        inputs: Mapping[str, Any] | None = None,
        deps: object = None,
        completion_chain: StepCompletionChain | None = None,
        run_id: str | None = None,
        recipe_runner: RecipeRunner | None = None,
        model: Model | str | None = None,
        listeners: Iterable[EventListener] = (),
        model_resolver: Callable[[Model | str | None], Model] | None = None,
        model_wrapper: Callable[[Model], Model] | None = None,
        approver: Approver | None = None,
        tracer: RunTracer | None = None,
        mcp_servers: Mapping[str, Any] | None = None,
    ) -> None:
        listeners = tuple(listeners)
        self.settings = with_given(
            settings,
            "AgentContext",
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
        self.deps = deps
        """What tools taking a `ToolContext` read as ``ctx.deps`` (``None``: none given)."""
        self.usage = Usage()
        """Tokens of every model call of the run so far (all steps, all attempts)."""
        self.waits = RunWaits()
        """When the run was blocked: every step it was running was waiting."""

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
            if is_fallback(spec):
                assert isinstance(spec, FallbackModel)
                # Each of its models as the run resolves and wraps any other (a replay
                # answers for each; a recording records each one's attempts).
                model: Model = spec.with_models([self._resolve(m) for m in spec.models])
            else:
                resolver = self.settings.model_resolver or resolve_model
                model = self._wrap(resolver(spec))
            found = self._resolved[key] = (spec, model)
        return found[1]

    def wrap_model(self, model: Model) -> Model:
        """`model` as this run's steps see it: through the run's model wrapper, if any."""
        return self._wrap(model)

    def _wrap(self, model: Model) -> Model:
        wrapper = self.settings.model_wrapper
        if wrapper is None:
            return model
        if is_fallback(model):
            assert isinstance(model, FallbackModel)
            return model.with_models([self._wrap(m) for m in model.resolved()])
        # One wrapper per model object, so every step using it shares the same wrapper (the
        # entry holds the model, so its id is not reused while the run lasts).
        found = self._wrapped.get(id(model))
        if found is None:
            found = self._wrapped[id(model)] = (model, wrapper(model))
        return found[1]

    def record_usage(self, usage: Usage) -> None:
        """Count `usage` (a model call's, or a restored step's) in the run's `usage`."""
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
