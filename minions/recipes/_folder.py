"""A folder of recipes, by id: its files (searched recursively, hidden folders left out, each
inside the folder once links are followed) and the recipes among its YAML files, read without
running any of their code. A service offers a folder's recipes by id; a worker finds the file
of a run's recipe by its id under its own folder (the recipes root), wherever it was on the
host that submitted the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from minions.errors import RecipeError

if TYPE_CHECKING:
    from minions.recipes._schema import RecipeSpec

__all__: list[str] = []

INLINE_SUFFIX = ".inline.yaml"
"""Where an inline recipe is taken to live, in its folder: ``<id>.inline.yaml`` (no file)."""


def recording_beside(recipe_path: str | Path) -> Path:
    """The recording a recipe file may have beside it: ``<stem>.recording.json``. `minions
    run` and workers replay it when no model is configured."""
    path = Path(recipe_path)
    return path.with_name(f"{path.stem}.recording.json")


def folder_files(folder: Path, pattern: str) -> list[Path]:
    """The files of `folder` (resolved) matching `pattern`, hidden folders left out, each
    inside the folder once links are followed."""
    found = []
    for path in sorted(folder.rglob(pattern)):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        if path.is_file() and inside(folder, path):
            found.append(path)
    return found


def inside(folder: Path, path: Path) -> bool:
    """`path` is in `folder` (resolved) once links are followed."""
    try:
        path.resolve().relative_to(folder)
    except (ValueError, OSError, RuntimeError):
        return False
    return True


def folder_recipes(folder: Path) -> Iterator[tuple[Path, RecipeSpec]]:
    """The recipes of `folder` (resolved), each file's path and recipe: its YAML files that
    parse as recipes (a recording, a config file is left out)."""
    from minions.recipes._loader import parse_spec

    for path in [*folder_files(folder, "*.yaml"), *folder_files(folder, "*.yml")]:
        try:
            spec, _ = parse_spec(path.read_text(encoding="utf-8"), file=str(path))
        except (RecipeError, OSError, UnicodeDecodeError):
            continue
        yield path, spec


class RecipeFolder:
    """Finds a recipe's file by id under a folder. What it found is kept, and the folder read
    again when an id is unknown or its file went away.

    Args:
        folder: the folder (made absolute).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        self._found: dict[str, Path] = {}

    def find(self, recipe_id: str) -> Path | None:
        """The file of the recipe with this id (the first in path order when several have
        it), or None."""
        found = self._found.get(recipe_id)
        if found is None or not found.is_file():
            paths: dict[str, Path] = {}
            for path, spec in folder_recipes(self.folder):
                paths.setdefault(spec.id, path)
            self._found = paths
            found = paths.get(recipe_id)
        return found
