"""Refusing real model requests inside `minions.testing.block_real_models()`.

The switch is a context variable, so it holds for the task that set it, the tasks and threads
that task starts (`asyncio` tasks and `asyncio.to_thread` copy it, and so does `asyncio.run`,
hence `execute_sync`), and nothing else: concurrent tests do not block each other, and
nothing is left blocked after the block. Models behind a server check it before every
request (`OpenAIChatModel`), and so does the step loop for any model whose `endpoint` names
a server; the local `FakeOpenAIServer`s that are running are not real models.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Final

from minions._text import redact_url
from minions.errors import ModelError

if TYPE_CHECKING:
    from minions.models._base import Model

__all__: list[str] = []

BLOCK: Final[ContextVar[ModelBlock | None]] = ContextVar("minions_model_block", default=None)
"""The innermost block of the running task, if any."""
_lock = threading.Lock()
_test_servers: frozenset[str] = frozenset()
"""Base URLs of the `FakeOpenAIServer`s running in this process (replaced whole)."""


def _normal(url: str) -> str:
    return url.strip().rstrip("/")


def serving_tests(base_url: str, running: bool) -> None:
    """Say that a test server at `base_url` started (`running`) or stopped."""
    global _test_servers
    with _lock:
        if running:
            _test_servers = _test_servers | {_normal(base_url)}
        else:
            _test_servers = _test_servers - {_normal(base_url)}


@dataclass(eq=False)
class ModelBlock:
    """A block of real model requests (see `minions.testing.block_real_models`).

    Attributes:
        allow: base URLs still allowed inside it (with whatever follows them).
        blocked: what was refused inside it, one line each (``openai:gpt-4o-mini at
            https://api.openai.com/v1``), in order.
    """

    allow: frozenset[str] = frozenset()
    blocked: list[str] = field(default_factory=list)
    _outer: ModelBlock | None = field(default=None, repr=False)
    _tokens: list[Token[ModelBlock | None]] = field(default_factory=list, repr=False)

    def __enter__(self) -> ModelBlock:
        outer = BLOCK.get()
        self._outer = outer
        if outer is not None:
            self.allow = self.allow | outer.allow
        self._tokens.append(BLOCK.set(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        BLOCK.reset(self._tokens.pop())

    def allows(self, base_url: str) -> bool:
        """Whether a request to `base_url` goes through: it is one of `allow` (or below one),
        or a running `FakeOpenAIServer`'s."""
        url = _normal(base_url)
        return any(url == a or url.startswith(a + "/") for a in self.allow | _test_servers)

    def _refused(self, where: str) -> None:
        block: ModelBlock | None = self
        while block is not None:
            block.blocked.append(where)
            block = block._outer


def model_block(allow: Iterable[str] = ()) -> ModelBlock:
    """A new block allowing `allow` (base URLs)."""
    return ModelBlock(allow=frozenset(_normal(url) for url in allow))


def check_request(model: str, base_url: str) -> None:
    """Refuse a request of `model` to `base_url` inside a block, unless allowed.

    Raises:
        ModelError: the request is refused; the message names the model, the endpoint and
            what to do.
    """
    block = BLOCK.get()
    if block is None or block.allows(base_url):
        return
    where = f"{model} at {redact_url(_normal(base_url))}"
    block._refused(where)
    configured = os.environ.get("MINIONS_MODEL")
    note = (
        f" (MINIONS_MODEL is {redact_url(configured)!r}: a step or run given no model uses it)"
        if configured
        else ""
    )
    raise ModelError(
        f"a real model request was blocked: {where}{note}. Inside block_real_models(), "
        "give the step or executor a test double (TestModel, ScriptedModel, FunctionModel, "
        "ReplayModel or a FakeOpenAIServer's model), or allow the endpoint with "
        "block_real_models(allow=[...])"
    )


def check_model(model: Model) -> None:
    """`check_request` for a model whose `endpoint` names a server (any provider, ours or a
    user's); models without one (test doubles, replays) are never refused.

    Raises:
        ModelError: the request is refused.
    """
    if BLOCK.get() is None:
        return
    endpoint = model.endpoint
    if endpoint is not None:
        check_request(model.name, endpoint[0])
