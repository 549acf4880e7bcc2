"""Datasets and cases, as values: what `evaluate` runs."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions.errors import Problem, RecipeError
from minions.evals._checks import Check, ExpectedCheck, as_check
from minions.evals._run import CaseRun

if TYPE_CHECKING:
    from minions.recipes import AgentRecipe

__all__ = ["Case", "Dataset", "DatasetError", "Target"]

CASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A case id: a name a file may have (recordings are kept by it)."""

MAX_REPEAT = 1000


class DatasetError(RecipeError):
    """A dataset is invalid. `problems` holds every problem found, each with the file, the
    line and the field."""

    what = "dataset"


class _NotGiven:
    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()
"""`Case.expected` when the case expects no particular output (``None`` is a value)."""


def case_id_problem(case_id: object) -> str | None:
    if not isinstance(case_id, str) or CASE_ID.fullmatch(case_id) is None:
        return (
            f"case id {case_id!r} must be 1 to 128 letters, digits, '_', '.' or '-', starting "
            "with a letter or a digit"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class Case:
    """One task of a dataset: inputs, the output expected (optional) and checks.

    Args:
        id: the case's name in reports (and for its recordings): letters, digits, ``_``,
            ``.`` and ``-``.
        inputs: the run's inputs, over the dataset's `Dataset.inputs`.
        expected: the output expected: equal, or for an object a subset (every key given is
            equal, deeply). Not given: any output will do.
        checks: `Check` objects, or functions of the `CaseRun` (see `FunctionCheck`).
        repeat: runs of this case (the dataset's `repeat` by default).
        description: what the case is about.
        line: its line in the dataset file.

    Raises:
        ValueError: the id or `repeat` is not valid.
    """

    id: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    expected: Any = NOT_GIVEN
    checks: Sequence[Check | Callable[[CaseRun], Any]] = ()
    repeat: int | None = None
    description: str = ""
    line: int | None = None

    def __post_init__(self) -> None:
        problem = case_id_problem(self.id)
        if problem:
            raise ValueError(problem)
        if self.repeat is not None and not 1 <= self.repeat <= MAX_REPEAT:
            raise ValueError(f"case {self.id!r}: repeat must be 1 to {MAX_REPEAT}")
        object.__setattr__(self, "checks", tuple(as_check(c) for c in self.checks))
        object.__setattr__(self, "inputs", dict(self.inputs))

    @property
    def has_expected(self) -> bool:
        return self.expected is not NOT_GIVEN

    def all_checks(self, shared: Sequence[Check] = ()) -> tuple[Check, ...]:
        """The checks of a run of this case: the expected output, the dataset's checks, then
        its own."""
        own: tuple[Check, ...] = tuple(self.checks)  # type: ignore[arg-type]
        expected = (ExpectedCheck(self.expected),) if self.has_expected else ()
        return (*expected, *shared, *own)


@dataclass(frozen=True, kw_only=True)
class Target:
    """A recipe a dataset's cases run on.

    Attributes:
        id: the recipe's id (cases are reported under it when a dataset has several).
        recipe: the recipe.
        path: its file, for a recipe from YAML.
    """

    id: str
    recipe: AgentRecipe
    path: Path | None = None


def _target(given: Any, base: Path | None) -> Target:
    from minions._step.step import Step
    from minions.recipes import AgentRecipe

    if isinstance(given, Target):
        return given
    if isinstance(given, AgentRecipe):
        source = getattr(given.source, "path", None)
        return Target(id=given.id, recipe=given, path=source)
    if isinstance(given, Step):
        return Target(id=given.id, recipe=AgentRecipe(id=given.id, steps=[given]))
    if isinstance(given, str | Path):
        from minions.recipes import load_recipe_file

        path = Path(given)
        if base is not None and not path.is_absolute():
            path = base / path
        loaded = load_recipe_file(path)
        return Target(id=loaded.recipe.id, recipe=loaded.recipe, path=path)
    raise TypeError(f"a target must be a recipe, a step or a recipe file, not {given!r}")


class Dataset:
    """Cases to run on a target recipe (or several), each repeated.

    Args:
        target: the recipe the cases run on: an `AgentRecipe`, a `Step` (run as a one-step
            recipe), a recipe file, or a list of these (every case runs on each).
        cases: the cases.
        name: the dataset's name in reports (the file's name, for one loaded from YAML).
        inputs: inputs every case has (a case's own win).
        repeat: runs of each case (a case may say otherwise).
        checks: checks of every case, after its expected output and before its own.
        judge_model: the model that grades `JudgeCheck` rubrics, unless the eval names one.
        path: the dataset's file.

    Raises:
        DatasetError: no case, two cases with one id, or `repeat` out of range.
        RecipeError: a recipe file is invalid.
    """

    def __init__(
        self,
        target: Any,
        cases: Iterable[Case],
        *,
        name: str | None = None,
        inputs: Mapping[str, Any] | None = None,
        repeat: int = 1,
        checks: Sequence[Check | Callable[[CaseRun], Any]] = (),
        judge_model: str | None = None,
        path: str | Path | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        base = self.path.parent if self.path is not None else None
        given = target if isinstance(target, list | tuple) else [target]
        self.targets: tuple[Target, ...] = tuple(_target(t, base) for t in given)
        self.cases: tuple[Case, ...] = tuple(cases)
        self.inputs: dict[str, Any] = dict(inputs or {})
        self.repeat = repeat
        self.checks: tuple[Check, ...] = tuple(as_check(c) for c in checks)
        self.judge_model = judge_model
        self.name = name or (
            self.path.name.split(".")[0] if self.path is not None else self.targets[0].id
        )
        problems = []
        if not self.targets:
            problems.append("a dataset needs a target recipe")
        if not self.cases:
            problems.append("a dataset needs at least one case")
        if not 1 <= repeat <= MAX_REPEAT:
            problems.append(f"repeat must be 1 to {MAX_REPEAT}, got {repeat}")
        seen: set[str] = set()
        for case in self.cases:
            if case.id in seen:
                problems.append(f"two cases have the id {case.id!r}")
            seen.add(case.id)
        ids = [t.id for t in self.targets]
        if len(set(ids)) != len(ids):
            problems.append(f"two targets have one id: {', '.join(ids)}")
        if problems:
            file = str(self.path or "")
            raise DatasetError([Problem(message=p, file=file) for p in problems])

    @property
    def target(self) -> str:
        """The targets' ids, joined with ``, ``."""
        return ", ".join(t.id for t in self.targets)

    def repeats(self, case: Case, override: int | None = None) -> int:
        """Runs of `case`: `override` (``--repeat``), else its own, else the dataset's."""
        if override is not None:
            return override
        return case.repeat if case.repeat is not None else self.repeat

    def inputs_of(self, case: Case) -> dict[str, Any]:
        """A case's inputs over the dataset's."""
        return {**self.inputs, **case.inputs}

    def input_problems(self) -> list[Problem]:
        """Each case's inputs checked against each target's declared inputs."""
        from minions.errors import InputError

        problems = []
        for target in self.targets:
            for case in self.cases:
                try:
                    target.recipe.check_inputs(self.inputs_of(case))
                except InputError as exc:
                    for problem in exc.problems:
                        problems.append(
                            Problem(
                                message=f"inputs do not fit recipe {target.id!r}: "
                                f"{problem.message}",
                                file=str(self.path or ""),
                                line=case.line,
                                field=f"cases[{case.id}].inputs",
                            )
                        )
        return problems

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, target={self.target!r}, cases={len(self.cases)})"
