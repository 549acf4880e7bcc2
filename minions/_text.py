"""Values as text: the one way minions writes a value into a prompt, a template or a report,
how a long text is cut, and how many tokens a text is estimated to be when no provider
counted them."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minions.events import Event

__all__ = ["estimate_tokens"]

PREVIEW_CHARS = 2_000
"""The most characters of a tool's result, a step's or a run's output, or a tool argument
that a run's stored event holds: the run and its steps hold the outputs whole."""


def as_text(value: Any, *, indent: int | None = None) -> str:
    """`value` as text: a string as it is, anything else as JSON (pydantic models, dataclasses
    and tuples as plain JSON data, what has no JSON form as its repr).

    Args:
        value: the value.
        indent: JSON indentation (``None``: one line).
    """
    if isinstance(value, str):
        return value
    return json.dumps(jsonable(value), ensure_ascii=False, indent=indent)


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data, as templates read it: pydantic models, dataclasses and tuples
    become dicts and lists at every depth; what has no JSON form becomes its repr."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value, fallback=repr)


def count_values(value: Any, limit: int) -> int:
    """How many JSON values `value` holds (itself, and each item and member, keys not
    counted), counted up to just past `limit`: the work stays bounded however big it is."""
    count, todo = 0, [value]
    while todo and count <= limit:
        current = todo.pop()
        count += 1
        if isinstance(current, dict):
            todo.extend(current.values())
        elif isinstance(current, list | tuple):
            todo.extend(current)
    return count


def cut_note(total: int, shown: int, unit: str) -> str:
    """What is added to a text that was cut, so its reader knows: ``[cut: 2,000,000 bytes,
    showing the first 1,000,000]``."""
    return f"\n[cut: {total:,} {unit}, showing the first {shown:,}]"


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """`text` when it has at most `limit` characters, else its first `limit` and a
    `cut_note`."""
    if len(text) <= limit:
        return text
    return text[:limit] + cut_note(len(text), limit, "characters")


def stored_event(event: Event) -> Event:
    """An event as a run's log keeps it: a tool's result, a step's or a run's output and a
    tool's string arguments longer than `PREVIEW_CHARS` cut to a `preview` (an output that
    is not a string then becomes the preview of its JSON). A result is stored once, not in
    every event that carries it: the run and its steps hold the outputs whole."""
    from minions.events import (
        ApprovalRequested,
        RunCompleted,
        StepCompleted,
        ToolCallCompleted,
        ToolCallStarted,
    )

    if isinstance(event, ToolCallCompleted) and len(event.content) > PREVIEW_CHARS:
        return dataclasses.replace(event, content=preview(event.content))
    if isinstance(event, StepCompleted | RunCompleted) and event.output is not None:
        text = as_text(event.output)
        if len(text) > PREVIEW_CHARS:
            return dataclasses.replace(event, output=preview(text))
    if isinstance(event, ToolCallStarted | ApprovalRequested):
        long = [
            k for k, v in event.arguments.items() if isinstance(v, str) and len(v) > PREVIEW_CHARS
        ]
        if long:
            arguments = {k: preview(v) if k in long else v for k, v in event.arguments.items()}
            return dataclasses.replace(event, arguments=arguments)
    return event


_USERINFO = re.compile(r"(?<=//)[^/@\s]*@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:[a-z0-9_.-]*(?:key|token|secret|password|passwd|pwd|sig|signature|auth)"
    r"[a-z0-9_.-]*)=)[^&#\s]*"
)


def redact_url(text: str) -> str:
    """`text` with the credentials of any URL in it hidden: ``user:pass@`` becomes ``***@``
    and secret-looking query values (``?key=``, ``&token=``...) become ``***``."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub("***@", text))


def estimate_tokens(text: str) -> int:
    """A deterministic token estimate (about four characters a token): what the test doubles
    report as usage, and what a plan's token report counts for a call with no usage."""
    return max(1, (len(text) + 3) // 4)


def token_count(total: int, *, unreported: bool = False) -> str:
    """A token count for people: ``n/a`` when no call reported usage, ``≥N`` when some did
    not (the provider sent no usage; never ``0+?``)."""
    if not unreported:
        return str(total)
    return f"≥{total}" if total else "n/a"


class Secret:
    """A secret (an API key) that never shows: its repr and str are stars, it has no
    `__dict__` for `vars()` to print, and `get()` is the only way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('**********')" if self._value else "Secret('')"

    __str__ = __repr__
