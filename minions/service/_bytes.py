"""Every byte a request brings, checked before a route reads it: the path and the query are
UTF-8 without control characters; a JSON body is strict JSON: UTF-8, no ``NaN`` or
``Infinity`` (nor a number too large to be finite), no NUL character and no lone surrogate
in a string (Postgres refuses both, and neither encodes), nested at most `MAX_DEPTH` deep.
A problem is told naming the field (``body.inputs.tag``, ``query.cursor``), never echoing
what cannot be encoded."""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import unquote_to_bytes

__all__: list[str] = []

MAX_DEPTH = 32
"""The deepest nesting of arrays and objects a body may have."""

_CONTROL = re.compile("[\x00-\x1f\x7f]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_PLAIN = re.compile(r"[A-Za-z0-9_\-]{1,64}")


class _Constant(str):
    """``NaN``, ``Infinity`` or ``-Infinity`` where the body had one (found by the walk)."""


def _finite(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else _Constant(text)


def _name(key: str) -> str:
    """A key as a field name: itself when plain, else quoted with every non-ASCII escaped."""
    return key if _PLAIN.fullmatch(key) else json.dumps(key[:40])


def _text(raw: bytes, where: str) -> tuple[str | None, str | None]:
    """`raw` percent-decoded as UTF-8 text, or the problem with it."""
    try:
        text = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{where} is not UTF-8 once percent-decoded"
    if _CONTROL.search(text):
        return None, f"{where} holds a control character (NUL, newline...)"
    return text, None


def path_problem(raw_path: bytes) -> str | None:
    """What is wrong with a request's path, or None."""
    return _text(raw_path, "the path")[1]


def query_problem(query: bytes) -> str | None:
    """What is wrong with a request's query string, or None."""
    for pair in query.split(b"&"):
        raw_name, _, raw_value = pair.partition(b"=")
        name, problem = _text(raw_name.replace(b"+", b" "), "a query parameter's name")
        if problem is not None or name is None:
            return problem
        _, problem = _text(raw_value.replace(b"+", b" "), f"query.{_name(name)}")
        if problem is not None:
            return problem
    return None


def json_problem(body: bytes) -> str | None:
    """What is wrong with a JSON body, or None (an empty body is left to the route)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 (byte {exc.start} cannot be read)"
    try:
        value = json.loads(text, parse_constant=_Constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        return f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except ValueError:
        return "the body is not valid JSON: a number is too long"
    except RecursionError:
        return f"the body is nested deeper than {MAX_DEPTH} arrays and objects"
    return _value_problem(value)


def _value_problem(value: Any) -> str | None:
    stack: list[tuple[str, Any, int]] = [("body", value, 0)]
    while stack:
        where, item, depth = stack.pop()
        if isinstance(item, _Constant):
            return f"{where}: {str(item)[:40]} is not a finite JSON number"
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return f"{where}: holds a NUL character or a lone surrogate (neither is stored)"
            continue
        if isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                return f"{where}: nested deeper than {MAX_DEPTH} arrays and objects"
            if isinstance(item, list):
                stack += [(f"{where}.{i}", v, depth + 1) for i, v in enumerate(item)]
                continue
            for key, inner in item.items():
                if _UNSTORABLE.search(key):
                    return f"{where}: a key holds a NUL character or a lone surrogate"
                stack.append((f"{where}.{_name(key)}", inner, depth + 1))
    return None
