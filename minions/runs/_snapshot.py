"""The recipe snapshot: what a run (or a schedule) keeps of its recipe when it is queued (or
added), so that it runs the recipe as it was then, whatever happens to the file later.

A snapshot is the recipe's YAML, the file it came from (its tools modules and sub-recipes are
found beside it), the hash of the YAML, the checked inputs, and the hash of the whole request
(what an idempotency key names). Submitting, rerunning and a schedule's slots store it the
same way (`RecipeSnapshot.columns`), and a worker builds the recipe from it (`recipe_of`).
Its steps as a reader sees them (``GET /runs/{id}``'s graph, a step's kind) are
`recipe_graph`'s: parsed once per recipe text, not once per read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions._text import jsonable
from minions.runs._db import dumps

if TYPE_CHECKING:
    from minions.recipes import AgentRecipe, Located, RecipeSpec

__all__ = ["RecipeNode"]


@dataclass(frozen=True, kw_only=True)
class RecipeSnapshot:
    """A recipe and its checked inputs, as a run or a schedule stores them.

    Attributes:
        recipe_id: the recipe's id.
        yaml: the recipe's YAML when it was snapshotted.
        path: the file it came from (None: a run stored before files were kept).
        hash: the SHA-256 of `yaml`.
        inputs: the inputs, checked against the recipe's.
        request_hash: the SHA-256 of the recipe id, `hash` and the inputs: what an
            idempotency key names (the same key with another request is refused).
    """

    recipe_id: str
    yaml: str
    path: str | None
    hash: str
    inputs: dict[str, Any] = field(default_factory=dict)
    request_hash: str = ""

    @classmethod
    def of(
        cls, text: str, path: str | Path | None, recipe: AgentRecipe, inputs: Mapping[str, Any]
    ) -> RecipeSnapshot:
        """The snapshot of recipe YAML `text` (the file `path`), built as `recipe`, with its
        checked `inputs`."""
        recipe_hash = hashlib.sha256(text.encode()).hexdigest()
        request = json.dumps(
            {"recipe": recipe.id, "recipe_hash": recipe_hash, "inputs": jsonable(inputs)},
            sort_keys=True,
            ensure_ascii=False,
        )
        return cls(
            recipe_id=recipe.id,
            yaml=text,
            path=None if path is None else str(path),
            hash=recipe_hash,
            inputs=dict(inputs),
            request_hash=hashlib.sha256(request.encode()).hexdigest(),
        )

    @classmethod
    def from_row(cls, row: Any) -> RecipeSnapshot:
        """The snapshot a row of the runs or the schedules table holds."""
        return cls(
            recipe_id=row.recipe_id,
            yaml=row.recipe_yaml,
            path=row.recipe_path,
            hash=row.recipe_hash,
            inputs=json.loads(row.inputs),
            request_hash=row.request_hash or "",
        )

    def columns(self) -> dict[str, Any]:
        """The snapshot as the runs and the schedules tables store it."""
        return {
            "recipe_id": self.recipe_id,
            "recipe_yaml": self.yaml,
            "recipe_path": self.path,
            "recipe_hash": self.hash,
            "inputs": dumps(self.inputs),
            "request_hash": self.request_hash,
        }

    def recipe(self) -> AgentRecipe:
        """The recipe, built from the snapshot (see `recipe_of`)."""
        return recipe_of(self.yaml, self.path)


def build(
    text: str,
    path: str | Path,
    *,
    import_tools: bool = True,
    parsed: tuple[RecipeSpec, Located] | None = None,
) -> AgentRecipe:
    """The recipe of YAML `text` as the file `path`, checked, as a run of it would build it.
    Without `import_tools`, its tools modules are only found, not imported (a service: no
    request makes it import code; the worker checks the steps' tool names); `parsed`: the
    text parsed already (it is not parsed again).

    Raises:
        RecipeError: the recipe is invalid.
    """
    if import_tools:
        return recipe_of(text, str(path))
    from minions.recipes import load_recipe_file

    return load_recipe_file(Path(path), text=text, import_tools=False, parsed=parsed).recipe


@functools.lru_cache(maxsize=32)
def recipe_of(yaml_text: str, path: str | None) -> AgentRecipe:
    """The run's recipe from its snapshot, built as `minions run` would build the file it came
    from (tools and included recipes found beside it, its files protected from the file
    tools). Built once per snapshot and process: a recipe is immutable, and a tools module is
    imported once per process anyway.

    Raises:
        RecipeError: the snapshot does not build (a tools module beside it changed...).
    """
    from minions.recipes import load_recipe_file

    file = Path(path) if path else Path.cwd() / "recipe.yaml"
    return load_recipe_file(file, text=yaml_text).recipe


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeNode:
    """One step of a run's recipe, as its graph draws it.

    Attributes:
        kind: ``agent``, ``tool``, ``analysis`` or ``recipe`` (as the recipe's step says).
        depends_on: the steps it waits for.
        next: the steps its transitions may go to.
    """

    id: str
    kind: str
    depends_on: tuple[str, ...] = ()
    next: tuple[str, ...] = ()


STEPS_KEPT = 10_000
"""How many steps the kept graphs hold together, at most (a graph counts one more than its
steps): the graphs read least recently go first, and a larger graph is not kept."""


class _Graphs:
    """The graphs of the recipes read last, by the SHA-256 of their text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._graphs: OrderedDict[str, tuple[RecipeNode, ...]] = OrderedDict()
        self._steps = 0

    def get(self, digest: str) -> tuple[RecipeNode, ...] | None:
        with self._lock:
            found = self._graphs.get(digest)
            if found is not None:
                self._graphs.move_to_end(digest)
            return found

    def keep(self, digest: str, nodes: tuple[RecipeNode, ...]) -> None:
        if len(nodes) + 1 > STEPS_KEPT:
            return
        with self._lock:
            if digest in self._graphs:
                return
            self._graphs[digest] = nodes
            self._steps += len(nodes) + 1
            while self._steps > STEPS_KEPT:
                _, dropped = self._graphs.popitem(last=False)
                self._steps -= len(dropped) + 1


_graphs = _Graphs()


def recipe_graph(text: str) -> tuple[RecipeNode, ...]:
    """The steps of recipe YAML `text`, in order (none when it does not parse: a snapshot
    stored by another version, or damaged). Parsed once per text and process while it is
    read often enough to stay kept (see `STEPS_KEPT`); kept by the SHA-256 of the text, so
    what one recipe parses to never stands for another's. Blocking: async code calls it in
    a thread."""
    digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
    found = _graphs.get(digest)
    if found is None:
        found = _parse_graph(text)
        _graphs.keep(digest, found)
    return found


def _parse_graph(text: str) -> tuple[RecipeNode, ...]:
    from minions.errors import RecipeError
    from minions.recipes import parse_spec

    try:
        spec, _ = parse_spec(text)
    except RecipeError:
        return ()
    return tuple(
        RecipeNode(
            id=step.id,
            kind=step.kind,
            depends_on=tuple(step.depends_on),
            next=tuple(n.step for n in step.next),
        )
        for step in spec.steps
    )
