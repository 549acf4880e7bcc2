"""Values valid for a JSON Schema, made up deterministically: what `TestModel` sends as tool
arguments and as structured output.

The value is the smallest plausible one: every property (only the required ones inside a
recursive definition), one item per array, ``"a"`` for text (a value of its format: a date, an
e-mail address, a UUID...), ``0`` and ``False``, the first of an ``enum``, the first branch of
an ``anyOf`` that is not ``null``, strings matching a ``pattern``. It is then checked against
the schema; a schema no value of this kind satisfies raises `SchemaDataError`, naming where.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__: list[str] = []

_FORMATS: Final[Mapping[str, str]] = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "duration": "P1D",
    "email": "a@example.com",
    "idn-email": "a@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "iri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "json-pointer": "/a",
    "regex": "a",
}
_TYPES: Final = ("object", "array", "string", "integer", "number", "boolean", "null")
_DEPTH: Final = 32


class SchemaDataError(Exception):
    """No value could be made for a schema; the message says where and why."""


def example_for(schema: Mapping[str, Any] | bool) -> Any:
    """A value valid for `schema`, the same every time.

    Raises:
        SchemaDataError: the schema cannot be satisfied by a made-up value (contradictory
            bounds, an empty ``enum``, ``false``, a pattern too hard to match, ...).
    """
    root = schema if isinstance(schema, Mapping) else {}
    value = _Maker(root).make(schema, "", ())
    problems = _problems(schema, value)
    if problems:
        raise SchemaDataError(f"the value made up, {value!r}, is not valid: {problems}")
    return value


def _problems(schema: Mapping[str, Any] | bool, value: Any) -> str:
    import jsonschema

    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    return "; ".join(
        f"{'/'.join(str(p) for p in error.absolute_path) or 'the top level'}: {error.message}"
        for error in errors[:3]
    )


class _Maker:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def make(self, schema: Mapping[str, Any] | bool, where: str, refs: tuple[str, ...]) -> Any:
        if schema is True:
            return "a"
        if schema is False:
            raise SchemaDataError(f"{where or 'the top level'}: the schema is `false` (no value)")
        if len(refs) > _DEPTH:
            raise SchemaDataError(f"{where}: the schema nests deeper than {_DEPTH} definitions")
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = self._resolve(ref, where)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            merged = {**target, **rest} if rest else target
            return self.make(merged, where, (*refs, ref))
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            options = schema["enum"]
            if not options:
                raise SchemaDataError(f"{where or 'the top level'}: the enum is empty")
            return options[0]
        if "allOf" in schema:
            merged = _merged([schema, *schema["allOf"]])
            return self.make(merged, where, refs)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._branch(schema, schema[key], where, refs)
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, where, refs)
        if kind == "array":
            return self._array(schema, where, refs)
        if kind == "string":
            return _string(schema, where)
        if kind in ("integer", "number"):
            return _number(schema, where, integer=kind == "integer")
        if kind == "boolean":
            return False
        return None

    def _resolve(self, ref: str, where: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            raise SchemaDataError(f"{where}: cannot follow the $ref {ref!r} (not in the schema)")
        node: Any = self.root
        for part in ref[1:].lstrip("/").split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                raise SchemaDataError(f"{where}: the $ref {ref!r} points at nothing")
            node = node[part]
        if not isinstance(node, Mapping | bool):
            raise SchemaDataError(f"{where}: the $ref {ref!r} is not a schema")
        return node if isinstance(node, Mapping) else {"not": {}} if node is False else {}

    def _branch(
        self, schema: Mapping[str, Any], branches: Sequence[Any], where: str, refs: tuple[str, ...]
    ) -> Any:
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
        # `Optional[X]` is `anyOf: [X, null]`: X says more about what the schema is for.
        ordered = sorted(branches, key=lambda b: isinstance(b, Mapping) and b.get("type") == "null")
        failures = []
        for branch in ordered:
            candidate = _merged([rest, branch]) if isinstance(branch, Mapping) else branch
            try:
                return self.make(candidate, where, refs)
            except SchemaDataError as exc:
                failures.append(str(exc))
        raise SchemaDataError(failures[0] if failures else f"{where or 'the top level'}: no branch")

    def _object(self, schema: Mapping[str, Any], where: str, refs: tuple[str, ...]) -> Any:
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        recursive = len(refs) != len(set(refs))
        result: dict[str, Any] = {}
        for name, sub in properties.items():
            # Inside a recursive definition, only what is required: the value must end.
            if recursive and name not in required:
                continue
            result[name] = self.make(sub, f"{where}/{name}", refs)
        for name in sorted(required - set(result)):
            extra = schema.get("additionalProperties", True)
            result[name] = self.make(extra if extra is not False else True, f"{where}/{name}", refs)
        extra = schema.get("additionalProperties", True)
        wanted = int(schema.get("minProperties") or 0)
        index = 0
        while len(result) < wanted and isinstance(extra, Mapping | bool) and extra is not False:
            index += 1
            result[f"key{index}"] = self.make(extra, f"{where}/key{index}", refs)
        if not properties and isinstance(extra, Mapping) and extra and not result and not recursive:
            result["key"] = self.make(extra, f"{where}/key", refs)
        return result

    def _array(self, schema: Mapping[str, Any], where: str, refs: tuple[str, ...]) -> list[Any]:
        prefix: Sequence[Any] = schema.get("prefixItems") or ()
        items = schema.get("items", True)
        low = int(schema.get("minItems") or 0)
        high = schema.get("maxItems")
        recursive = len(refs) != len(set(refs))
        count = max(low, len(prefix), 0 if recursive else 1)
        if isinstance(high, int):
            count = min(count, high)
        if items is False:
            count = min(count, len(prefix))
        result = []
        for index in range(count):
            sub = prefix[index] if index < len(prefix) else items
            value = self.make(sub, f"{where}/{index}", refs)
            if schema.get("uniqueItems") and value in result:
                value = _vary(value, index)
            result.append(value)
        contains = schema.get("contains")
        if isinstance(contains, Mapping):
            result.append(self.make(contains, f"{where}/contains", refs))
        return result


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or kind
        kind = kinds[0] if kinds else None
    if isinstance(kind, str) and kind in _TYPES:
        return kind
    if "properties" in schema or "additionalProperties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if "minimum" in schema or "maximum" in schema or "multipleOf" in schema:
        return "number"
    return "string"


def _merged(schemas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One schema holding what all of `schemas` ask (properties and `required` joined)."""
    merged: dict[str, Any] = {}
    for schema in schemas:
        for key, value in schema.items():
            if key == "allOf":
                continue
            if key == "properties" and isinstance(merged.get(key), Mapping):
                merged[key] = {**merged[key], **value}
            elif key == "required" and key in merged:
                merged[key] = [*merged[key], *(r for r in value if r not in merged[key])]
            else:
                merged[key] = value
    return merged


