"""Execution settings for steps and runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minions.errors import ConfigError

__all__ = ["ExecutionConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionConfig:
    """How steps run. Set it on the `AgentContext` for a run, and override fields per step.

    The first three defaults are those of the Java Minions module.
    """

    max_model_calls_per_step: int = 10
    """Model turns a step may take before it fails (retries of one turn are not extra turns)."""
    max_tool_call_retries: int = 2
    """Extra attempts for a tool that raises, before its error goes back to the model."""
    sequential_tool_calls: bool = False
    """Run the tool calls of one reply one by one, in the model's order, instead of at once."""
    max_model_retries: int = 3
    """Extra attempts after a transient model error (timeout, connection, 429, 5xx)."""
    max_output_retries: int = 2
    """Re-asks after invalid output (bad tool-argument JSON, output failing its schema)."""
    retry_initial_delay: float = 0.5
    """First backoff delay in seconds; doubles each retry, with jitter."""
    retry_max_delay: float = 30.0
    """Longest wait between retries, including a server's Retry-After hint."""
    model_call_timeout: float | None = None
    """Seconds one model call may take before it counts as a transient timeout."""
    tool_retry_initial_delay: float = 0.05
    """First backoff delay in seconds between attempts of a tool that raised."""
    tool_call_timeout: float | None = None
    """Seconds one tool call may take before it fails."""
    step_token_budget: int | None = None
    """Tokens one step may use, summed over all its model calls and retries."""
    run_token_budget: int | None = None
    """Tokens a whole run may use, across parallel steps and retries."""
    max_parallel_steps: int = 8
    """Steps of a run that may execute at once."""
    fail_fast: bool = False
    """Cancel every running step as soon as one step fails."""
    fire_and_forget_grace: float = 30.0
    """Seconds a finished run waits for its fire-and-forget steps before cancelling them."""

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float) and value < 0:
                problems.append(f"config.{f.name} must not be negative, got {value!r}")
        if self.max_model_calls_per_step < 1:
            problems.append("config.max_model_calls_per_step must be at least 1")
        if self.max_parallel_steps < 1:
            problems.append("config.max_parallel_steps must be at least 1")
        if problems:
            raise ConfigError("; ".join(problems))

    def changes(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what a recipe file needs to say)."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    def merged(self, overrides: Mapping[str, Any] | ExecutionConfig | None) -> ExecutionConfig:
        """This config with `overrides` applied: the fields a mapping names, or the fields an
        `ExecutionConfig` sets to something other than its default (the others keep this
        config's values).

        Raises:
            ConfigError: a mapping names a field that does not exist, or a value is invalid.
        """
        if overrides is None:
            return self
        if isinstance(overrides, ExecutionConfig):
            changes = overrides.changes()
            return dataclasses.replace(self, **changes) if changes else self
        problem = self.unknown_fields(overrides)
        if problem:
            raise ConfigError(problem)
        return dataclasses.replace(self, **overrides)

    @classmethod
    def unknown_fields(cls, overrides: Mapping[str, Any]) -> str | None:
        """What is wrong with the names in `overrides`, or ``None`` when all are fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if not unknown:
            return None
        return (
            f"unknown config field(s) {', '.join(map(repr, unknown))}; "
            f"known fields: {', '.join(sorted(names))}"
        )
