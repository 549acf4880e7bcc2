"""The error a recipe file raises: every problem found, each with file, line, step and field."""

from __future__ import annotations

from collections.abc import Sequence

from minions.errors import MinionsError
from minions.recipes.source import Problem

__all__ = ["InputError", "RecipeError"]


class RecipeError(MinionsError):
    """A recipe is invalid. `problems` holds every problem found, not just the first."""

    what = "recipe"

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = "1 problem" if count == 1 else f"{count} problems"
        super().__init__(f"invalid {self.what} ({head}):\n" + "\n".join(f"  {p}" for p in problems))


class InputError(RecipeError):
    """A run's inputs do not match what the recipe declares (nothing has run)."""

    what = "inputs"
