"""The server's recipes: the YAML files of its ``--recipes`` folder, by recipe id, and the
check that keeps an inline recipe to the code, files and hosts the server already trusts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from minions._step.step import recipe_id_problem
from minions.errors import MinionsError, Problem, RecipeError
from minions.recipes import RecipeSpec
from minions.recipes._internal import INLINE_SUFFIX, HttpSpec, folder_files, folder_recipes

__all__: list[str] = []

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class RecipeEntry:
    """One recipe the server offers."""

    id: str
    path: Path
    description: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    """A JSON Schema of the run's inputs."""


def inputs_schema(specs: dict[str, Any]) -> dict[str, Any]:
    """The recipe's declared inputs as a JSON Schema object."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in specs.items():
        prop: dict[str, Any] = {"type": spec.type}
        if spec.description:
            prop["description"] = spec.description
        if spec.enum is not None:
            prop["enum"] = spec.enum
        if spec.default is not None:
            prop["default"] = spec.default
        properties[name] = prop
        if spec.required if spec.required is not None else spec.default is None:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


class RecipeCatalog:
    """The recipes of a folder (searched recursively, hidden folders left out), read without
    running any of their code; a file that does not parse is left out and logged.

    `start` also resolves, once, what an inline recipe may name: the tools modules (``.py``
    files) and the recipe files of the folder, as absolute paths that stay inside it (a
    symbolic link leading out is left out). Nothing a request sends changes them.

    Args:
        folder: the folder (None: the server offers no recipes).
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder.resolve() if folder is not None else None
        self._entries: dict[str, RecipeEntry] = {}
        self.modules: dict[str, Path] = {}
        """Tools modules an inline recipe may name (``pkg.mod``), by name."""
        self.includes: frozenset[str] = frozenset()
        """Recipe files an inline recipe may include, as normalized absolute paths."""

    def start(self) -> None:
        """Read the folder: its recipes, its tools modules and its recipe files."""
        self.scan()
        if self.folder is None:
            return
        for path in self._files("*.py"):
            parts = path.relative_to(self.folder).with_suffix("").parts
            if all(p.isidentifier() and p != "__init__" for p in parts):
                self.modules[".".join(parts)] = path
        yaml = [*self._files("*.yaml"), *self._files("*.yml")]
        self.includes = frozenset(os.path.normpath(p) for p in yaml)

    def _files(self, pattern: str) -> list[Path]:
        assert self.folder is not None
        return folder_files(self.folder, pattern)

    def scan(self) -> dict[str, RecipeEntry]:
        entries: dict[str, RecipeEntry] = {}
        if self.folder is None:
            return entries
        for path, spec in folder_recipes(self.folder):
            if spec.id in entries:
                log.warning("duplicate recipe id", id=spec.id, kept=str(entries[spec.id].path))
                continue
            entries[spec.id] = RecipeEntry(
                id=spec.id,
                path=path,
                description=spec.description,
                inputs=inputs_schema(dict(spec.inputs)),
            )
        self._entries = entries
        return entries

    def find(self, recipe_id: str) -> RecipeEntry | None:
        """The recipe with this id (the folder is read again when it is not known yet)."""
        found = self._entries.get(recipe_id)
        if found is None or not found.path.is_file():
            found = self.scan().get(recipe_id)
        return found

    def inline_path(self, recipe_id: str) -> Path:
        """Where an inline recipe is taken to live, ``<folder>/<id>.inline.yaml`` (its tools
        modules and included recipes are found beside it): derived from the server's folder
        (or its current directory without one) and a slug, and checked to stay there.

        Raises:
            RecipeError: the id is not a slug.
        """
        base = self.folder or Path.cwd().resolve()
        path = base / f"{recipe_id}{INLINE_SUFFIX}"
        if recipe_id_problem(recipe_id) is not None or path.parent != base:
            raise RecipeError([Problem(message=str(recipe_id_problem(recipe_id)), field="id")])
        return path


class Catalogs:
    """The recipes each project is offered: its own folder's (`ServiceConfig.project_recipes`),
    or the server's (`ServiceConfig.recipes`).

    Args:
        shared: the server's folder's, for every project without its own.
        own: the folders' of the projects that have their own.
    """

    def __init__(self, shared: RecipeCatalog, own: Mapping[str, RecipeCatalog]) -> None:
        self.shared = shared
        self.own = dict(own)

    def of(self, project: str) -> RecipeCatalog:
        """The recipes `project` is offered."""
        return self.own.get(project, self.shared)

    def start(self) -> None:
        for catalog in (self.shared, *self.own.values()):
            catalog.start()


