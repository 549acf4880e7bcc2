"""The typed surface holds under ``mypy --strict``: the `assert_type` cases of
`tests/typing_cases.py` pass, mistakes a typed caller makes are errors, and every ```python
block of README.md and docs/*.md type-checks.

Each test is one mypy run (in a subprocess, with the project's configuration and its cache, so
a warm cache makes it a few seconds).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = ROOT / ".mypy_cache" / "minions-typing"
"""Where the checked modules are written: the same paths every run, so mypy's cache knows
them (modules of the same name at new paths would be confused with the cached ones)."""
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```\n", re.DOTALL | re.MULTILINE)
ERROR = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<message>.*)$", re.MULTILINE)

MISTAKES = """\
from pydantic import BaseModel
from minions import AgentExecutor, AgentRecipe, DefaultStep, StepExecution


class Expense(BaseModel):
    merchant: str
    amount_eur: float


def approve(advice: bool) -> bool:
    return advice


step = DefaultStep("s", goal="x", output=Expense)
execution = step.run_sync()
execution.result().amount_eurx  # E: has no attribute "amount_eurx"
execution.output.amount_eur  # E: Item "None" of "Expense | None" has no attribute
text: int = DefaultStep("t", goal="x").run_sync().result()  # E: Incompatible types in assignment
DefaultStep("s", goal="x", dependson=["a"])  # E: did you mean "depends_on"?
DefaultStep("s", goal="x", output=Expense, validators=[approve])  # E: List item 0 has incompatible type "Callable[[bool], bool]"
wrong: StepExecution[int] = AgentExecutor().execute_sync(AgentRecipe(id="r", steps=[step])).step(step)  # E: Argument 1 to "step" of "AgentResult" has incompatible type
"""


def mypy(*paths: Path) -> str:
    """Run ``mypy --strict`` (the project's configuration, its cache) and return its output."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-pretty", *map(str, paths)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed
    return done.stdout


def _fresh(name: str) -> Path:
    folder = GENERATED / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def test_the_typed_surface_holds_and_mistakes_are_errors() -> None:
    mistakes = _fresh("mistakes") / "typing_mistakes.py"
    mistakes.write_text(MISTAKES)
    output = mypy(ROOT / "tests" / "typing_cases.py", mistakes)
    errors = list(ERROR.finditer(output))
    cases = [m.group(0) for m in errors if m["file"].endswith("typing_cases.py")]
    assert cases == [], output
    found: dict[int, str] = {}
    for match in errors:
        found[int(match["line"])] = found.get(int(match["line"]), "") + match["message"]
    for number, line in enumerate(MISTAKES.splitlines(), start=1):
        expected = line.partition("# E: ")[2]
        if expected:
            assert expected in found.get(number, ""), f"line {number}: {line}\n{output}"
        else:
            assert number not in found, f"line {number}: {found[number]}"


def test_the_contract_program_runs() -> None:
    import typing_cases

    asyncio.run(typing_cases.contract())


# -- the docs' code --------------------------------------------------------------------------

_BUILTINS = set(dir(builtins))


def _imports(tree: ast.Module) -> dict[str, str]:
    """The import statement of each name a block imports at its top, by name."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                one = ast.ImportFrom(module=node.module, names=[alias], level=node.level)
                found[alias.asname or alias.name] = ast.unparse(one)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found[(alias.asname or alias.name).split(".")[0]] = ast.unparse(
                    ast.Import(names=[alias])
                )
    return found


def _bound(tree: ast.AST) -> set[str]:
    """Every name a block binds, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _top_level_await(tree: ast.Module) -> bool:
    """Whether a block awaits outside any function (a notebook cell)."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

    def visit(node: ast.AST) -> bool:
        if isinstance(node, ast.Await | ast.AsyncFor | ast.AsyncWith):
            return True
        return any(
            visit(child) for child in ast.iter_child_nodes(node) if not isinstance(child, functions)
        )

    return any(visit(statement) for statement in tree.body if not isinstance(statement, functions))


def docs_modules(folder: Path) -> dict[Path, str]:
    """One module per ```python block of the README and the docs, importing from the
    earlier blocks of its page the names it uses and does not bind (blocks of a page run in
    one namespace); a notebook cell (top-level ``await``) becomes the body of an
    ``async def``. By module path, the place of its block."""
    made: dict[Path, str] = {}
    for page in PAGES:
        text = page.read_text()
        stem = re.sub(r"\W", "_", page.stem.lower())
        earlier: list[tuple[str, set[str], dict[str, str]]] = []
        for number, found in enumerate(BLOCK.finditer(text), start=1):
            code = found["code"]
            line = text.count("\n", 0, found.start()) + 2
            tree = ast.parse(code)
            bound = _bound(tree)
            used = {
                n.id
                for n in ast.walk(tree)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            }
            imports = []
            for name in sorted(used - bound - _BUILTINS):
                source = next((e for e in reversed(earlier) if name in e[1]), None)
                if source is None:
                    continue  # mypy says it is not defined
                # What an earlier block imported is imported the same way; what it made, from it.
                imports.append(source[2].get(name) or f"from {source[0]} import {name}")
            module = f"doc_{stem}_{number}"
            if _top_level_await(tree):
                code = "async def _cell() -> None:\n" + textwrap.indent(code, "    ")
            head = f"# {page.relative_to(ROOT)}, the block at line {line}\n" + "\n".join(imports)
            path = folder / f"{module}.py"
            path.write_text(head + "\n" + code)
            made[path] = f"{page.relative_to(ROOT)}:{line}"
            earlier.append((module, bound, _imports(tree)))
    return made


def test_every_python_block_of_the_docs_passes_mypy_strict() -> None:
    modules = docs_modules(_fresh("docs"))
    assert len(modules) > 30  # the blocks were found
    output = mypy(*modules)
    places = {path.name: where for path, where in modules.items()}
    problems = []
    for match in ERROR.finditer(output):
        where = places.get(Path(match["file"]).name)
        problems.append(f"{where} (+{int(match['line'])} in {match['file']}): {match['message']}")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(
    ("code", "cell"),
    [("x = 1\nawait f(x)\n", True), ("async def g():\n    await f()\n", False)],
)
def test_a_notebook_cell_is_told_from_a_coroutine(code: str, cell: bool) -> None:
    assert _top_level_await(ast.parse(code)) is cell
