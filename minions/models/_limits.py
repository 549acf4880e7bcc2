"""Limits per model endpoint: requests in flight, requests and tokens per minute, and pauses
after a 429 with ``Retry-After``, shared by every run that calls the endpoint.

`Limits` is the settings file (``--limits FILE``, or ``AgentExecutor(limits=...)``); an
`EndpointLimiter` enforces it. `LocalLimiter` holds the limits within one process (asyncio);
the durable runs' limiter (``minions.runs``) holds them over every worker of a store. The step
loop's `ModelCallExecutor` takes a `EndpointPermit` before each model call attempt and gives it back
after; with no limiter, or none of its entries matching the model's endpoint, it costs one
attribute check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from minions._text import estimate_tokens
from minions.errors import ConfigError

__all__ = [
    "EndpointLimit",
    "EndpointLimiter",
    "EndpointPermit",
    "EndpointWait",
    "Limits",
    "LocalLimiter",
]

EndpointKey = tuple[str, str]
"""(base URL, model): where a model is served."""

WINDOW: Final = 60.0
"""Seconds of the requests- and tokens-per-minute windows."""

DEFAULT_CAPABILITY_EXPIRY: Final = 7 * 86400.0
"""Seconds what an endpoint taught the structured-output ladder is kept in a run store."""

DEFAULT_MAX_PAUSE: Final = 300.0
"""The longest pause of an endpoint after a 429, in seconds, whatever its ``Retry-After``
asked (`Limits.max_pause`)."""

DEFAULT_DEMOTE_RUNS: Final = 3
"""How many distinct runs must each see an output mode ignored before a run store demotes
it for every run (`Limits.demote_after_runs`)."""

WaitReason = Literal["max_concurrent", "requests_per_minute", "tokens_per_minute", "retry_after"]

MAX_LIMITS_BYTES = 1 << 20
"""The largest limits file read (a few lines are usual): a bigger one is refused, unread."""
_SHOWN_PROBLEMS = 10
"""The most problems of a limits file one error names (the count of the rest follows)."""


def base_url(url: str) -> str:
    """A base URL as endpoints are keyed by: without a trailing slash."""
    return url.strip().rstrip("/")


class EndpointLimit(BaseModel):
    """The limits of one endpoint (an entry of `Limits.endpoints`).

    Attributes:
        match: a base URL (``http://127.0.0.1:8080/v1``: every model it serves, together), or
            a base URL and a model (``http://127.0.0.1:8080/v1#llama3.2:3b``: that model only).
        max_concurrent: requests in flight at once.
        requests_per_minute: requests started in any 60 seconds.
        tokens_per_minute: prompt and completion tokens in any 60 seconds: a request counts
            its estimate (the prompt's characters / 4) when it starts, corrected by the usage
            its answer reports. A request larger than the whole budget still goes when the
            window is empty.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str
    max_concurrent: int | None = Field(default=None, ge=1)
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)

    @field_validator("match")
    @classmethod
    def _check_match(cls, value: str) -> str:
        url, hash_, model = value.strip().partition("#")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"match must be a base URL (http://... or https://...), not {value!r}")
        if hash_ and not model.strip():
            raise ValueError(f"nothing after '#' in {value!r}: write URL#MODEL, or only URL")
        return f"{base_url(url)}#{model.strip()}" if hash_ else base_url(url)

    def matches(self, endpoint: EndpointKey) -> bool:
        """Whether calls to `endpoint` count against this entry."""
        url, _, model = self.match.partition("#")
        return base_url(endpoint[0]) == url and (not model or endpoint[1] == model)


class ProjectLimit(BaseModel):
    """The limits of one project (an entry of `Limits.projects`), held by the workers of a
    store over all of them: a run of the project starts only within them, else it waits
    queued, holding no worker's place, until the project is under them again.

    Attributes:
        name: the project.
        max_runs_in_flight: its runs started and not ended (running, or waiting for a
            person) at once.
        tokens_per_day: the tokens its runs used in the last 24 hours (the runs that ended
            within them, and those in flight): while they reach it, no run of it starts
            (a run that started finishes).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    max_runs_in_flight: int | None = Field(default=None, ge=1)
    tokens_per_day: int | None = Field(default=None, ge=1)


class Limits(BaseModel):
    """The limits file: limits per model endpoint, shared by every run that calls one, and
    per project, over the runs of each.

    ``minions run``, ``minions worker`` and ``minions serve`` take it as ``--limits FILE``::

        endpoints:
          - match: "http://127.0.0.1:8080/v1"
            max_concurrent: 2
            requests_per_minute: 60
            tokens_per_minute: 20000
        capability_expiry: 7d
        max_pause: 5m
        demote_after_runs: 3
        projects:
          - name: team-a
            max_runs_in_flight: 4
            tokens_per_day: 2000000

    Every entry that matches a call applies to it. A durable run's limits hold over every
    worker of its store; a foreground run's over its process.

    Attributes:
        endpoints: the limited endpoints.
        projects: the limited projects (durable runs only: their workers hold them).
        capability_expiry: how long a run store keeps what an endpoint taught the
            structured-output ladder (seconds, or ``30m``, ``12h``, ``7d``, ``2w``).
        max_pause: the longest pause of an endpoint after a 429, whatever its
            ``Retry-After`` asked (5 minutes by default; ``0``: a 429 pauses no other
            call, each call only waits out its own retry).
        demote_after_runs: how many distinct runs must each see an output mode ignored
            (answered in prose, twice in a row) before a run store demotes that mode for
            every run; a mode the server refuses on the wire is demoted at once.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: tuple[EndpointLimit, ...] = ()
    capability_expiry: float = DEFAULT_CAPABILITY_EXPIRY
    max_pause: float = Field(default=DEFAULT_MAX_PAUSE, ge=0)
    demote_after_runs: int = Field(default=DEFAULT_DEMOTE_RUNS, ge=1, le=1000)
    projects: tuple[ProjectLimit, ...] = ()

    @field_validator("projects")
    @classmethod
    def _one_entry_each(cls, value: tuple[ProjectLimit, ...]) -> tuple[ProjectLimit, ...]:
        names = [p.name for p in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"project {twice[0]!r} has two entries: give it one")
        return value

    @field_validator("capability_expiry", "max_pause", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        from minions._duration import duration_seconds

        return duration_seconds(value)

    @classmethod
    def load(cls, path: str | Path) -> Limits:
        """The limits in a YAML (or JSON) file.

        Raises:
            ConfigError: the file cannot be read, or its content is not valid limits; the
                message names the file and the field.
        """
        import yaml

        from minions._files import UnreadableFileError, read_text_file

        file = Path(path)
        named = f"the limits file {str(file)!r}"
        try:
            text = read_text_file(file, limit=MAX_LIMITS_BYTES)
        except UnreadableFileError as exc:
            raise ConfigError(f"cannot read {named}: {exc}") from None
        try:
            data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{named} is not valid YAML: {exc}") from None
        except (ValueError, OverflowError) as exc:  # a value YAML cannot build: 2001-13-45
            raise ConfigError(f"{named} is not valid YAML: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{named} is not valid YAML: it nests too deeply") from None
        try:
            return cls.model_validate({} if data is None else data)
        except ValidationError as exc:
            errors = exc.errors()
            problems = "; ".join(
                f"{'.'.join(map(str, error['loc'])) or '(top)'}: {error['msg']}"
                for error in errors[:_SHOWN_PROBLEMS]
            )
            if len(errors) > _SHOWN_PROBLEMS:
                problems += f"; and {len(errors) - _SHOWN_PROBLEMS:,} more"
            raise ConfigError(f"{named} is invalid: {problems}") from None

    def rules(self, endpoint: EndpointKey) -> tuple[EndpointLimit, ...]:
        """The entries that apply to calls to `endpoint`, in file order."""
        return tuple(rule for rule in self.endpoints if rule.matches(endpoint))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EndpointWait:
    """Why a model call waits before it is sent."""

    match: str
    """The entry of the limits that holds the call (its `EndpointLimit.match`)."""
    reason: WaitReason
    until: float | None = None
    """When the wait should end, on the limiter's clock, when that is known (a window that
    moves on, a pause); ``None``: when a call in flight ends."""


OnWait = Callable[[EndpointWait], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EndpointPermit:
    """The right to send one model call: give it back with `EndpointLimiter.release`."""

    endpoint: EndpointKey
    tickets: tuple[tuple[EndpointLimit, Any], ...]
    tokens: int
    """The estimate it was taken with."""


def blocked(
    rule: EndpointLimit,
    *,
    now: float,
    in_flight: int,
    requests: int,
    tokens_used: int,
    oldest: float | None,
    paused_until: float,
    tokens: int,
) -> EndpointWait | None:
    """Why a call of `tokens` may not start now under `rule` (``None``: it may), given what
    the endpoint has in flight and in its window: `requests` started and `tokens_used` within
    the last `WINDOW` seconds, the oldest of them started at `oldest`."""
    if paused_until > now:
        return EndpointWait(match=rule.match, reason="retry_after", until=paused_until)
    if rule.max_concurrent is not None and in_flight >= rule.max_concurrent:
        return EndpointWait(match=rule.match, reason="max_concurrent")
    until = None if oldest is None else oldest + WINDOW
    if rule.requests_per_minute is not None and requests >= rule.requests_per_minute:
        return EndpointWait(match=rule.match, reason="requests_per_minute", until=until)
    limit = rule.tokens_per_minute
    if limit is not None and requests and tokens_used + tokens > limit:
        return EndpointWait(match=rule.match, reason="tokens_per_minute", until=until)
    return None


def estimate_prompt(prompt: Any) -> int:
    """A call's tokens before it is sent: its messages' characters / 4."""
    return sum(4 + estimate_tokens(message.content or "") for message in prompt.messages)


class EndpointLimiter(ABC):
    """Holds model calls to the `Limits` of their endpoints.

    Subclasses implement `_acquire`, `_release` and `_pause` for one entry of the limits;
    calls that match several entries take them in file order (so two calls never hold one
    each of what the other needs).

    Args:
        limits: the limits.
        clock: the time in seconds that `EndpointWait.until` is on.
    """

    def __init__(self, limits: Limits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._rules: dict[EndpointKey, tuple[EndpointLimit, ...]] = {}

    def rules(self, endpoint: EndpointKey) -> tuple[EndpointLimit, ...]:
        """The entries of the limits that apply to `endpoint` (computed once per endpoint)."""
        found = self._rules.get(endpoint)
        if found is None:
            found = self._rules[endpoint] = self.limits.rules(endpoint)
        return found

    async def acquire(
        self, endpoint: EndpointKey, *, tokens: int, on_wait: OnWait | None = None
    ) -> EndpointPermit | None:
        """EndpointWait until a call of about `tokens` to `endpoint` may be sent; `on_wait` is told
        why, once, when it has to wait. ``None`` when no entry limits the endpoint."""
        rules = self.rules(endpoint)
        if not rules:
            return None
        held: list[tuple[EndpointLimit, Any]] = []
        try:
            for rule in rules:
                held.append((rule, await self._acquire(rule, tokens, on_wait)))
        except BaseException:
            for rule, ticket in held:
                self._release(rule, ticket, tokens)
            raise
        return EndpointPermit(endpoint=endpoint, tickets=tuple(held), tokens=tokens)

    def release(self, permit: EndpointPermit, *, tokens: int | None = None) -> None:
        """The call of `permit` ended; it cost `tokens` (``None``: as estimated)."""
        used = permit.tokens if tokens is None else tokens
        for rule, ticket in permit.tickets:
            self._release(rule, ticket, used)

    def pause(self, endpoint: EndpointKey, seconds: Any, *, by: str | None = None) -> float:
        """Send no call to `endpoint` for `seconds` (it answered 429 with ``Retry-After``),
        at most `Limits.max_pause`; `by`: the run that was told (kept with the pause). A
        hint that is no number of seconds (NaN, infinite, negative, not a number) pauses
        nothing. How long the pause is (0: none)."""
        hint = pause_hint(seconds)
        if hint is None:
            return 0.0
        held = min(hint, self.limits.max_pause)
        if held <= 0:
            return 0.0
        for rule in self.rules(endpoint):
            self._pause(rule, held, by=by, asked=hint)
        return held

    @abstractmethod
    async def _acquire(self, rule: EndpointLimit, tokens: int, on_wait: OnWait | None) -> Any:
        """EndpointWait for a place under `rule`; return what `_release` needs to give it back."""

    @abstractmethod
    def _release(self, rule: EndpointLimit, ticket: Any, tokens: int) -> None:
        """Give back the place `ticket` of `rule`, whose call cost `tokens`."""

    @abstractmethod
    def _pause(self, rule: EndpointLimit, seconds: float, *, by: str | None, asked: float) -> None:
        """Hold every call under `rule` for `seconds` (capped already: the endpoint `asked`
        for that many), as `by` (a run) was told."""


def pause_hint(value: Any) -> float | None:
    """A 429's wait in seconds as a pause may use it: a finite, non-negative number (a
    negative one is 0), else ``None`` (NaN, infinite, a bool, a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    if not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


@dataclasses.dataclass
class _Sent:
    started: float
    tokens: int


@dataclasses.dataclass
class _Endpoint:
    """What one entry of the limits has in flight and in its window, in this process."""

    in_flight: int = 0
    window: deque[_Sent] = dataclasses.field(default_factory=deque)
    paused_until: float = 0.0

    def trim(self, now: float) -> None:
        while self.window and self.window[0].started <= now - WINDOW:
            self.window.popleft()


class _Turns:
    """The waiting calls of one entry in one event loop: a FIFO lock (the head of the line
    is the only one that may take a place) and an event set when a place may be free."""

    def __init__(self) -> None:
        self.line = asyncio.Lock()  # asyncio.Lock wakes its waiters in order
        self.changed = asyncio.Event()
        self.head: EndpointWait | None = None
        """What the head of the line waits for (``None``: it does not know yet)."""
        self.untold: dict[int, OnWait] = {}
        """Callers behind the head not told yet why they wait: the head tells them as soon as
        it knows."""

    def told_behind(self, wait: EndpointWait) -> None:
        """The head waits for `wait`: tell the callers behind it who were not told yet."""
        self.head = wait
        untold, self.untold = self.untold, {}
        for tell in untold.values():
            tell(wait)


Sleep = Callable[[float], Awaitable[None]]


async def wait_for_change(changed: asyncio.Event, delay: float | None, sleep: Sleep) -> None:
    """Until `changed` is set or `delay` seconds (on the limiter's `sleep`) passed."""
    if delay is None:
        await changed.wait()
        return
    waiter = asyncio.ensure_future(changed.wait())
    sleeper = asyncio.ensure_future(sleep(max(delay, 0.0)))
    try:
        await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        sleeper.cancel()


class LineOfTurns:
    """The FIFO lines of one limiter, per entry and event loop (asyncio primitives belong
    to the loop that made them)."""

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Turns]] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, match: str) -> _Turns:
        lines = self._loops.setdefault(asyncio.get_running_loop(), {})
        turns = lines.get(match)
        if turns is None:
            turns = lines[match] = _Turns()
        return turns

    def wake(self, match: str) -> None:
        """Tell the waiters of every loop that a place may be free (from their own loops)."""
        for loop, lines in list(self._loops.items()):
            turns = lines.get(match)
            if turns is None or loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                turns.changed.set()
            else:
                loop.call_soon_threadsafe(turns.changed.set)


class LocalLimiter(EndpointLimiter):
    """Holds the limits within this process: what `minions run --limits` and
    ``AgentExecutor(limits=...)`` use. Callers wait in line, first come first served, per
    entry of the limits.

    Args:
        limits: the limits.
        clock: the time in seconds (`time.monotonic`); tests pass a clock of their own.
        sleep: waits a number of seconds of `clock` (`asyncio.sleep`); tests pass one that
            moves their clock on.
    """

    def __init__(
        self,
        limits: Limits,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        super().__init__(limits, clock=clock)
        self.sleep = sleep
        self._state: dict[str, _Endpoint] = {}
        self._lock = threading.Lock()  # executors in several threads may share a limiter
        self._turns = LineOfTurns()

    def _endpoint(self, match: str) -> _Endpoint:
        state = self._state.get(match)
        if state is None:
            state = self._state.setdefault(match, _Endpoint())
        return state

    def _try(self, rule: EndpointLimit, tokens: int, *, take: bool = True) -> EndpointWait | _Sent:
        now = self.clock()
        with self._lock:
            state = self._endpoint(rule.match)
            state.trim(now)
            window = state.window
            wait = blocked(
                rule,
                now=now,
                in_flight=state.in_flight,
                requests=len(window),
                tokens_used=sum(sent.tokens for sent in window),
                oldest=window[0].started if window else None,
                paused_until=state.paused_until,
                tokens=tokens,
            )
            if wait is not None:
                return wait
            if not take:  # free now, but earlier callers in line go first
                return EndpointWait(match=rule.match, reason="max_concurrent")
            sent = _Sent(started=now, tokens=tokens)
            state.in_flight += 1
            window.append(sent)
            return sent

    async def _acquire(self, rule: EndpointLimit, tokens: int, on_wait: OnWait | None) -> Any:
        turns = self._turns.of(rule.match)
        first = self._try(rule, tokens, take=not turns.line.locked())  # no line: no wait
        if isinstance(first, _Sent):
            return first
        if on_wait is not None:
            on_wait(first)
        async with turns.line:
            while True:
                turns.changed.clear()
                outcome = self._try(rule, tokens)
                if isinstance(outcome, _Sent):
                    return outcome
                delay = None if outcome.until is None else outcome.until - self.clock()
                await wait_for_change(turns.changed, delay, self.sleep)

    def _release(self, rule: EndpointLimit, ticket: Any, tokens: int) -> None:
        assert isinstance(ticket, _Sent)
        with self._lock:
            state = self._endpoint(rule.match)
            state.in_flight -= 1
            ticket.tokens = tokens  # corrected in the window it still counts in
        self._turns.wake(rule.match)

    def _pause(self, rule: EndpointLimit, seconds: float, *, by: str | None, asked: float) -> None:
        with self._lock:
            state = self._endpoint(rule.match)
            state.paused_until = max(state.paused_until, self.clock() + seconds)
        self._turns.wake(rule.match)

    def in_flight(self, match: str) -> int:
        """Calls in flight under the entry `match` (for tests and reports)."""
        return self._endpoint(match).in_flight
