"""What a running tool may know about its call: `ToolContext`, as the tool's first parameter or
through `tool_context()`."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Generic, cast

from minions._generic import DepsT
from minions.errors import MissingDepsError

__all__ = ["ToolContext", "tool_context"]


class ToolContext(Generic[DepsT]):
    """The call a tool is running for, and the run's dependencies.

    A tool whose first parameter is annotated ``ToolContext[D]`` gets it as that argument
    (it is not part of the tool's JSON Schema: the model never sees it); any tool can read
    it with `tool_context()`::

        @tool
        def convert(ctx: ToolContext[Deps], amount: float, currency: str) -> float:
            \"\"\"Convert an amount to euros.\"\"\"
            return amount * ctx.deps.rates[currency]

    To test such a tool alone, call it with one: ``convert(ToolContext(deps=Deps(...)), 10.0,
    "USD")``.

    Args:
        run_id: the run's id.
        step_id: the step that made the call.
        scope: the step execution: ``step#visit`` (``step#visit[item]`` in a loop).
        call_id: the tool call's id.
        attempt: 1, then 2... when the call is tried again.
        deps: the run's ``deps`` (``None``: it has none); read them as `deps`.
    """

    __slots__ = ("_deps", "attempt", "call_id", "run_id", "scope", "step_id")

    def __init__(
        self,
        *,
        run_id: str = "",
        step_id: str | None = None,
        scope: str = "",
        call_id: str = "",
        attempt: int = 1,
        deps: object = None,
    ) -> None:
        self.run_id = run_id
        self.step_id = step_id
        self.scope = scope
        self.call_id = call_id
        self.attempt = attempt
        self._deps = deps

    @property
    def deps(self) -> DepsT:
        """The run's ``deps`` (``step.run(deps=...)``, ``AgentExecutor.execute(...,
        deps=...)``, ``AgentContext(deps=...)``, a durable worker's ``deps`` factory), typed
        as the tool's annotation says (``ToolContext[Deps]``: a ``Deps``).

        Raises:
            MissingDepsError: the run was given no deps (the step fails saying so; it is not
                the model's to handle).
        """
        if self._deps is None:
            raise MissingDepsError(
                f"a tool of step {self.step_id!r} (call {self.call_id!r}) reads ctx.deps, and "
                "this run was given none: pass deps= to step.run(...), "
                "AgentExecutor.execute(...) or AgentContext(...), or a deps factory to a "
                "durable Worker(deps=...)"
            )
        return cast(DepsT, self._deps)

    @property
    def idempotency_key(self) -> str:
        """``run/step#visit[item]/call``: the same for every attempt of this call, and for
        the same call when a durable run runs an unfinished step again after a crash. A tool
        with side effects can use it to do them once."""
        return f"{self.run_id}/{self.scope}/{self.call_id}"

    def __repr__(self) -> str:
        return (
            f"ToolContext(run_id={self.run_id!r}, step_id={self.step_id!r}, "
            f"call_id={self.call_id!r}, attempt={self.attempt})"
        )


_CURRENT: ContextVar[ToolContext[Any] | None] = ContextVar("minions_tool_context", default=None)


def tool_context() -> ToolContext[Any] | None:
    """The call the current tool runs for (``None`` outside a tool call). Works in async tools
    and in tools running in threads."""
    return _CURRENT.get()


def enter(context: ToolContext[Any]) -> object:
    """Make `context` what `tool_context()` returns, until `leave` with the token returned."""
    return _CURRENT.set(context)


def leave(token: object) -> None:
    """Give back the tool context from before the `enter` that returned `token`."""
    _CURRENT.reset(token)  # type: ignore[arg-type]
