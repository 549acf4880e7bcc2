"""Values as text: the one way minions writes a value into a prompt, a template or a report,
and how many tokens a text is estimated to be when no provider counted them."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["estimate_tokens"]


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
