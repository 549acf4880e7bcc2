"""Retry policies, built on tenacity: one place that says how minions retries.

The first attempt runs outside tenacity, so the common case (it works) costs nothing; after a
retryable failure, tenacity drives the rest, starting from that failure as its attempt 1, so
waits, limits and hooks are tenacity's alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tenacity import AsyncRetrying, RetryCallState

__all__ = []

T = TypeVar("T")
RetryHook = Callable[[int, BaseException, float], None]
"""Called before each wait with (failed attempt number, its error, seconds to wait)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Up to `attempts` tries, retrying the errors `retry_on` accepts, with exponential backoff
    and jitter that gives way to a `retry_after` hint (seconds) on the error."""

    attempts: int
    retry_on: Callable[[BaseException], bool]
    initial_delay: float
    max_delay: float

    async def run(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        before_sleep: RetryHook | None = None,
    ) -> T:
        try:
            return await fn(*args)
        except Exception as exc:
            if self.attempts <= 1 or not self.retry_on(exc):
                raise
            failure: Exception | None = exc

        async def attempt() -> T:
            nonlocal failure
            if failure is not None:
                error, failure = failure, None
                raise error
            return await fn(*args)

        result: T = await self._tenacity(before_sleep)(attempt)
        return result

    def _tenacity(self, before_sleep: RetryHook | None) -> AsyncRetrying:
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

        kwargs: dict[str, Any] = {}
        if before_sleep is not None:
            kwargs["before_sleep"] = _announce(before_sleep)
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=_wait(self.initial_delay, self.max_delay),
            retry=retry_if_exception(lambda e: isinstance(e, Exception) and self.retry_on(e)),
            reraise=True,
            **kwargs,
        )


def _announce(before_sleep: RetryHook) -> Callable[[RetryCallState], None]:
    def hook(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        if error is not None:
            before_sleep(state.attempt_number, error, delay)

    return hook


def _wait(initial: float, maximum: float) -> Callable[[RetryCallState], float]:
    from tenacity.wait import wait_exponential, wait_random

    backoff = wait_exponential(multiplier=initial, max=maximum) + wait_random(0, initial)

    def wait(state: RetryCallState) -> float:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        hint = getattr(error, "retry_after", None)
        if isinstance(hint, int | float) and hint >= 0:
            # The server said when to come back: that beats our own guess, up to the cap.
            return min(float(hint), maximum)
        return min(backoff(state), maximum) if initial > 0 else 0.0

    return wait
