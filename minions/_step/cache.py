"""The step cache: a step that says ``cache`` reuses the output of an earlier execution whose
rendered prompt (goal, system prompt, its dependencies' outputs), model, tools and output
schema were the same, within a time to live, instead of calling its model.

A step whose tools have side effects (or need a person's approval) is never cached unless its
policy says ``side_effects=True``: serving such a step from the cache would skip its effects.
A tool has side effects unless it says it has none (`Tool(side_effects=False)`).

Where entries live is a `StepCache`: `InMemoryStepCache` for the runs of one `AgentExecutor`
(the default), the run store's table for durable runs (shared by every worker).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from minions.errors import StepDefinitionError

if TYPE_CHECKING:
    from minions._messages import Message, ToolSpec
    from minions._output import OutputInstructions
    from minions.models import Model
    from minions.tools import Tool

__all__ = ["CachePolicy", "CachedStep", "InMemoryStepCache", "StepCache"]


@dataclass(frozen=True, kw_only=True)
class CachePolicy:
    """How a step uses the step cache.

    Attributes:
        ttl: seconds an entry serves (``None``: for as long as the cache keeps it).
        side_effects: cache the step even though its tools have side effects or need
            approval (a hit skips them).
    """

    ttl: float | None = None
    side_effects: bool = False

    @classmethod
    def of(cls, value: CachePolicy | bool | Mapping[str, Any] | None) -> CachePolicy | None:
        """A step's ``cache`` as a policy: ``True`` (no ttl), ``{"ttl": "1h", "side_effects":
        False}``, a policy, or ``None``/``False`` (not cached).

        Raises:
            StepDefinitionError: an unknown key, or a ttl that is not a duration.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, CachePolicy):
            return value
        if not isinstance(value, Mapping):
            raise StepDefinitionError(
                f"cache must be true, false or {{ttl: ..., side_effects: ...}}, not {value!r}"
            )
        unknown = set(value) - {"ttl", "side_effects"}
        if unknown:
            raise StepDefinitionError(
                f"cache has unknown keys {sorted(unknown)}; known: ttl, side_effects"
            )
        return cls(ttl=duration(value.get("ttl")), side_effects=bool(value.get("side_effects")))


def duration(value: Any) -> float | None:
    """Seconds of a cache ttl: a number, or text such as ``"90s"``, ``"30m"``, ``"1h"``,
    ``"2d"``, ``"2w"`` (``None`` stays ``None``): the grammar of every duration
    (`minions._duration`).

    Raises:
        StepDefinitionError: anything else, or a duration that is not positive or too long.
    """
    if value is None:
        return None
    from minions._duration import duration_seconds

    try:
        return duration_seconds(value)
    except ValueError as exc:
        raise StepDefinitionError(f"cache ttl: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class CachedStep:
    """An entry of the step cache: what a completed execution produced, and what it cost."""

    output: Any
    next_step: str | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    """The tokens of the execution that made the entry: what each hit saves."""
    step_id: str = ""
    created_at: float = 0.0
    run_id: str = ""
    """The run that made it (a durable run's entries are pruned with it)."""
    recipe_id: str = ""
    """Its run's recipe."""


class StepCache(Protocol):
    """Where cached step outputs live."""

    async def get(self, key: str, *, ttl: float | None) -> CachedStep | None:
        """The entry of `key` if there is one no older than `ttl` seconds."""
        ...

    async def put(self, key: str, entry: CachedStep) -> None:
        """Keep `entry` under `key` (replacing an older one), made now (its `created_at` is
        the cache's time)."""
        ...


class InMemoryStepCache:
    """A step cache in this process's memory: the runs of one `AgentExecutor` share it.

    Args:
        clock: the time (``time.time``; tests give their own to make entries expire).
        max_entries: the oldest entries are dropped beyond this many.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time, max_entries: int = 10_000):
        self.clock = clock
        self.max_entries = max_entries
        self._entries: dict[str, CachedStep] = {}

    async def get(self, key: str, *, ttl: float | None) -> CachedStep | None:
        """The entry of `key`, unless it is older than `ttl` seconds (then ``None``)."""
        entry = self._entries.get(key)
        if entry is None or (ttl is not None and self.clock() - entry.created_at > ttl):
            return None
        return entry

    async def put(self, key: str, entry: CachedStep) -> None:
        """Keep `entry` under `key` (the oldest entries go past the cache's size)."""
        self._entries.pop(key, None)
        self._entries[key] = dataclasses.replace(entry, created_at=self.clock())
        while len(self._entries) > self.max_entries:
            del self._entries[next(iter(self._entries))]

    def __len__(self) -> int:
        return len(self._entries)


def cache_age(cache: StepCache, entry: CachedStep) -> float:
    """Seconds since `entry` was made, by the cache's clock when it has one."""
    clock: Callable[[], float] = getattr(cache, "clock", time.time)
    return clock() - entry.created_at


class Refreshing:
    """A step cache that never answers but keeps what runs: each step that says ``cache``
    runs, and its entry replaces the older one (a rerun's steps, which run again).

    Args:
        cache: the cache it writes to.
    """

    def __init__(self, cache: StepCache) -> None:
        self.cache = cache

    async def get(self, key: str, *, ttl: float | None) -> CachedStep | None:
        return None

    async def put(self, key: str, entry: CachedStep) -> None:
        await self.cache.put(key, entry)


def cache_key(
    *,
    messages: Sequence[Message],
    model: Model,
    tools: Sequence[ToolSpec],
    output: OutputInstructions | None,
    world: Mapping[str, Any] | None = None,
) -> str:
    """The key of a step execution: its rendered prompt, the model, the tools it may call and
    its output schema, and the world it runs in (`world`: its recipe and version, where its
    tools come from and what they reach, as `cache_world` says), hashed."""
    from minions._text import jsonable

    data = {
        "world": dict(world or {}),
        "messages": [
            {"role": m.role, "content": m.content, "name": getattr(m, "name", None)}
            for m in messages
        ],
        "model": model_identity(model),
        "tools": [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in tools
        ],
        "output": None if output is None else output.json_schema(),
    }
    text = json.dumps(jsonable(data), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def cache_world(
    recipe: Mapping[str, Any], tools: Iterable[Tool], servers: Mapping[str, Any]
) -> dict[str, Any]:
    """What a step's answer depends on besides its prompt: its recipe (id and version,
    `recipe`), and for each of its `tools` where it comes from (the module and function, or
    the MCP server, of `servers`, that serves it) and what it reaches besides its arguments
    (`Tool.reach`: a file tool's folder). Two steps alike in a different world never share
    an entry."""
    origins: list[dict[str, Any]] = []
    for tool in tools:
        if tool.origin is not None:
            server = servers.get(tool.origin[0])
            origins.append({"name": tool.name, "mcp": list(tool.origin), "server": repr(server)})
            continue
        fn = tool.fn
        origins.append(
            {
                "name": tool.name,
                "module": getattr(fn, "__module__", None),
                "function": getattr(fn, "__qualname__", None),
                "reach": tool.reach,
            }
        )
    return {"recipe": dict(recipe), "tools": sorted(origins, key=lambda o: o["name"])}


def model_identity(model: Model) -> str:
    """What tells one model from another in a cache key: its class, name and endpoint."""
    parts = [type(model).__name__]
    for attribute in ("name", "model", "model_name", "base_url"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value not in parts:
            parts.append(value)
    return "|".join(parts)
