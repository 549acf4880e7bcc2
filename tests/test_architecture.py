"""The import graph: layers point down (the import-linter contract in `.importlinter`, which
`make lint` runs too) and no module imports, even indirectly, a module that imports it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_runtime_import_graph_has_no_cycle() -> None:
    # Imports under `if TYPE_CHECKING:` name types only and never run; the layer contract
    # checks those too (a layer may not name a type from above it).
    graph = grimp.build_graph("minions", exclude_type_checking_imports=True)
    # A package's `__init__` re-exports its modules; that edge is not a cycle of roles.
    for package in [m for m in graph.modules if graph.find_children(m)]:
        for child in graph.find_children(package):
            if graph.direct_import_exists(importer=package, imported=child):
                graph.remove_import(importer=package, imported=child)
    assert _cycles(graph) == []


def test_the_layer_contract_holds() -> None:
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_architecture_page_lists_every_module_of_the_runs_package() -> None:
    """docs/architecture.md gives each module of `minions.runs` one line (``- `_x.py`: ...``),
    and names no module that is gone."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = re.findall(r"^- `(_\w+\.py|__init__\.py)`: \S", page, flags=re.MULTILINE)
    modules = sorted(p.name for p in (ROOT / "minions" / "runs").glob("*.py"))
    assert sorted(listed) == modules
