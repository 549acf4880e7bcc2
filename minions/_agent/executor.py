"""AgentExecutor: runs a whole recipe, steps in parallel as soon as they are ready."""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from minions._agent.checkpoints import StepCheckpoints
from minions._agent.graph import StepGraph
from minions._agent.run import Run
from minions._agent.stream import RunStream
from minions._config import ExecutionConfig
from minions._memory import ModelMemory
from minions._routing.selection import StepSelectionChain
from minions._step.cache import InMemoryStepCache
from minions._step.completion import StepCompletionChain
from minions._step.context import AgentContext
from minions._step.result import AgentResult
from minions._step.settings import RunSettings, with_given
from minions._sync import run_sync
from minions._tracing.tracer import RunTracer
from minions.errors import UnknownRecipeError
from minions.events import EventListener
from minions.models import Model
from minions.recipes import AgentRecipe
from minions.tools import Approver, Tool, ToolRegistry

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from minions.models import EndpointLimiter, Limits

__all__ = ["AgentExecutor"]


def _limiter(limits: Limits | EndpointLimiter) -> EndpointLimiter | None:
    """What ``AgentExecutor(limits=...)`` makes of its argument: a `LocalLimiter` of `Limits`
    (none for limits without entries), an `EndpointLimiter` as it is."""
    from minions.models import EndpointLimiter, Limits, LocalLimiter

    if isinstance(limits, EndpointLimiter):
        return limits
    if isinstance(limits, Limits):
        return LocalLimiter(limits) if limits.endpoints else None
    raise TypeError(f"limits must be Limits or an EndpointLimiter, not {type(limits).__name__}")


_GRAPH_CACHE = 32
"""How many graphs of unregistered recipes an executor keeps."""


