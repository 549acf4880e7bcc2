"""RunSettings: what every run of an executor shares, in one frozen value."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minions._step.cache import StepCache
    from minions._tracing.metrics import RunMetrics
    from minions._tracing.tracer import RunTracer
    from minions.events import EventListener
    from minions.models import EndpointLimiter, Model
    from minions.tools import Approver

__all__ = ["RunSettings"]

_NO_SERVERS: Mapping[str, Any] = MappingProxyType({})


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What the runs of an `AgentExecutor` share: the model and how it is resolved and
    wrapped, who approves tool calls, where spans go, the MCP servers and the event listeners.

    An executor builds one from its keyword arguments (``executor.settings``) and hands it to
    the `AgentContext` of each run, which reads it as ``context.settings`` (with the run's own
    model, listeners and MCP servers folded in). A recipe step's inner run gets the outer run's
    settings too, with its own model, wrapper, listeners and servers
    (``dataclasses.replace``). Per-run things (inputs, run id, memory, config, tools) are not
    here.
    """

    model: Model | str | None = None
    """The default model: a `Model`, a model string (``"ollama:llama3.2:3b"``), or ``None``
    for the `MINIONS_MODEL` environment variable; resolved on first use."""
    model_resolver: Callable[[Model | str | None], Model] | None = None
    """Turns each model a run names (the default, a recipe's or a step's `Model` or model
    string, ``None`` when none is named) into the model to call; ``None``: `infer_model`.
    ``lambda _spec: ReplayModel(...)`` replays every model."""
    model_wrapper: Callable[[Model], Model] | None = None
    """Applied once to every model a run uses, after `model_resolver` (recording...)."""
    approver: Approver | None = None
    """Answers for tools that need a person's approval; ``None``: such a call fails its
    step with `ApprovalRequiredError`."""
    tracer: RunTracer | None = None
    """Writes the runs' OpenTelemetry spans; ``None``: nothing is traced (`AgentExecutor`
    makes one from its `tracer_provider`)."""
    metrics: RunMetrics | None = None
    """Records the runs' OpenTelemetry metrics; ``None``: nothing is measured
    (`AgentExecutor` makes one from its `meter_provider`)."""
    mcp_servers: Mapping[str, Any] = dataclasses.field(default_factory=lambda: _NO_SERVERS)
    """MCP server configs by name (`MCPStdioServer`, `MCPHttpServer`); a run connects to them
    when it starts and adds their tools to its own. Read-only."""
    listeners: tuple[EventListener, ...] = ()
    """Callables receiving every event of a run, in order."""
    limiter: EndpointLimiter | None = None
    """Holds model calls to the limits of their endpoints (`Limits`); ``None``: no limits."""
    step_cache: StepCache | None = None
    """Where steps that say ``cache`` keep their outputs; ``None``: the runs of an
    `AgentExecutor` share its `InMemoryStepCache` (a durable run's worker uses the run
    store)."""
    capture_content: bool | None = None
    """Whether the model call events carry the request's messages (`ModelCallStarted`) and
    the answer's text (`ModelCallCompleted`), bounded; durable runs store them with their
    events. Off by default: prompts may hold users' data. ``None``: as
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says (``true`` or ``SPAN_ONLY``
    turns it on), read when the settings are built."""

    def __post_init__(self) -> None:
        if self.capture_content is None:
            # Resolved once here, so a model call checks one attribute, never the environment.
            from minions._tracing.tracer import capture_from_environment

            object.__setattr__(self, "capture_content", capture_from_environment())
        # Read-only, and a copy: a caller's dict changed later does not change the settings.
        servers = self.mcp_servers
        if servers is not _NO_SERVERS:
            copied = MappingProxyType(dict(servers)) if servers else _NO_SERVERS
            object.__setattr__(self, "mcp_servers", copied)
        listeners: Iterable[EventListener] = self.listeners  # a list, from untyped code
        if not isinstance(listeners, tuple):
            object.__setattr__(self, "listeners", tuple(listeners))


DEFAULT_SETTINGS = RunSettings()
"""No model named, no resolver, wrapper, approver, tracer, metrics, MCP server, listener or
limits."""


def with_given(settings: RunSettings | None, owner: str, **given: Any) -> RunSettings:
    """What a constructor makes of its ``settings=`` argument and the keywords that are a
    shorthand for its fields: each field is given once, in the one or the other (a keyword
    may fill a field the settings leave unset).

    Raises:
        ConfigError: a field is set in `settings` and given as a keyword too.
    """
    changes = {name: value for name, value in given.items() if value is not None}
    if settings is None:  # a context built by hand: no copy of the defaults to make
        return RunSettings(**changes) if changes else DEFAULT_SETTINGS
    if not changes:
        return settings
    twice = sorted(n for n in changes if getattr(settings, n) != getattr(DEFAULT_SETTINGS, n))
    if twice:
        from minions.errors import ConfigError

        replace = ", ".join(f"{name}=..." for name in twice)
        raise ConfigError(
            f"{owner}: {', '.join(twice)} given both as a keyword and in settings=; give each "
            f"once: settings=dataclasses.replace(settings, {replace})"
        )
    return dataclasses.replace(settings, **changes)
