"""Loading a YAML recipe file into a checked `RecipeSpec`, with every error located."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from minions._yaml import Located, collector_paused, load_yaml
from minions.errors import InputError, Problem, RecipeError, did_you_mean
from minions.recipes._schema import MODEL_TAGS, InputSpec, RecipeSpec, StepSpec

__all__ = ["parse_spec"]


def load_spec(path: str | Path) -> tuple[RecipeSpec, Located]:
    """Read and check a recipe file.

    Raises:
        RecipeError: every problem, each naming the file, line, step and field.
    """
    return parse_spec(read_recipe_text(path), file=str(path))


def read_recipe_text(path: str | Path) -> str:
    """A recipe file's text.

    Raises:
        RecipeError: the file is missing, unreadable, not a regular file, larger than
            `MAX_RECIPE_BYTES` or not UTF-8.
    """
    from minions._files import UnreadableFileError, read_text_file

    try:
        return read_text_file(path, limit=MAX_RECIPE_BYTES, what="the recipe", pipes=True)
    except UnreadableFileError as exc:
        message = "no such recipe file" if exc.missing else str(exc)
        raise RecipeError([Problem(message=message, file=str(path))]) from None


MAX_RECIPE_BYTES = 64 << 20
"""The largest recipe file read (a 20,000-step recipe is a few MiB): a bigger one is refused,
like `/dev/zero` or a folder. A pipe is read (``minions run <(generate-recipe)``)."""


def parse_spec(text: str, *, file: str = "") -> tuple[RecipeSpec, Located]:
    """Check recipe YAML text against the recipe format, without building the recipe: no
    tools module is imported and no step is made (`parse_recipe` builds one).

    Returns the recipe as data and where each of its keys is in `text` (`Located.line`). Give
    both to ``load_recipe_file(path, text=text, parsed=...)`` to build the recipe without
    checking the text again.

    Args:
        text: the YAML text of a recipe.
        file: the file it came from, named in problems (``""``: none).

    Raises:
        RecipeError: every problem of the format, each with its line, step and field (the
            rules of a whole recipe, such as unknown ids in ``depends_on``, are checked when
            it is built).
    """
    with collector_paused(text):
        spec, located, problems = check_spec(text, file=file)
    if problems or spec is None:
        raise RecipeError(problems)
    return spec, located


def check_spec(text: str, *, file: str = "") -> tuple[RecipeSpec | None, Located, list[Problem]]:
    """Check recipe YAML text against the recipe format, and say every problem, by line.

    With problems, the spec returned is the recipe as far as it could be read: a bad field
    left out, a step that breaks a rule checked as the kind it has first (an agent step with
    no goal when it has none), a step or recipe without a usable id given one of its own;
    so that the checks that need a spec (references, templates, tools) find the problems of
    every step in the same pass. ``None`` when that is not enough (``steps`` itself is bad).

    Raises:
        RecipeError: the text is not YAML, or not a mapping.
    """
    from pydantic import ValidationError

    located = load_yaml(text, file)
    if not isinstance(located.data, Mapping):
        raise RecipeError(
            [Problem(message="a recipe must be a mapping with id and steps", file=file, line=1)]
        )
    problems: dict[Problem, None] = {}  # in the order found, each once
    salvage = _Salvage(located.data)
    for _ in range(_SALVAGES):
        try:
            return RecipeSpec.model_validate(salvage.data), located, by_line(problems)
        except ValidationError as exc:
            errors = [(tuple(_location(err)), err) for err in exc.errors(include_url=False)]
        for loc, err in errors:
            if not salvage.made_here(loc, err):
                problems.setdefault(_problem(err, loc, located))
        changed = [salvage.change(loc, err) for loc, err in errors]  # every one, then:
        if not all(changed):
            return None, located, by_line(problems)
    return None, located, by_line(problems)


_SALVAGES = 8
"""Rounds of checking what is left (a field left out, or a rule of a step, may uncover
another: pydantic checks a step's rules once its fields are valid, one rule at a time)."""

STAND_IN_RECIPE_ID = "recipe"
"""The id a recipe whose own is bad is checked under (its problem is reported)."""


def by_line(problems: Iterable[Problem]) -> list[Problem]:
    """The problems in the order of their lines (those without one first)."""
    return sorted(problems, key=lambda p: p.line or 0)


class _Salvage:
    """A recipe's data as far as it can be read: what the check changed in its copy (left
    out, or put in) so that the next round of the check meets the other problems."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.changed: set[tuple[Any, ...]] = set()
        """The paths left out or put in."""
        self._copied = False
        self._ids: set[Any] | None = None

    def made_here(self, loc: tuple[Any, ...], err: Any) -> bool:
        """Whether an error is about what the check changed, not about the recipe ("is
        required" for a field it left out, "it has none" for a step whose only kind was
        unreadable)."""
        if loc in self.changed:
            return True
        about = (err.get("ctx") or {}).get("about", ())
        return any((*loc, name) in self.changed for name in about)

    def change(self, loc: tuple[Any, ...], err: Any) -> bool:
        """Change the data so that the next round meets no error at `loc`: leave the bad value
        out (or the nearest field around it that is not required), follow a step's rule, or
        stand an id in. False when nothing can be changed (the same error would come back)."""
        if not self._copied:  # the caller's data stays as it was read
            self.data, self._copied = copy.deepcopy(self.data), True
        if loc[:1] == ("id",):
            return self._put(self.data, (), "id", STAND_IN_RECIPE_ID)
        steps = self.data.get("steps")
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            if not isinstance(steps, list) or loc[1] >= len(steps):
                return False
            index, inner = loc[1], loc[2:]
            step, where = steps[index], loc[:2]
            if not isinstance(step, dict):
                steps[index] = {"id": self._stand_in_id(index), "goal": "(not a step)"}
                return True
            if not inner:
                rule = err.get("ctx") or {}
                left = [self._drop(step, where, name) for name in rule.get("leave_out", ())]
                put = [self._put(step, where, k, v) for k, v in rule.get("put", {}).items()]
                return any(left) or any(put)
            if inner[0] == "id":
                return self._put(step, where, "id", self._stand_in_id(index))
            return self._leave_out(loc, keep=3)
        return self._leave_out(loc, keep=1)

    def _stand_in_id(self, index: int) -> str:
        """An id for step `index` that no step has (its own is missing or bad)."""
        if self._ids is None:
            steps = self.data.get("steps")
            self._ids = {s.get("id") for s in steps if isinstance(s, dict)}
        stand_in = f"step-{index + 1}"
        while stand_in in self._ids:
            stand_in += "_"
        self._ids.add(stand_in)
        return stand_in

    def _put(self, mapping: dict[Any, Any], where: tuple[Any, ...], key: str, value: Any) -> bool:
        if key in mapping and mapping[key] == value:
            return False
        mapping[key] = value
        self.changed.add((*where, key))
        return True

    def _drop(self, mapping: dict[Any, Any], where: tuple[Any, ...], key: str) -> bool:
        if key not in mapping:
            return False
        del mapping[key]
        self.changed.add((*where, key))
        return True

    def _leave_out(self, loc: tuple[Any, ...], *, keep: int) -> bool:
        """Delete the value at `loc`, or the nearest mapping key around it that was not
        left out already (so is not required), but none of the first `keep` parts of
        `loc`."""
        for end in range(len(loc), keep - 1, -1):
            path = loc[:end]
            if path in self.changed:
                continue
            parent = _at(self.data, path[:-1])
            if isinstance(parent, dict) and path[-1] in parent:
                return self._drop(parent, path[:-1], path[-1])
        return False


def _at(data: Any, path: Sequence[Any]) -> Any:
    """The value at `path` in `data`, or None when there is none."""
    for part in path:
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not in_list and not (isinstance(data, dict) and part in data):
            return None
        data = data[part]
    return data


def _location(err: Any) -> list[Any]:
    """A validation error's location in the data (pydantic's validator and union-branch
    names taken out)."""
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    return [p for p in loc if p not in ("mapping", "bool", *MODEL_TAGS)]


def _step_of(located: Located, loc: Sequence[Any]) -> tuple[str | None, list[Any]]:
    """The step id a location is in, and the location inside the step."""
    if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
        return step_label(located, loc[1]), list(loc[2:])
    return None, list(loc)


def step_label(located: Located, index: int) -> str | None:
    """How problems name the step at `index` of the file: its id as written, or ``#N`` when
    it has none."""
    steps = located.data.get("steps") if isinstance(located.data, Mapping) else None
    if not isinstance(steps, list) or index >= len(steps):
        return None
    raw = steps[index].get("id") if isinstance(steps[index], Mapping) else None
    label = str(raw) if raw is not None else f"#{index + 1}"
    if len(label) > 80:  # an id too long to be one: enough of it to find it
        label = f"{label[:60]}..."
    return label


def _problem(err: Any, loc: Sequence[Any], located: Located) -> Problem:
    step, inner = _step_of(located, loc)
    field_path = ".".join(str(p) for p in inner) or None
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        name = str(inner[-1] if inner else loc[-1])
        message = f"unknown field {name!r}{_suggest(name, inner, step)}"
    elif err["type"] == "missing":
        message = "is required"
    line = located.line(loc)
    return Problem(message=message, file=located.file, line=line, step=step, field=field_path)


def _suggest(name: str, inner: Sequence[Any], step: str | None) -> str:
    if step is not None and len(inner) == 1:
        return _closest(name, "step")
    if not inner or len(inner) == 1:
        return _closest(name, "recipe")
    return ""


@functools.lru_cache(maxsize=256)
def _closest(name: str, of: str) -> str:
    """`did_you_mean` among the fields of a step or a recipe (a recipe may repeat one
    misspelling thousands of times)."""
    known = StepSpec.model_fields if of == "step" else RecipeSpec.model_fields
    return did_you_mean(name, list(known))


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
