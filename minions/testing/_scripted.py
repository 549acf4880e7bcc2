"""Test doubles: a model that replays a script, and a model computed by a function."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

from minions._messages import Message, ModelCallResponse, Prompt, ToolCall, Usage
from minions._text import estimate_tokens
from minions.errors import ScriptExhaustedError
from minions.models import Model, TokenCallback

__all__ = ["FunctionModel", "Reply", "ScriptedModel"]

ToolRequest: TypeAlias = tuple[str, Mapping[str, Any] | str]
Reply: TypeAlias = str | Sequence[ToolRequest] | ModelCallResponse | BaseException
"""One scripted answer: text, a list of ``(tool_name, arguments)`` pairs (arguments as a dict
or as raw JSON text), a whole `ModelCallResponse`, or an exception to raise."""


def prompt_tokens(prompt: Prompt) -> int:
    """The tokens of `prompt`, estimated the same way every time (test doubles' usage)."""
    total = 0
    for message in prompt.messages:
        total += 4 + estimate_tokens(message.content)
        for call in message.tool_calls:
            total += estimate_tokens(call.name + json.dumps(dict(call.arguments), default=str))
    return total


class _Replier:
    """Turns `Reply` values into responses, numbering tool call ids."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ids = itertools.count(1)

    def respond(
        self, reply: Reply, prompt: Prompt, on_token: TokenCallback | None
    ) -> ModelCallResponse:
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, ModelCallResponse):
            return reply
        asked = prompt_tokens(prompt)
        if isinstance(reply, str):
            if on_token is not None:
                for chunk in chunks(reply):
                    on_token(chunk)
            return ModelCallResponse(
                message=Message.assistant(reply),
                usage=Usage.of_call(asked, estimate_tokens(reply)),
                model=self.name,
            )
        calls = []
        for pair in reply:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError(f"a scripted tool request must be (name, arguments), not {pair!r}")
            name, arguments = pair
            calls.append(
                ToolCall.parse(id=f"call_{next(self._ids)}", name=name, arguments=arguments)
            )
        text = json.dumps([[c.name, dict(c.arguments)] for c in calls], default=str)
        return ModelCallResponse(
            message=Message.assistant("", calls),
            usage=Usage.of_call(asked, estimate_tokens(text)),
            finish_reason="tool_calls",
            model=self.name,
        )


def chunks(text: str) -> list[str]:
    """`text` in the pieces a streaming test double reports: its words, each with its space."""
    words = text.split(" ")
    return [w if i == len(words) - 1 else w + " " for i, w in enumerate(words)]


class ScriptedModel(Model):
    """A model that answers from a script, one reply per call, and records every request.

    Args:
        replies: the script (see `Reply`). A scripted pair whose arguments are text that is
            not a JSON object raises `ModelOutputError`, like a real provider would.
        name: the model's name in events.
        delay: seconds each call takes (an `asyncio.sleep`), to simulate latency.

    Running out of replies raises `ScriptExhaustedError`, naming the step that asked.
    """

    def __init__(
        self, replies: Sequence[Reply] = (), *, name: str = "scripted", delay: float = 0.0
    ) -> None:
        self.name = name
        self.delay = delay
        self._replies = list(replies)
        self._next = 0
        self._replier = _Replier(name)
        self.requests: list[Prompt] = []
        """Every prompt received, in order."""

    @property
    def remaining(self) -> int:
        """Replies left in the script."""
        return len(self._replies) - self._next

    def add(self, *replies: Reply) -> None:
        """Append replies to the script."""
        self._replies.extend(replies)

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        self.requests.append(prompt)
        index = self._next
        if index >= len(self._replies):
            last = prompt.messages[-1].content[:200] if prompt.messages else ""
            raise ScriptExhaustedError(
                f"ScriptedModel {self.name!r} has no reply left: its script holds "
                f"{len(self._replies)} replies and this is request {index + 1} "
                f"(step {prompt.step_id!r}; last message: {last!r})"
            )
        self._next += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return self._replier.respond(self._replies[index], prompt, on_token)


class FunctionModel(Model):
    """A model whose every answer is computed by `fn(prompt)`, sync or async.

    `fn` returns a `Reply` (text, tool requests, a `ModelCallResponse`) or raises. Requests are
    recorded in `requests`.
    """

    def __init__(
        self,
        fn: Callable[[Prompt], Reply | Awaitable[Reply]],
        *,
        name: str = "function",
        delay: float = 0.0,
    ) -> None:
        self.fn = fn
        self.name = name
        self.delay = delay
        self._replier = _Replier(name)
        self.requests: list[Prompt] = []

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        self.requests.append(prompt)
        if self.delay:
            await asyncio.sleep(self.delay)
        reply = self.fn(prompt)
        if inspect.isawaitable(reply):
            reply = await reply
        return self._replier.respond(reply, prompt, on_token)
