"""Structured output: what shape a step's answer must have, and how to read it from a reply."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from minions._generic import OutputT
from minions.errors import OutputValidationError

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = ["OutputInstructions"]

_M = TypeVar("_M")


def _schema_problems(schema: Any) -> tuple[str, ...]:
    """What is wrong with `schema` as a JSON Schema (against the meta-schema)."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        return (f"output schema is not valid JSON Schema at {where}: {exc.message}",)
    return ()


@lru_cache(maxsize=1024)
def _checked_schema(text: str) -> tuple[str, ...]:
    return _schema_problems(json.loads(text))


_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_MAX_ERRORS_IN_NOTE = 5


def extract_json(text: str) -> Any:
    """Read a JSON value out of a model's reply.

    Accepts bare JSON, JSON in a ```json fence, JSON surrounded by prose, and trivially broken
    JSON (trailing commas, a missing closing brace, Python literals), repaired with
    `json_repair`.

    Raises:
        OutputValidationError: no JSON object or array could be found.
    """
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    candidates = [match.group(1).strip() for match in _FENCE.finditer(stripped)]
    candidates.append(stripped)
    decoder = json.JSONDecoder()
    for candidate in candidates:
        for start, char in enumerate(candidate):
            if char in "{[":
                try:
                    return decoder.raw_decode(candidate, start)[0]
                except json.JSONDecodeError:
                    break
    import json_repair

    for candidate in candidates:
        start = min((i for i in (candidate.find("{"), candidate.find("[")) if i >= 0), default=-1)
        if start < 0:
            continue
        repaired = json_repair.loads(candidate[start:])
        if isinstance(repaired, dict | list) and repaired:
            return repaired
    raise OutputValidationError("Your answer did not contain a JSON object.")


@dataclass(frozen=True, kw_only=True)
class _Target:
    """How to validate and describe one output type."""

    name: str
    schema: Mapping[str, Any]
    adapter: TypeAdapter[Any] | None
    raw_schema: bool


