"""Datasets from YAML: checked with pydantic, every problem named by file, line and field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from minions.errors import Problem, RecipeError, did_you_mean
from minions.evals._checks import (
    Check,
    ExprCheck,
    FunctionCheck,
    JudgeCheck,
    ToolExpectation,
    TrajectoryCheck,
)
from minions.evals._dataset import MAX_REPEAT, NOT_GIVEN, Case, Dataset, DatasetError

__all__ = ["load_dataset", "parse_dataset"]

CHECK_KINDS = ("expr", "trajectory", "judge", "python")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_Spec = TypeVar("_Spec", bound=_Strict)


class ToolSpec(_Strict):
    name: str = Field(min_length=1)
    args: dict[str, Any] | None = None


class TrajectorySpec(_Strict):
    tools: list[str | ToolSpec] | None = None
    steps: list[str] | None = None
    order: Literal["exact", "in_order", "any", "subset", "superset"] = "in_order"
    max_model_calls: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    max_seconds: float | None = Field(default=None, gt=0)
    no_repeated_calls: bool = False


class CheckSpec(_Strict):
    name: str | None = None
    expr: str | None = None
    trajectory: TrajectorySpec | None = None
    judge: str | None = None
    python: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> CheckSpec:
        kinds = [k for k in CHECK_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            given = f"it has {', '.join(kinds)}" if kinds else "it has none"
            raise ValueError(f"a check has exactly one of {', '.join(CHECK_KINDS)} ({given})")
        return self


class CaseSpec(_Strict):
    id: str
    description: str = ""
    inputs: dict[str, Any] = Field(default_factory=dict)
    expected: Any = None
    checks: list[Any] = Field(default_factory=list)
    """Each checked on its own (`CheckSpec`), so every bad check is said at once."""
    repeat: int | None = Field(default=None, ge=1, le=MAX_REPEAT)


class DatasetSpec(_Strict):
    name: str | None = None
    description: str = ""
    recipe: str | list[str]
    inputs: dict[str, Any] = Field(default_factory=dict)
    repeat: int = Field(default=1, ge=1, le=MAX_REPEAT)
    judge_model: str | None = None
    checks: list[Any] = Field(default_factory=list)
    cases: list[Any] = Field(min_length=1)
    """Each checked on its own (`CaseSpec`), so every bad case is said at once."""


def load_dataset(path: str | Path, *, import_code: bool = True) -> Dataset:
    """Read a dataset file (YAML): its recipes, relative to the file, are loaded and checked;
    each case's inputs are checked against them; ``python:`` scorers are imported from the
    file's folder.

    Args:
        path: the dataset file.
        import_code: import ``python:`` scorers (and the recipes' tools modules). ``False``
            runs none of the dataset's code: a ``python:`` check is then a problem (the
            service never imports a module because of a request).

    Raises:
        DatasetError: every problem of the dataset, each with file, line and field.
        RecipeError: a recipe it names is invalid.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError([Problem(message="no such dataset file", file=str(path))]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError([Problem(message=f"cannot read: {exc}", file=str(path))]) from None
    return parse_dataset(text, path=file, import_code=import_code)


def parse_dataset(text: str, *, path: str | Path, import_code: bool = True) -> Dataset:
    """A dataset from YAML `text`, as the file `path` (see `load_dataset`)."""
    from minions._yaml import load_yaml

    file = Path(path)
    try:
        located = load_yaml(text, str(path))
    except RecipeError as exc:
        raise DatasetError(exc.problems) from None
    if not isinstance(located.data, Mapping):
        message = "a dataset must be a mapping with recipe and cases"
        raise DatasetError([Problem(message=message, file=str(path), line=1)])
    problems: list[Problem] = []

    def problem(message: str, loc: Sequence[str | int]) -> None:
        problems.append(
            Problem(
                message=message, file=str(path), line=located.line(loc), field=_field(loc, located)
            )
        )

    spec = _valid(DatasetSpec, located.data, (), located, problems)
    if spec is None:
        raise DatasetError(_sorted(problems))
    shared = _checks(spec.checks, ("checks",), file.parent, import_code, problem, located, problems)
    cases = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(spec.cases):
        loc: tuple[str | int, ...] = ("cases", index)
        case = _valid(CaseSpec, raw, loc, located, problems)
        if case is None:
            continue
        if case.id in seen:
            problem(
                f"two cases have the id {case.id!r} (case {seen[case.id] + 1} too)", (*loc, "id")
            )
            continue
        seen[case.id] = index
        checks = _checks(
            case.checks, (*loc, "checks"), file.parent, import_code, problem, located, problems
        )
        try:
            cases.append(
                Case(
                    id=case.id,
                    inputs=case.inputs,
                    expected=case.expected if "expected" in raw else NOT_GIVEN,
                    checks=checks,
                    repeat=case.repeat,
                    description=case.description,
                    line=located.line(loc),
                )
            )
        except ValueError as exc:
            problem(str(exc), (*loc, "id"))
    if problems:
        raise DatasetError(_sorted(problems))
    recipes = spec.recipe if isinstance(spec.recipe, list) else [spec.recipe]
    targets = []
    for index, recipe in enumerate(recipes):
        recipe_path = file.parent / recipe
        where: tuple[str | int, ...] = (
            ("recipe", index) if isinstance(spec.recipe, list) else ("recipe",)
        )
        if not recipe_path.is_file():
            problem(f"no recipe file {str(recipe_path)!r}", where)
            continue
        from minions.recipes import load_recipe_file

        targets.append(load_recipe_file(recipe_path, import_tools=import_code).recipe)
    for target in targets:
        _check_steps(target, spec, problem)
    if problems:
        raise DatasetError(_sorted(problems))
    dataset = Dataset(
        targets,
        cases,
        name=spec.name or file.name.split(".")[0],
        inputs=spec.inputs,
        repeat=spec.repeat,
        checks=shared,
        judge_model=spec.judge_model,
        path=file,
    )
    found = dataset.input_problems()
    if found:
        raise DatasetError(found)
    return dataset


def _check_steps(recipe: Any, spec: DatasetSpec, problem: Any) -> None:
    """Each step a trajectory names is a step of the recipe."""
    known = [step.id for step in recipe.steps]
    places: list[tuple[tuple[str | int, ...], Any]] = [
        (("checks", i), raw) for i, raw in enumerate(spec.checks)
    ]
    for c, case in enumerate(spec.cases):
        if isinstance(case, Mapping):
            places += [
                (("cases", c, "checks", i), raw) for i, raw in enumerate(case.get("checks") or [])
            ]
    for loc, raw in places:
        trajectory = raw.get("trajectory") if isinstance(raw, Mapping) else None
        steps = trajectory.get("steps") if isinstance(trajectory, Mapping) else None
        for step in steps if isinstance(steps, list) else []:
            if step not in known:
                problem(
                    f"step {step!r} is not a step of recipe {recipe.id!r}"
                    f"{did_you_mean(str(step), known)}",
                    (*loc, "trajectory"),
                )


def _valid(
    model: type[_Spec], data: Any, at: tuple[str | int, ...], located: Any, problems: list[Problem]
) -> _Spec | None:
    """`data` as a `model`, or ``None`` with its problems added."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for found in _problems(exc, located, at):
            if found not in problems:
                problems.append(found)
        return None


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: p.line or 0)


def _checks(
    raws: Sequence[Any],
    at: tuple[str | int, ...],
    folder: Path,
    import_code: bool,
    problem: Any,
    located: Any,
    problems: list[Problem],
) -> list[Check]:
    checks: list[Check] = []
    for index, raw in enumerate(raws):
        loc = (*at, index)
        spec = _valid(CheckSpec, raw, loc, located, problems)
        if spec is None:
            continue
        try:
            if spec.expr is not None:
                checks.append(ExprCheck(spec.expr, name=spec.name))
            elif spec.trajectory is not None:
                t = spec.trajectory
                tools = None
                if t.tools is not None:
                    tools = [
                        ToolExpectation(name=x)
                        if isinstance(x, str)
                        else ToolExpectation(name=x.name, args=x.args)
                        for x in t.tools
                    ]
                checks.append(
                    TrajectoryCheck(
                        tools=tools,
                        steps=t.steps,
                        order=t.order,
                        max_model_calls=t.max_model_calls,
                        max_tokens=t.max_tokens,
                        max_seconds=t.max_seconds,
                        no_repeated_calls=t.no_repeated_calls,
                        name=spec.name,
                    )
                )
            elif spec.judge is not None:
                checks.append(JudgeCheck(spec.judge, name=spec.name))
            elif spec.python is not None:
                if not import_code:
                    problem(
                        f"python check {spec.python!r}: scorers run only from the command line "
                        "or Python (this dataset is loaded without importing its code)",
                        (*loc, "python"),
                    )
                    continue
                checks.append(
                    FunctionCheck(
                        scorer(spec.python, folder), name=spec.name or f"python: {spec.python}"
                    )
                )
        except ValueError as exc:
            kind = next(
                k for k in ("expr", "trajectory", "judge", "python") if getattr(spec, k) is not None
            )
            problem(str(exc), (*loc, kind))
    return checks


def scorer(reference: str, folder: Path) -> Any:
    """The function ``module:function`` names, its module imported from `folder` (else
    installed).

    Raises:
        ValueError: the reference is malformed, the module cannot be imported, or it has no
            such function.
    """
    from minions._imports import import_module
    from minions.errors import MinionsError

    module_name, colon, function_name = reference.partition(":")
    if not colon or not module_name or not function_name.isidentifier():
        raise ValueError(
            f"python check {reference!r} must be module:function, e.g. scorers:check_city"
        )
    try:
        module = import_module(module_name, folder)
    except MinionsError as exc:
        raise ValueError(f"python check {reference!r}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        hint = did_you_mean(function_name, names)
        raise ValueError(
            f"python check {reference!r}: {module_name} has no function {function_name!r}{hint}"
        )
    return function


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The spec model of the mapping at `loc` (a location in the dataset's data)."""
    model: type[BaseModel] | None = DatasetSpec
    parts = list(loc)
    while parts and model is not None:
        part = parts.pop(0)
        if model is DatasetSpec and part == "cases":
            model = CaseSpec
        elif model in (DatasetSpec, CaseSpec) and part == "checks":
            model = CheckSpec
        elif model is CheckSpec and part == "trajectory":
            model = TrajectorySpec
        elif model is TrajectorySpec and part == "tools":
            model = ToolSpec
        else:
            return None
        if parts and isinstance(parts[0], int):
            parts.pop(0)
    return model


def _field(loc: Sequence[str | int], located: Any) -> str | None:
    """A location as a field name: ``cases[france].checks[1].expr``."""
    parts: list[str] = []
    for index, part in enumerate(loc):
        if isinstance(part, int):
            name = str(part)
            if index > 0 and loc[index - 1] == "cases":
                try:
                    raw = located.data["cases"][part].get("id")
                except (AttributeError, IndexError, KeyError, TypeError):
                    raw = None
                name = str(raw) if isinstance(raw, str | int) else str(part + 1)
            elif index > 0:
                name = str(part + 1)
            parts[-1] = f"{parts[-1]}[{name}]" if parts else f"[{name}]"
        else:
            parts.append(str(part))
    return ".".join(parts) or None


def _problems(
    error: ValidationError, located: Any, at: tuple[str | int, ...] = ()
) -> list[Problem]:
    problems = []
    for err in error.errors(include_url=False):
        loc = [
            *at,
            *(
                p
                for p in err["loc"]
                if not (
                    isinstance(p, str)
                    and (p.startswith("function-") or p[:1].isupper() or p in ("str", "list[str]"))
                )
            ),
        ]
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            name = str(loc[-1])
            model = _model_at(loc[:-1])
            known = list(model.model_fields) if model is not None else []
            message = f"unknown key {name!r}{did_you_mean(name, known)}"
            if known:
                message += f"; known: {', '.join(known)}"
        elif err["type"] == "missing":
            message = "is required"
        problem = Problem(
            message=message, file=located.file, line=located.line(loc), field=_field(loc, located)
        )
        if problem not in problems:
            problems.append(problem)
    return sorted(problems, key=lambda p: p.line or 0)