class AgentExecutor:
    """Runs recipes: validates each into a `StepGraph`, creates the run's `AgentContext`,
    starts every step as soon as its own dependencies are done (up to `max_parallel_steps`
    at once) and returns an `AgentResult`, or streams the run's events.

    What every run shares (the model, its resolver and wrapper, the approver, tracing, MCP
    servers, listeners, limits) is one `RunSettings`: give it as ``settings=`` (another
    executor's ``settings``, say), or give its fields as the keywords marked "(settings)"
    below, a shorthand; not both.

    Args:
        tools: tools every recipe may use (plus each recipe's own).
        memory: where conversations live; a fresh in-process memory per run by default.
        config: execution settings; a recipe's `config` and each step's override them.
        recipes: recipes to run by id.
        completion_chain: the completion chain of steps (unless a recipe or step has one).
        selection_chain: how next steps are chosen (unless a recipe has its own).
        settings: a `RunSettings` holding the model, model resolver and wrapper, approver,
            tracer, MCP servers, listeners and limiter at once.
        model: (settings) the default model (a `Model` or a model string); a recipe's or a
            step's own model wins. ``None``: the `MINIONS_MODEL` environment variable, on
            first use.
        listeners: (settings) callables receiving every event of every run.
        model_resolver: (settings) turns each model a run names (the recipe's or a step's `Model` or
            model string, ``None`` when none is named) into the model to call; by default
            `infer_model`. ``lambda _spec: ReplayModel(...)`` replays every model, the ones
            recipes and steps name included.
        model_wrapper: (settings) applied once to every model a run uses, after `model_resolver`
            (recording...).
        approver: (settings) answers for tools that need a person's approval
            (`@tool(requires_approval=True)`, a YAML tool step's ``requires_approval``); without
            one, such a call fails its step with `ApprovalRequiredError`.
        tracer_provider: (settings: its tracer) where the OpenTelemetry spans of runs go
            (GenAI semantic conventions: ``invoke_workflow``, ``invoke_agent``, ``chat``,
            ``execute_tool``); ``None``: nothing is traced. minions never sets a global
            provider: pass ``opentelemetry.trace.get_tracer_provider()`` to use the
            application's. Needs ``minions[otel]``.
        meter_provider: (settings: its metrics) where the OpenTelemetry metrics of runs go
            (runs, steps, model calls in flight and waiting, retries, tokens, and the GenAI
            client metrics; see docs/operations.md); ``None``: nothing is measured. As for
            `tracer_provider`, minions never sets a global provider. Needs ``minions[otel]``.
        capture_message_content: (settings) write prompts, answers, tool arguments and
            results on spans, and keep prompts and answers in the model call events
            (`RunSettings.capture_content`; off by default: prompts may hold users' data).
            ``None``: as
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says (``SPAN_ONLY`` or
            ``true`` turns it on).
        mcp_servers: (settings) MCP servers every recipe's steps may use, by name (see
            `AgentRecipe.mcp_servers`; a recipe's server of the same name wins). Each run
            connects to the servers of its recipe and of the executor, once.
        limits: (settings: its limiter) limits per model endpoint (`minions.models.Limits`, e.g.
            ``Limits.load("limits.yaml")``): requests in flight, requests and tokens per
            minute, and a pause after a 429 with ``Retry-After``, held over every run of
            this executor (and of any executor given the same limiter, an `EndpointLimiter`).

    Raises:
        ConfigError: ``settings=`` is given together with one of its fields as a keyword.
        MissingExtraError: a `tracer_provider` or a `meter_provider` is given and
            ``opentelemetry-api`` is missing.
        RecipeError: an MCP server's config is invalid.
    """

    def __init__(
        self,
        *,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        memory: ModelMemory | None = None,
        config: ExecutionConfig | None = None,
        recipes: Iterable[AgentRecipe] = (),
        completion_chain: StepCompletionChain | None = None,
        selection_chain: StepSelectionChain | None = None,
        settings: RunSettings | None = None,
        model: Model | str | None = None,
        listeners: Iterable[EventListener] = (),
        model_resolver: Callable[[Model | str | None], Model] | None = None,
        model_wrapper: Callable[[Model], Model] | None = None,
        approver: Approver | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_message_content: bool | None = None,
        mcp_servers: Mapping[str, Any] | None = None,
        limits: Limits | EndpointLimiter | None = None,
    ) -> None:
        servers = mcp_servers
        if mcp_servers:
            from minions.tools._internal import server_configs

            servers = server_configs(mcp_servers)
        tracer = None
        if tracer_provider is not None:
            tracer = RunTracer(tracer_provider, capture_content=capture_message_content)
        metrics = None
        if meter_provider is not None:
            from minions._tracing.metrics import RunMetrics

            metrics = RunMetrics(meter_provider)
        self.settings = with_given(
            settings,
            "AgentExecutor",
            model=model,
            model_resolver=model_resolver,
            model_wrapper=model_wrapper,
            approver=approver,
            tracer=tracer,
            metrics=metrics,
            mcp_servers=servers,
            listeners=tuple(listeners) or None,
            limiter=None if limits is None else _limiter(limits),
            capture_content=capture_message_content,
        )
        """What every run of this executor shares (see `RunSettings`); each run's
        `AgentContext` gets it, with the recipe's model, listeners and MCP servers folded in."""
        self.step_cache = InMemoryStepCache()
        """Where steps that say ``cache`` keep their outputs across this executor's runs,
        unless its settings name a `StepCache` (a run store's, say)."""
        self.tools = ToolRegistry(tools)
        self.memory = memory
        self.config = config or ExecutionConfig()
        self.completion_chain = completion_chain
        self.selection_chain = selection_chain
        self.recipes: dict[str, AgentRecipe] = {}
        # The graphs of the recipes run lately, by recipe identity (a graph holds its recipe,
        # so an id cannot be reused while cached); bounded, so ad-hoc recipes do not pile up.
        self._graphs: OrderedDict[int, StepGraph] = OrderedDict()
        for recipe in recipes:
            self.register(recipe)

    # -- recipes -------------------------------------------------------------------------------

    def register(self, recipe: AgentRecipe) -> StepGraph:
        """Add a recipe to run by id; it is validated now.

        Raises:
            RecipeError: the recipe is invalid.
            ValueError: another recipe has the same id.
        """
        existing = self.recipes.get(recipe.id)
        if existing is not None and existing is not recipe:
            raise ValueError(f"two different recipes have the id {recipe.id!r}")
        graph = self.graph(recipe)
        self.recipes[recipe.id] = recipe
        return graph

    def recipe(self, recipe: AgentRecipe | str) -> AgentRecipe:
        """A recipe given as itself or by the id it was registered with.

        Raises:
            UnknownRecipeError: no registered recipe has this id.
        """
        if isinstance(recipe, AgentRecipe):
            return recipe
        found = self.recipes.get(recipe)
        if found is None:
            known = ", ".join(map(repr, sorted(self.recipes))) or "none are registered"
            raise UnknownRecipeError(f"unknown recipe {recipe!r} (known recipes: {known})")
        return found

    def graph(self, recipe: AgentRecipe | str) -> StepGraph:
        """The recipe's validated graph (checked once per recipe and executor).

        Raises:
            RecipeError: every problem of the recipe.
        """
        recipe = self.recipe(recipe)
        graph = self._graphs.get(id(recipe))
        if graph is not None:
            self._graphs.move_to_end(id(recipe))
            return graph
        graph = self._graphs[id(recipe)] = StepGraph(
            recipe, tools=self._registry(recipe), mcp_servers=self.settings.mcp_servers
        )
        while len(self._graphs) > _GRAPH_CACHE + len(self.recipes):
            self._graphs.popitem(last=False)
        return graph

    def _registry(self, recipe: AgentRecipe) -> ToolRegistry:
        if not recipe.tools:
            return self.tools
        return ToolRegistry([*self.tools, *recipe.tools])

    # -- running -------------------------------------------------------------------------------

    def create_context(
        self,
        recipe: AgentRecipe,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        listeners: Iterable[EventListener] = (),
        deps: object = None,
    ) -> AgentContext:
        """The context of a new run of `recipe`: its model, tools, memory, config, inputs
        (`AgentRecipe.check_inputs`: the recipe's defaults under the given ones), event
        listeners and deps.

        Raises:
            RecipeError: the recipe is invalid.
            InputError: the inputs are not what the recipe declares.
        """
        graph = self.graph(recipe)
        settings = self.settings
        # The run's own settings: the recipe's model and MCP servers win, the run's listeners
        # come after the executor's. Most runs change nothing, and share the executor's.
        changes: dict[str, Any] = {}
        if recipe.model is not None:
            changes["model"] = recipe.model
        if recipe.mcp_servers:
            changes["mcp_servers"] = {**settings.mcp_servers, **recipe.mcp_servers}
        extra = tuple(listeners)
        if extra:
            changes["listeners"] = settings.listeners + extra
        if changes:
            settings = dataclasses.replace(settings, **changes)
        context = AgentContext(
            settings=settings,
            tools=graph.tools if graph.tools is not None else self._registry(recipe),
            memory=self.memory,
            config=self.config.merged(recipe.config),
            inputs=recipe.check_inputs(inputs or {}),
            completion_chain=recipe.completion_chain or self.completion_chain,
            run_id=run_id,
            recipe_runner=run_inner_recipe,
            deps=deps,
        )
        given = settings.step_cache
        context.step_cache = given if given is not None else self.step_cache
        context.recipe_scope = RecipeScope(recipe)
        return context

    async def execute(
        self,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        listeners: Iterable[EventListener] = (),
        deps: object = None,
    ) -> AgentResult:
        """Run a recipe (or the registered recipe with this id) to the end.

        A failing step does not raise: the result is FAILED, with every step's execution.
        Cancelling the call cancels every running step, emits `RunFailed` and re-raises.

        Args:
            recipe: the recipe, or the id of a registered one.
            inputs: the run's inputs (templates read them as ``inputs``).
            run_id: the run's id; a new random one by default.
            listeners: callables receiving this run's events, in order.
            deps: what the run's tools taking a `ToolContext` read as ``ctx.deps`` (a
                database session, the current user...); never stored.

        Raises:
            RecipeError: the recipe is invalid (nothing has run).
            UnknownRecipeError: no registered recipe has this id.
        """
        return await self._execute(recipe, inputs, run_id=run_id, listeners=listeners, deps=deps)

    async def _execute(
        self,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None,
        *,
        run_id: str | None,
        listeners: Iterable[EventListener],
        deps: object,
        streaming: bool = False,
    ) -> AgentResult:
        found = self.recipe(recipe)
        graph = self.graph(found)
        context = self.create_context(found, inputs, run_id=run_id, listeners=listeners, deps=deps)
        context.streaming = streaming
        return await self.run(graph, context)

    def execute_sync(
        self,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        listeners: Iterable[EventListener] = (),
        deps: object = None,
    ) -> AgentResult:
        """`execute` for code that is not async (the same arguments). Inside a running event
        loop (a notebook, an async function) the run goes on in a thread of its own while the
        loop waits: ``await execute(...)`` there keeps the loop free."""
        return run_sync(
            lambda: self.execute(recipe, inputs, run_id=run_id, listeners=listeners, deps=deps),
            name="executor.execute(...)",
        )

    def stream(
        self,
        recipe: AgentRecipe | str,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        deps: object = None,
    ) -> RunStream:
        """Run a recipe and iterate its events as they happen, in sequence order, ending with
        `RunCompleted` or `RunFailed`. The models stream their answers (`TokenDelta` events)
        because you stream, whatever their own default::

            stream = executor.stream(recipe, inputs={"topic": "bees"})
            async for event in stream:
                print(event.kind, event.step_id)
            print(stream.result.output)

        To stop early, leave an ``async with`` block around the stream, or call
        ``await stream.aclose()``: either cancels a run still going (a bare ``break`` only
        stops reading; the run goes on until the stream is closed or garbage collected)::

            async with executor.stream(recipe) as stream:
                async for event in stream:
                    if event.kind == "step_failed":
                        break
        """
        return RunStream(
            lambda listener: self._execute(
                recipe, inputs, run_id=run_id, listeners=[listener], deps=deps, streaming=True
            )
        )

    async def run(
        self,
        graph: StepGraph,
        context: AgentContext,
        *,
        checkpoints: StepCheckpoints | None = None,
    ) -> AgentResult:
        """Run a validated graph in a context you built (see `create_context`).

        `checkpoints` (durable runs): steps it has a finished execution of are not run again.
        """
        selection = graph.recipe.selection_chain or self.selection_chain
        return await Run(graph, context, selection, checkpoints).execute()