@dataclass(frozen=True, init=False)
class OutputInstructions(Generic[OutputT]):
    """The structured output a step must produce; generic in it
    (``OutputInstructions(Expense)`` is an ``OutputInstructions[Expense]``).

    Args:
        output_type: a pydantic model class, any type pydantic can validate (`list[str]`, a
            dataclass, a `TypedDict`), or a raw JSON Schema as a dict (then the output is
            typed `Any`).
        instructions: extra text for the model about the output (appended to the goal).
        name: the name the output goes by (also the name of the output tool in tool mode);
            defaults to the model's class name or the schema's `title`.

    The validated output is a model instance for a pydantic model, a dict (or list) for a raw
    JSON Schema.
    """

    output_type: Any
    instructions: str | None
    name: str | None
    _cache: dict[str, Any] = field(init=False, repr=False, compare=False)

    @overload
    def __init__(
        self: OutputInstructions[_M],
        output_type: type[_M],
        instructions: str | None = None,
        name: str | None = None,
    ) -> None: ...
    @overload
    def __init__(
        self: OutputInstructions[Any],
        output_type: Mapping[str, Any],
        instructions: str | None = None,
        name: str | None = None,
    ) -> None: ...
    @overload
    def __init__(
        self: OutputInstructions[Any],
        output_type: object,
        instructions: str | None = None,
        name: str | None = None,
    ) -> None: ...
    def __init__(
        self, output_type: object, instructions: str | None = None, name: str | None = None
    ) -> None:
        object.__setattr__(self, "output_type", output_type)
        object.__setattr__(self, "instructions", instructions)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_cache", {})

    @cached_property
    def _target(self) -> _Target:
        if isinstance(self.output_type, Mapping):
            schema = dict(self.output_type)
            name = self.name or str(schema.get("title") or "output")
            return _Target(name=name, schema=schema, adapter=None, raw_schema=True)
        from pydantic import BaseModel, TypeAdapter

        if isinstance(self.output_type, type) and issubclass(self.output_type, BaseModel):
            return _Target(
                name=self.name or self.output_type.__name__,
                schema=self.output_type.model_json_schema(),
                adapter=TypeAdapter(self.output_type),
                raw_schema=False,
            )
        adapter: TypeAdapter[Any] = TypeAdapter(self.output_type)
        name = self.name or getattr(self.output_type, "__name__", None) or "output"
        return _Target(name=name, schema=adapter.json_schema(), adapter=adapter, raw_schema=False)

    @property
    def tool_name(self) -> str:
        """The name of the output tool, in the form tool names must have."""
        return re.sub(r"[^A-Za-z0-9_-]", "_", self._target.name)[:64]

    def json_schema(self) -> Mapping[str, Any]:
        """The JSON Schema the output must match (the model's, or the given dict)."""
        return self._target.schema

    def problems(self) -> list[str]:
        """What is wrong with these instructions themselves (e.g. a schema that is not valid
        JSON Schema); empty when they are usable."""
        try:
            target = self._target
        except Exception as exc:
            return [f"output type {self.output_type!r} cannot be validated: {exc}"]
        if target.raw_schema:
            # Checked once: a recipe is validated again on every run, and checking a schema
            # against the meta-schema costs milliseconds.
            found = self._cache.get("problems")
            if found is None:
                try:
                    text = json.dumps(target.schema, allow_nan=False)
                except (TypeError, ValueError):
                    found = _schema_problems(target.schema)
                else:
                    # Big recipes repeat their schemas: each is checked once per process.
                    found = _checked_schema(text)
                self._cache["problems"] = found
            return list(found)
        return []

    def field_descriptions(self) -> str:
        """The described fields of the output, one compact line each (``- name: text``), or
        ``""`` when no field has a description.

        The ``json_schema`` rung sends it in the prompt: servers that turn the schema into a
        grammar never show the schema, and so its descriptions, to the model.
        """
        found = self._cache.get("field_descriptions")
        if found is None:
            properties = self.json_schema().get("properties", {})
            lines = [
                f"- {name}: {spec['description']}"
                for name, spec in properties.items()
                if isinstance(spec, Mapping) and spec.get("description")
            ]
            found = self._cache["field_descriptions"] = (
                "The fields of your answer:\n" + "\n".join(lines) if lines else ""
            )
        return str(found)

    def render_instructions(self, *, with_tools: bool = False) -> str:
        """The prompt text asking for JSON with the schema, compact (the ``prompted_json``
        rung, and the note re-asking for it). `instructions` are not part of it: the step's
        prompt carries them.

        Args:
            with_tools: the model may call tools first, so the JSON is its final answer.
        """
        schema = self._cache.get("schema_text")
        if schema is None:
            schema = json.dumps(self.json_schema(), separators=(",", ":"), ensure_ascii=False)
            self._cache["schema_text"] = schema
        lead = "When you have the final answer, reply" if with_tools else "Reply"
        return f"{lead} with only a JSON object that matches this JSON Schema:\n{schema}"

    def validate_json(self, text: str) -> OutputT:
        """Validate a reply's text: bare JSON, fenced, in prose, or trivially broken.

        Raises:
            OutputValidationError: with a short message for the model about what was wrong.
        """
        target = self._target
        if target.adapter is not None:
            try:
                value: OutputT = target.adapter.validate_json(text)  # no `cast` call: hot path
                return value
            except Exception:
                pass  # Not clean JSON of the right shape: extract, then report real errors.
        return self.validate_python(extract_json(text))

    def validate_python(self, value: Any) -> OutputT:
        """Validate an already-parsed value (e.g. the arguments of an output tool call)."""
        target = self._target
        checked: OutputT
        if target.adapter is None:
            checked = self._validate_with_schema(target.schema, value)
            return checked
        from pydantic import ValidationError

        try:
            checked = target.adapter.validate_python(value)
            return checked
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            lines = [
                f"{'.'.join(str(p) for p in err['loc']) or 'output'}: {err['msg']}"
                for err in errors[:_MAX_ERRORS_IN_NOTE]
            ]
            raise OutputValidationError(_note(lines, len(errors))) from None

    def _validate_with_schema(self, schema: Mapping[str, Any], value: Any) -> Any:
        validator = self._cache.get("validator")
        if validator is None:
            import jsonschema

            validator = jsonschema.Draft202012Validator(schema)
            self._cache["validator"] = validator
        errors = list(validator.iter_errors(value))
        if errors:
            lines = [
                f"{'.'.join(str(p) for p in err.absolute_path) or 'output'}: {err.message}"
                for err in errors[:_MAX_ERRORS_IN_NOTE]
            ]
            raise OutputValidationError(_note(lines, len(errors)))
        return value


def _note(lines: list[str], count: int) -> str:
    more = f" (and {count - len(lines)} more)" if count > len(lines) else ""
    return "Your output did not match the required schema: " + "; ".join(lines) + more + "."
