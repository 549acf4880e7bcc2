"""The `Model` interface every provider and test double implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from minions._messages import ModelCallResponse, Prompt

__all__ = ["Model", "TokenCallback"]

TokenCallback = Callable[[str], None]
"""Receives text deltas as a streaming model produces them."""


class Model(ABC):
    """A chat model: takes a `Prompt`, returns one assistant answer.

    Implementations raise `TransientModelError` for errors worth retrying (timeouts, 429,
    5xx), `ModelOutputError` for an unusable answer (bad tool-argument JSON, a cut-off), and
    `ModelError` for the rest. They never retry on their own: the step loop is the one retry
    boundary.
    """

    name: str = "model"

    @property
    def endpoint(self) -> tuple[str, str] | None:
        """Where the model is served, (base URL, model id), for models behind a server:
        what limits per endpoint (`Limits`) match. ``None`` for the others; a model that
        wraps another says the other's."""
        return None

    @abstractmethod
    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        """Answer `prompt`. Streaming models call `on_token` with each text delta."""

    async def check(self) -> None:
        """Make sure the model can be called (its server answers), cheaply, before a run
        starts. Does nothing unless the model has a server to ask.

        Raises:
            ModelError: the model cannot be reached; the message says where and what to do.
        """
        return  # A no-op default: only models with a server override it.

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