def check_inline(spec: RecipeSpec, catalog: RecipeCatalog, *, model: str | None) -> None:
    """Refuse an inline recipe (parsed) that could make the server run code, reach a host or
    touch a file it does not already trust: its ``tools:`` must be modules of the recipes
    folder (as `RecipeCatalog.start` found them), its sub-recipes files of that folder; it
    may not choose its ``workspace:``, widen ``http`` to ``allowed_hosts``, declare MCP
    servers (a command to start, a host to call) or name a model served elsewhere than the
    server's own `model` (another endpoint would receive the server's API key). Built-in
    tools are always allowed. Nothing is imported, and no file is read.

    Raises:
        RecipeError: the recipe names something the server does not offer.
    """
    problems: list[Problem] = []
    folder = catalog.folder
    where = "the server's recipes folder" if folder is not None else "none (no --recipes)"
    for index, reference in enumerate(spec.tools):
        module = reference.partition(":")[0]
        if module not in catalog.modules:
            problems.append(
                Problem(
                    message=f"an inline recipe may name only tools modules of the server's "
                    f"recipes folder ({where}); {module!r} is not one",
                    field=f"tools.{index}",
                )
            )
    for step in spec.steps:
        if step.recipe is None:
            continue
        if folder is None or os.path.normpath(folder / step.recipe) not in catalog.includes:
            problems.append(
                Problem(
                    message=f"an inline recipe may include only recipes of the server's "
                    f"recipes folder; {step.recipe!r} is not one",
                    step=step.id,
                    field="recipe",
                )
            )
    if spec.workspace is not None:
        problems.append(
            Problem(
                message="an inline recipe cannot choose its workspace; leave `workspace` out",
                field="workspace",
            )
        )
    if isinstance(spec.http, HttpSpec) and spec.http.allowed_hosts:
        # The hosts http_get may reach beyond public addresses are the server's to choose.
        problems.append(
            Problem(
                message="an inline recipe cannot allow hosts to http_get (`allowed_hosts`); "
                "`http: true` reaches public addresses only",
                field="http.allowed_hosts",
            )
        )
    if spec.mcp_servers:
        # A stdio server is a program the server would start; an HTTP one, a host it would
        # call: neither is the request's to choose.
        problems.append(
            Problem(
                message="an inline recipe cannot declare MCP servers (a stdio server is a "
                "command the server would run); put the recipe in the recipes folder",
                field="mcp_servers",
            )
        )
    problems += _model_problems(spec, model)
    if problems:
        raise RecipeError(problems)
    catalog.inline_path(spec.id)


def _model_problems(spec: RecipeSpec, model: str | None) -> list[Problem]:
    """An inline recipe's models must be served where the server's own model is: the same
    provider, and the same base URL (none, or the very one the server's names)."""
    from minions.models._internal import model_endpoint

    own = model_endpoint(model) if model is not None else None
    problems = []
    named: list[tuple[str | None, str | list[str] | None]] = [(None, spec.model)]
    named += [(step.id, step.model) for step in spec.steps]
    # Each model of a fallback list is a model the server would call.
    each = [
        (step_id, name)
        for step_id, names in named
        for name in (names if isinstance(names, list) else [names])
    ]
    for step_id, name in each:
        if name is None or model_endpoint(name) == own:
            continue
        served = (
            f"the server's model is served by {own[0]!r}" + (f" at {own[1]}" if own[1] else "")
            if own is not None
            else "the server names no model (MINIONS_MODEL)"
        )
        problems.append(
            Problem(
                message=f"an inline recipe cannot choose a model endpoint: {served}, and "
                f"{name.split('@', 1)[0]!r} is not served there; name a model of that "
                "provider, or none",
                step=step_id,
                field="model",
            )
        )
    return problems


def problem_text(exc: MinionsError) -> str:
    """An error's message for a client: a recipe's problems one per line, without the server's
    file paths."""
    if isinstance(exc, RecipeError):
        lines = []
        for problem in exc.problems:
            parts = []
            if problem.line is not None:
                parts.append(f"line {problem.line}")
            if problem.step is not None:
                parts.append(f"step {problem.step!r}")
            if problem.field is not None:
                parts.append(f"field {problem.field!r}")
            lines.append((", ".join(parts) + ": " if parts else "") + problem.message)
        return f"invalid {exc.what}: " + "; ".join(lines)
    return str(exc)
