"""The server's recipes: the YAML files of its ``--recipes`` folder, by recipe id, and the
check that keeps an inline recipe to the code the server already trusts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from minions.errors import MinionsError, Problem, RecipeError

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

    Args:
        folder: the folder (None: the server offers no recipes).
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder.resolve() if folder is not None else None
        self._entries: dict[str, RecipeEntry] = {}

    def scan(self) -> dict[str, RecipeEntry]:
        from minions.recipes._loader import parse_spec

        entries: dict[str, RecipeEntry] = {}
        if self.folder is None:
            return entries
        files = sorted([*self.folder.rglob("*.yaml"), *self.folder.rglob("*.yml")])
        for path in files:
            if any(part.startswith(".") for part in path.relative_to(self.folder).parts):
                continue
            try:
                spec, _ = parse_spec(path.read_text(encoding="utf-8"), file=str(path))
            except (RecipeError, OSError, UnicodeDecodeError):
                continue  # not a recipe (a recording, a config file...)
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


def _inside(folder: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
    except ValueError:
        return False
    return True


def check_inline(text: str, folder: Path | None) -> None:
    """Refuse an inline recipe that could make the server run code it does not already trust:
    its ``tools:`` must be modules (``.py`` files) of the recipes folder, its sub-recipes files
    of that folder, and it may not choose its own ``workspace:``, declare MCP servers (a
    command to start, a host to call) or name a model endpoint (which would receive the
    server's API key). Built-in tools are always allowed. Nothing is imported here.

    Raises:
        RecipeError: the recipe does not parse, or names something outside the folder.
    """
    from minions.recipes._loader import parse_spec

    spec, _ = parse_spec(text)
    problems: list[Problem] = []
    where = "the server's recipes folder" if folder is not None else "none (no --recipes)"
    for index, reference in enumerate(spec.tools):
        module = reference.partition(":")[0]
        parts = module.split(".")
        ok = folder is not None and all(p.isidentifier() for p in parts)
        if ok and folder is not None:
            local = folder.joinpath(*parts).with_suffix(".py")
            ok = local.is_file() and _inside(folder, local)
        if not ok:
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
        ok = folder is not None and (folder / step.recipe).is_file()
        if ok and folder is not None:
            ok = _inside(folder, folder / step.recipe)
        if not ok:
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
    models: list[tuple[str | None, str | None]] = [(None, spec.model)]
    models += [(step.id, step.model) for step in spec.steps]
    for step_id, model in models:
        if model is not None and "@" in model:
            # A base URL of the request's choosing would receive the server's API key.
            problems.append(
                Problem(
                    message="an inline recipe cannot name a model endpoint (a base URL after "
                    f"'@' in {model.split('@', 1)[0]!r}@...); name the model only, the "
                    "server's configuration says where it is served",
                    step=step_id,
                    field="model",
                )
            )
    if problems:
        raise RecipeError(problems)


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
