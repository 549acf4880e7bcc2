"""Retry policies, built on tenacity: one place that says how minions retries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential, wait_random

__all__ = ["announce", "retrying"]

RetryHook = Callable[[int, BaseException, float], None]


def announce(before_sleep: RetryHook) -> Callable[[RetryCallState], None]:
    """A tenacity `before_sleep` hook calling `before_sleep(attempt, error, delay)`."""

    def hook(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        if error is not None:
            before_sleep(state.attempt_number, error, delay)

    return hook


def _wait(initial: float, maximum: float) -> Callable[[RetryCallState], float]:
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


def retrying(
    *,
    attempts: int,
    retry_on: Callable[[BaseException], bool],
    initial_delay: float,
    max_delay: float,
    before_sleep: RetryHook | None = None,
) -> AsyncRetrying:
    """A tenacity policy: up to `attempts` tries, retrying errors `retry_on` accepts, with
    exponential backoff and jitter that gives way to a `retry_after` hint on the error.

    `before_sleep(attempt, error, delay)` runs before each wait (to emit a retry event).
    """

    kwargs: dict[str, Any] = {}
    if before_sleep is not None:
        kwargs["before_sleep"] = announce(before_sleep)
    return AsyncRetrying(
        stop=stop_after_attempt(max(attempts, 1)),
        wait=_wait(initial_delay, max_delay),
        retry=retry_if_exception(lambda e: isinstance(e, Exception) and retry_on(e)),
        reraise=True,
        **kwargs,
    )
