"""Loading a YAML recipe file into a checked `RecipeSpec`, with every error located."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from minions.errors import InputError, Problem, RecipeError, did_you_mean
from minions.recipes._schema import MODEL_TAGS, InputSpec, RecipeSpec, StepSpec
from minions.recipes._source import Located, load_yaml

__all__ = []


def load_spec(path: str | Path) -> tuple[RecipeSpec, Located]:
    """Read and check a recipe file.

    Raises:
        RecipeError: every problem, each naming the file, line, step and field.
    """
    return parse_spec(read_recipe_text(path), file=str(path))


def read_recipe_text(path: str | Path) -> str:
    """A recipe file's text.

    Raises:
        RecipeError: the file is missing, unreadable or not UTF-8.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError([Problem(message="no such recipe file", file=str(path))]) from None
    except UnicodeDecodeError as exc:
        message = f"not UTF-8 text (byte {exc.start} cannot be read); save the recipe as UTF-8"
        raise RecipeError([Problem(message=message, file=str(path))]) from None
    except OSError as exc:
        raise RecipeError([Problem(message=f"cannot read: {exc}", file=str(path))]) from None
    return text


def parse_spec(text: str, *, file: str = "") -> tuple[RecipeSpec, Located]:
    """Check recipe YAML text (see `load_spec`)."""
    spec, located, problems = check_spec(text, file=file)
    if problems or spec is None:
        raise RecipeError(problems)
    return spec, located


def check_spec(text: str, *, file: str = "") -> tuple[RecipeSpec | None, Located, list[Problem]]:
    """Check recipe YAML text against the recipe format, and say every problem, by line.

    With problems, the spec returned is the recipe without the fields that have them, so that
    the checks that need a spec (references, templates, tools) find the rest of the problems
    in the same pass; ``None`` when leaving fields out is not enough (a required one is bad).

    Raises:
        RecipeError: the text is not YAML, or not a mapping.
    """
    from pydantic import ValidationError

    located = load_yaml(text, file)
    if not isinstance(located.data, Mapping):
        raise RecipeError(
            [Problem(message="a recipe must be a mapping with id and steps", file=file, line=1)]
        )
    data = copy.deepcopy(located.data)
    problems: list[Problem] = []
    left_out: list[list[Any]] = []
    for _ in range(_SALVAGES):
        try:
            spec = RecipeSpec.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if any(_location(err) in left_out for err in errors):
                # A field left out is required: the rest cannot be checked without it (and
                # "is required" would blame the recipe for what was taken out here).
                return None, located, by_line(problems)
            problems += [p for p in _problems(exc, located) if p not in problems]
            locations = [_location(err) for err in errors]
            left_out += locations
            if all(_leave_out(data, loc) for loc in locations):
                continue
            spec = None
        return spec, located, by_line(problems)
    return None, located, by_line(problems)


_SALVAGES = 5
"""Rounds of leaving bad fields out (a field left out may uncover one in another)."""


def by_line(problems: Sequence[Problem]) -> list[Problem]:
    """The problems in the order of their lines (those without one first)."""
    return sorted(problems, key=lambda p: p.line or 0)


def _leave_out(data: Any, loc: Sequence[Any]) -> bool:
    """Delete the mapping key at `loc` in `data`; False when there is none to delete."""
    *parents, last = loc or [None]
    for part in parents:
        inside = isinstance(data, Mapping) and part in data
        if not inside and not (isinstance(data, list) and isinstance(part, int)):
            return False
        if not inside and part >= len(data):
            return False
        data = data[part]
    if isinstance(data, dict) and last in data:
        del data[last]
        return True
    return False


def _location(err: Any) -> list[Any]:
    """A validation error's location in the data (pydantic's validator and union-branch
    names taken out)."""
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    return [p for p in loc if p not in ("HttpSpec", "bool", *MODEL_TAGS)]


def _step_of(located: Located, loc: Sequence[Any]) -> tuple[str | None, list[Any]]:
    """The step id a location is in, and the location inside the step."""
    if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
        steps = located.data.get("steps") if isinstance(located.data, Mapping) else None
        step_id = None
        if isinstance(steps, list) and loc[1] < len(steps) and isinstance(steps[loc[1]], Mapping):
            raw = steps[loc[1]].get("id")
            step_id = str(raw) if raw is not None else f"#{loc[1] + 1}"
            if len(step_id) > 80:  # an id too long to be one: enough of it to find it
                step_id = f"{step_id[:60]}..."
        return step_id, list(loc[2:])
    return None, list(loc)


def _problems(error: Any, located: Located) -> list[Problem]:
    problems = []
    for err in error.errors(include_url=False):
        loc = _location(err)
        step, inner = _step_of(located, loc)
        field_path = ".".join(str(p) for p in inner) or None
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            name = str(inner[-1] if inner else loc[-1])
            message = f"unknown field {name!r}{_suggest(name, inner, step)}"
        elif err["type"] == "missing":
            message = "is required"
        line = located.line(loc)
        problems.append(
            Problem(message=message, file=located.file, line=line, step=step, field=field_path)
        )
    return problems


def _suggest(name: str, inner: Sequence[Any], step: str | None) -> str:
    if step is not None and len(inner) == 1:
        known = list(StepSpec.model_fields)
    elif not inner or len(inner) == 1:
        known = list(RecipeSpec.model_fields)
    else:
        known = []
    return did_you_mean(name, known)


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def coerce_inputs(
    specs: Mapping[str, InputSpec], given: Mapping[str, Any], *, file: str = ""
) -> dict[str, Any]:
    """Check a run's inputs against the recipe's: required ones given, types right, defaults
    filled in. Text values (from a command line) are converted to the declared type.

    Raises:
        InputError: naming every bad or missing input (a `RecipeError`).
    """
    import json

    # Each problem names its input as a field, ``inputs.NAME``; how to give one is the
    # channel's to say (a command line's ``-i NAME=VALUE``, an API body's field).
    problems: list[tuple[str, str]] = []
    result: dict[str, Any] = {}
    for name in given:
        if name not in specs:
            listing = ", ".join(specs) or "none"
            problems.append(
                (
                    name,
                    f"unknown input {name!r}{did_you_mean(name, specs)}; "
                    f"the recipe's inputs: {listing}",
                )
            )
    for name, spec in specs.items():
        required = spec.required if spec.required is not None else spec.default is None
        if name not in given:
            if required:
                about = f": {spec.description}" if spec.description else ""
                problems.append((name, f"input {name!r} is required ({spec.type}{about})"))
            else:
                result[name] = spec.default
            continue
        value = given[name]
        if isinstance(value, str) and spec.type != "string":
            try:
                value = json.loads(value, parse_constant=_not_json, parse_float=_finite)
            except ValueError:
                if spec.type == "boolean" and value.lower() in ("yes", "no", "on", "off"):
                    value = value.lower() in ("yes", "on")
        types = _PY_TYPES[spec.type]
        wrong_bool = isinstance(value, bool) and spec.type in ("integer", "number")
        if not isinstance(value, types) or wrong_bool:
            problems.append(
                (name, f"input {name!r} must be {spec.type}, got {type(value).__name__} {value!r}")
            )
            continue
        if spec.enum is not None and value not in spec.enum:
            problems.append((name, f"input {name!r} must be one of {spec.enum}, got {value!r}"))
            continue
        result[name] = value
    if problems:
        raise InputError(
            [Problem(message=m, file=file, field=f"inputs.{name}") for name, m in problems]
        )
    return result
