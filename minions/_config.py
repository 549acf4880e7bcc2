"""Execution settings for steps and runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

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
    _set: frozenset[str] = field(init=False, repr=False, compare=False)
    """The fields given to the constructor: what this config overrides in `merged`."""

    def __new__(cls, **fields: Any) -> Self:
        # The generated `__init__` does not say which fields were given, but the keywords
        # reach `__new__` too.
        config = object.__new__(cls)
        object.__setattr__(config, "_set", frozenset(fields))
        return config

    def __post_init__(self) -> None:
        problems = []
        for f in _FIELDS:
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
        """The fields that differ from the defaults."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in _FIELDS
            if getattr(self, f.name) != getattr(default, f.name)
        }

    def overrides(self) -> dict[str, Any]:
        """The fields this config sets, in field order: those given to its constructor, even
        at their default value, and any that differ from the defaults. What it overrides as a
        step's or recipe's config (see `merged`), and what a recipe file needs to say.

        `dataclasses.replace` gives the constructor every field: a config made with it sets
        them all.
        """
        changed = self.changes()
        return {
            f.name: getattr(self, f.name)
            for f in _FIELDS
            if f.name in self._set or f.name in changed
        }

    def merged(self, overrides: Mapping[str, Any] | ExecutionConfig | None) -> ExecutionConfig:
        """This config with `overrides` applied: the fields a mapping names, or the fields an
        `ExecutionConfig` sets (see `overrides`); the others keep this config's values. So a
        step's ``ExecutionConfig(max_model_calls_per_step=3)`` keeps the run's
        `max_tool_call_retries`.

        Raises:
            ConfigError: a mapping names a field that does not exist, or a value is invalid.
        """
        if overrides is None:
            return self
        if isinstance(overrides, ExecutionConfig):
            changes = overrides.overrides()
        else:
            problem = self.unknown_fields(overrides)
            if problem:
                raise ConfigError(problem)
            changes = dict(overrides)
        if not changes:
            return self
        merged = dataclasses.replace(self, **changes)
        # `replace` gave every field; what the result sets is what either config set.
        object.__setattr__(merged, "_set", self._set.union(changes))
        return merged

    @classmethod
    def unknown_fields(cls, overrides: Mapping[str, Any]) -> str | None:
        """What is wrong with the names in `overrides`, or ``None`` when all are fields."""
        names = {f.name for f in _FIELDS}
        unknown = sorted(set(overrides) - names)
        if not unknown:
            return None
        return (
            f"unknown config field(s) {', '.join(map(repr, unknown))}; "
            f"known fields: {', '.join(sorted(names))}"
        )


_FIELDS: tuple[dataclasses.Field[Any], ...] = tuple(
    f for f in dataclasses.fields(ExecutionConfig) if f.init
)
"""The fields of `ExecutionConfig` its constructor takes (not the private `_set`)."""
