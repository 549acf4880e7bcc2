"""JSON Schemas from example values: ``{"ids": [], "reasoning": ""}`` to a schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = []

_SCHEMA_KEYS = {"properties", "$schema", "anyOf", "oneOf", "allOf", "enum", "$ref", "items"}
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def schema_from_example(example: Any) -> dict[str, Any]:
    """A JSON Schema for values shaped like `example`.

    ``{"ids": [], "reasoning": ""}`` gives an object with a required array ``ids`` and a required
    string ``reasoning``. A mapping that already is a JSON Schema (it has a ``type`` naming a
    JSON type, or ``properties``, ``anyOf``...) is returned as it is.
    """
    if isinstance(example, Mapping) and (
        _SCHEMA_KEYS & set(example) or example.get("type") in _JSON_TYPES
    ):
        return dict(example)
    return _infer(example)


def _infer(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list | tuple):
        return {"type": "array", "items": _infer(value[0])} if value else {"type": "array"}
    if isinstance(value, Mapping):
        return {
            "type": "object",
            "properties": {str(k): _infer(v) for k, v in value.items()},
            "required": [str(k) for k in value],
        }
    return {}