def _vary(value: Any, index: int) -> Any:
    if isinstance(value, str):
        return value + chr(ord("a") + index % 26) * (1 + index // 26)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + index
    return value


def _number(schema: Mapping[str, Any], where: str, *, integer: bool) -> int | float:
    low, high = -math.inf, math.inf
    step = schema.get("multipleOf")
    tiny = 1 if integer else (step or 1e-6)
    if "minimum" in schema:
        low = float(schema["minimum"])
    if "exclusiveMinimum" in schema:
        low = max(low, float(schema["exclusiveMinimum"]) + tiny)
    if "maximum" in schema:
        high = float(schema["maximum"])
    if "exclusiveMaximum" in schema:
        high = min(high, float(schema["exclusiveMaximum"]) - tiny)
    value = min(max(0.0, low), high)
    if integer:
        value = float(math.ceil(value))
    if step:
        value = math.ceil(value / step) * step
    if value < low or value > high:
        raise SchemaDataError(
            f"{where or 'the top level'}: no {'integer' if integer else 'number'} lies between "
            f"{schema.get('minimum', schema.get('exclusiveMinimum'))} and "
            f"{schema.get('maximum', schema.get('exclusiveMaximum'))}"
            + (f" (multiple of {step})" if step else "")
        )
    return int(value) if integer else value


def _string(schema: Mapping[str, Any], where: str) -> str:
    low = int(schema.get("minLength") or 0)
    high = schema.get("maxLength")
    pattern = schema.get("pattern")
    text = _FORMATS.get(str(schema.get("format")), "a")
    if isinstance(pattern, str):
        text = _matching(pattern, where)
    if len(text) < low:
        text += (text[-1:] or "a") * (low - len(text))
    if isinstance(high, int) and len(text) > high:
        text = text[:high]
    return text


def _matching(pattern: str, where: str) -> str:
    """A short string that `pattern` finds (JSON Schema patterns are not anchored)."""
    import re

    try:
        tree = importlib.import_module("re._parser").parse(pattern)
        text = _Regex().emit(tree.data)
    except Exception:
        text = None
    if text is not None and re.search(pattern, text):
        return text
    for candidate in ("a", "A", "0", "aa", "a0", "A0", "abc"):
        if re.search(pattern, candidate):
            return candidate
    raise SchemaDataError(
        f"{where or 'the top level'}: cannot make up a string matching the pattern {pattern!r}"
    )


class _Regex:
    """The shortest string a parsed regular expression (``re._parser``) matches, for the
    constructs JSON Schemas use; an exception for the others (the caller falls back)."""

    def emit(self, items: Sequence[tuple[Any, Any]]) -> str:
        return "".join(self._one(str(op), arg) for op, arg in items)

    def _one(self, op: str, arg: Any) -> str:
        if op == "LITERAL":
            return chr(arg)
        if op == "NOT_LITERAL":
            return "a" if arg != ord("a") else "b"
        if op == "ANY":
            return "a"
        if op == "AT":
            return ""
        if op == "IN":
            return self._set(arg)
        if op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _, body = arg
            return self.emit(body.data if hasattr(body, "data") else body) * int(low)
        if op == "SUBPATTERN":
            return self.emit(arg[-1].data if hasattr(arg[-1], "data") else arg[-1])
        if op == "ATOMIC_GROUP":
            return self.emit(arg.data if hasattr(arg, "data") else arg)
        if op == "BRANCH":
            first = arg[1][0]
            return self.emit(first.data if hasattr(first, "data") else first)
        if op in ("ASSERT", "ASSERT_NOT"):
            return ""
        if op == "CATEGORY":
            return self._category(str(arg))
        raise ValueError(f"unsupported regular expression construct {op}")

    def _set(self, members: Sequence[tuple[Any, Any]]) -> str:
        if members and str(members[0][0]) == "NEGATE":
            excluded = {chr(a) for op, a in members[1:] if str(op) == "LITERAL"}
            for op, a in members[1:]:
                if str(op) == "RANGE":
                    excluded |= {chr(c) for c in range(a[0], a[1] + 1)}
            return next(c for c in "aA0_-x" if c not in excluded)
        op, value = members[0]
        if str(op) == "LITERAL":
            return chr(value)
        if str(op) == "RANGE":
            return chr(value[0])
        if str(op) == "CATEGORY":
            return self._category(str(value))
        raise ValueError(f"unsupported character set member {op}")

    @staticmethod
    def _category(name: str) -> str:
        return {
            "CATEGORY_DIGIT": "0",
            "CATEGORY_NOT_DIGIT": "a",
            "CATEGORY_WORD": "a",
            "CATEGORY_NOT_WORD": "-",
            "CATEGORY_SPACE": " ",
            "CATEGORY_NOT_SPACE": "a",
        }.get(name, "a")
