"""The import graph: layers point down (the import-linter contract in `.importlinter`, which
`make lint` runs too) and no module imports, even indirectly, a module that imports it."""

from __future__ import annotations

import ast
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


def _listed(start: str, end: str) -> list[str]:
    """The modules docs/architecture.md gives one line each (``- `_x.py`: ...``) between the
    text `start` and the text `end`, sorted."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert page.count(start) == 1, start
    assert page.count(end) == 1, end
    section = page.split(start)[1].split(end)[0]
    return sorted(re.findall(r"^- `(_\w+\.py|__\w+__\.py)`: \S", section, flags=re.MULTILINE))


def test_the_architecture_page_lists_every_module_of_the_runs_package() -> None:
    """docs/architecture.md gives each module of `minions.runs` one line (``- `_x.py`: ...``),
    and names no module that is gone."""
    listed = _listed("`minions.runs` owns the run lifecycle", "## Public and private")
    modules = sorted(p.name for p in (ROOT / "minions" / "runs").glob("*.py"))
    assert listed == modules


def test_the_architecture_page_lists_every_module_of_the_cli() -> None:
    """docs/architecture.md gives each module of `minions.cli` one line, and names no module
    that is gone."""
    listed = _listed("The CLI is `minions.cli`", "`minions.runs` owns the run lifecycle")
    modules = sorted(p.name for p in (ROOT / "minions" / "cli").glob("*.py"))
    assert listed == modules


def _imported(node: ast.Import | ast.ImportFrom, home: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, name) of each name `node` imports, in a module of the package `home`
    (relative imports made absolute; ``import a.b`` is ``("a.b", "")``)."""
    if isinstance(node, ast.Import):
        return [(alias.name, "") for alias in node.names]
    base = list(home[: len(home) - node.level + 1]) if node.level else []
    target = ".".join([*base, *([node.module] if node.module else [])])
    return [(target, alias.name) for alias in node.names]


def _private_imports() -> set[tuple[str, str, str]]:
    """(importer, module, name) of every import in `minions/` of another package's private
    module (``minions.X._y``) or private name. The importer is the package (``minions.runs``),
    a module of `minions` itself (``minions._fold``), or `minions` for its `__init__`."""
    found = set()
    for path in sorted((ROOT / "minions").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = parts[:-1] if parts[-1] == "__init__" else parts
        importer = module[:2]
        home = module if parts[-1] == "__init__" else module[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target, name in _imported(node, home):
                dotted = tuple(target.split("."))
                if dotted[0] != "minions" or len(dotted) < 2 or dotted[:2] == importer:
                    continue
                private_name = name.startswith("_") and not name.startswith("__")
                if any(p.startswith("_") for p in dotted[2:]) or private_name:
                    found.add((".".join(importer), target, name))
    return found


def _documented_private_imports() -> set[tuple[str, str, str]]:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("## What a package takes from a neighbour's private module, and why")
    assert len(section) == 2, "the section is missing, or there twice"
    rows = re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \| ([^|]+) \| [^|]+ \|$", section[1], re.M)
    assert rows, "the section has no table"
    documented = set()
    for importer, module, names in rows:
        for name in re.findall(r"`(\w+)`", names):
            documented.add((importer, module, name))
    return documented


def test_packages_take_from_neighbours_private_modules_only_what_the_page_says() -> None:
    """Every import of another package's private module (or private name) is a row of
    "What a package takes from a neighbour's private module, and why" in
    docs/architecture.md, with its names; and every row is still true."""
    found = _private_imports()
    documented = _documented_private_imports()
    assert sorted(found - documented) == [], "undocumented: say why in docs/architecture.md"
    assert sorted(documented - found) == [], "documented, but no longer imported"


def test_a_package_shows_its_neighbours_one_private_module() -> None:
    """What neighbours take from a package's private modules, they take from one of them
    (its internal face), never from here and there."""
    faces: dict[str, set[str]] = {}
    for _, module, _ in _private_imports():
        faces.setdefault(".".join(module.split(".")[:2]), set()).add(module)
    assert {package: len(modules) for package, modules in faces.items()} == dict.fromkeys(
        faces, 1
    ), faces