class RecipeScope(Mapping[str, Any]):
    """The recipe as the step cache's key names it: its id, and for a recipe loaded from
    YAML its version (a hash of what it says: a new version misses every entry). Worked out
    when a cached step first asks, so runs without one pay nothing."""

    def __init__(self, recipe: AgentRecipe) -> None:
        self.recipe = recipe

    @functools.cached_property
    def _data(self) -> dict[str, Any]:
        import hashlib

        recipe = self.recipe
        spec = getattr(recipe.source, "spec", None)
        if spec is None:
            return {"id": recipe.id}
        text = spec.model_dump_json(exclude={"description"})
        return {"id": recipe.id, "version": hashlib.sha256(text.encode()).hexdigest()[:16]}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


async def run_inner_recipe(
    recipe: Any,
    inputs: Mapping[str, Any],
    *,
    run_id: str,
    settings: RunSettings,
    memory: ModelMemory,
    config: ExecutionConfig,
    deps: object = None,
) -> AgentResult:
    """The `RecipeRunner` of runs started here: a recipe inside another run, on an executor
    of the given settings (the outer run's tracer among them: the inner run's spans nest
    under the recipe step's), with the outer run's deps."""
    executor = AgentExecutor(settings=settings, memory=memory, config=config)
    return await executor.execute(recipe, inputs, run_id=run_id, deps=deps)
