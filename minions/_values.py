"""Token usage, output modes and their demotions: the values both errors and messages carry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["ModeDemotion", "OutputMode", "Usage"]

OutputMode = Literal["json_schema", "tool", "prompted_json"]
"""How a structured answer was asked for: the server's native JSON Schema mode, a forced call
of the output tool, or JSON asked for in the prompt (and repaired when needed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token usage of one or more model calls.

    A server that does not report usage is never counted as zero tokens: such a call adds to
    `unknown_calls`, and `complete` turns false, so totals say honestly what they cover.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    unknown_calls: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def complete(self) -> bool:
        """True when every counted call reported its usage."""
        return self.unknown_calls == 0

    @classmethod
    def of_call(cls, prompt_tokens: int | None, completion_tokens: int | None) -> Usage:
        """The usage of one call; `None` for either count means the server did not say."""
        if prompt_tokens is None or completion_tokens is None:
            return cls(
                prompt_tokens=prompt_tokens or 0,
                completion_tokens=completion_tokens or 0,
                calls=1,
                unknown_calls=1,
            )
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, calls=1)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            calls=self.calls + other.calls,
            unknown_calls=self.unknown_calls + other.unknown_calls,
        )

    @staticmethod
    def total(usages: Sequence[Usage]) -> Usage:
        """The sum of `usages`."""
        result = Usage()
        for usage in usages:
            result = result + usage
        return result


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeDemotion:
    """A structured-output mode an endpoint will no longer be asked in, and why."""

    mode: OutputMode
    reason: str
    base_url: str = ""
    """The endpoint, without credentials."""


_PREVIEW = 60
"""Characters of text, arguments or output a short repr shows."""


def preview(value: object) -> str:
    """`value` (text as it is, anything else as its repr) on one line, cut to 60 characters
    (``…`` says where), quoted: what the short reprs of executions, results and calls show of
    an output, an answer, arguments or an error."""
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    if len(text) > _PREVIEW:
        text = text[: _PREVIEW - 1] + "…"
    return repr(text) if isinstance(value, str) else text


def tokens_text(usage: Usage) -> str:
    """``'85+12'`` (prompt + completion tokens; ``'85+12 (not all reported)'`` when a call
    reported none): usage in a short repr, quoted."""
    tokens = f"{usage.prompt_tokens}+{usage.completion_tokens}"
    return repr(tokens if usage.complete else tokens + " (not all reported)")
