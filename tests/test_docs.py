"""Every ```python block in README.md and docs/ runs as written, and prints what it says.

Blocks of one file run in order in one namespace, so a page can build on earlier blocks.
A block whose first line is `# doc: no-run` (one needing a real model, say) is skipped; a
block that awaits at its top (a notebook cell) runs in an event loop of its own.
A block that prints is followed by a ```text block holding exactly what it prints; ``...`` in
that text stands for any text (a time, an id).

The ```text blocks of docs/cli.md that show what a command prints are checked the same way,
against the command run in process (`CLI_OUTPUTS` names the command of each).

Every ```bash runnable block runs as a shell script in a fresh copy of the examples, offline
(docs/testing.md, "The docs are tested").
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minions.cli._app import app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(
    r"^```python\n(?P<code>.*?)^```\n(?:\n*^```text\n(?P<prints>.*?)^```)?",
    re.DOTALL | re.MULTILINE,
)


def _matches(printed: str, expected: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed, re.DOTALL) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIONS_MODEL", raising=False)
    namespace: dict[str, object] = {"__name__": f"doc_{page.stem}"}
    for number, found in enumerate(BLOCK.finditer(page.read_text()), start=1):
        block, expected = found["code"], found["prints"]
        if block.startswith("# doc: no-run"):
            continue
        # As a reader runs it: without this module's `from __future__ import annotations`;
        # a notebook cell (top-level await) runs in an event loop of its own.
        code = compile(
            block,
            f"{page.name} block {number}",
            "exec",
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            if code.co_flags & inspect.CO_COROUTINE:
                asyncio.run(eval(code, namespace))
            else:
                exec(code, namespace)
        where = f"{page.name} block {number}"
        if expected is None:
            assert printed.getvalue() == "", f"{where} prints, but no ```text block says what"
        else:
            assert _matches(printed.getvalue(), expected), (
                f"{where} printed:\n{printed.getvalue()}\nthe page says:\n{expected}"
            )


def quickstart_commands() -> list[str]:
    """The commands of the README's Quickstart: its ```bash blocks, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_quickstart_is_two_commands_and_ci_runs_the_second() -> None:
    demo, check = quickstart_commands()
    assert demo == "make demo"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in ci if line.strip() and not line.startswith("#")]
    assert commands[-1] == check


EXAMPLE = ROOT / "examples" / "activity_monitor"
BROKEN_RECIPE = """\
id: staged
steps:
  - id: a
    goal: hello
    colour: red
  - id: b
    description: no kind
  - id: c
    depends_on: [nope]
    goal: go
  - id: d
    tool: no_such_tool
"""
CLI_OUTPUTS: dict[str, tuple[list[str], str]] = {
    # The first line of a ```text block on the page: the command's arguments (run in a copy of
    # the activity-monitor example, beside `recipe.yaml`) and which stream the block shows.
    "Plan of activity_monitor": (
        ["run", "recipe.yaml", "--dry-run", "-m", "ollama:llama3.2:3b"],
        "stdout",
    ),
    "no model set: replaying": (["run", "recipe.yaml"], "first stderr line"),
    "error: no model is configured": (["run", "recipe.yaml"], "stderr, without a recording"),
    "invalid recipe: 4 problems": (["validate", "recipe.yaml"], "stderr, of BROKEN_RECIPE"),
}


def _text_blocks(page: Path) -> dict[str, str]:
    """The page's ```text blocks (indented ones too, dedented), by their first line."""
    found = re.finditer(r"^( *)```text\n(.*?)^\1```", page.read_text(), re.DOTALL | re.MULTILINE)
    blocks = [textwrap.dedent(m[2]) for m in found]
    return {block.splitlines()[0]: block for block in blocks}


@pytest.mark.parametrize("first_line", CLI_OUTPUTS)
def test_the_cli_page_shows_what_commands_print(
    first_line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = _text_blocks(ROOT / "docs" / "cli.md")
    [expected] = [text for line, text in blocks.items() if line.startswith(first_line)]
    args, shows = CLI_OUTPUTS[first_line]
    shutil.copytree(EXAMPLE, tmp_path / "example")
    monkeypatch.chdir(tmp_path / "example")
    for name in ("MINIONS_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # no wrapping of long lines
    if "without a recording" in shows:
        Path("recipe.recording.json").unlink()
    if "BROKEN_RECIPE" in shows:
        Path("recipe.yaml").write_text(BROKEN_RECIPE)
    result = CliRunner().invoke(app, args)
    printed = result.stdout if shows == "stdout" else result.stderr
    if shows == "first stderr line":
        printed = printed.splitlines(keepends=True)[0]
    assert _matches(printed, expected), (
        f"the command printed:\n{printed}\nthe page says:\n{expected}"
    )


RUNNABLE = re.compile(r"^```bash runnable\n(?P<code>.*?)^```", re.DOTALL | re.MULTILINE)


def runnable_blocks() -> list[tuple[str, str]]:
    """(where, script) of every ```bash runnable block of README.md and docs/."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in RUNNABLE.finditer(text):
            line = text.count("\n", 0, block.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", block["code"]))
    return found


def test_the_readme_and_the_cli_page_have_runnable_blocks() -> None:
    # The marker is what the test looks for: a page that lost it would go untested.
    pages = {where.split(":")[0] for where, _ in runnable_blocks()}
    assert {"README.md", "docs/cli.md"} <= pages


@pytest.mark.slow
@pytest.mark.parametrize(("where", "script"), runnable_blocks(), ids=lambda v: str(v)[:40])
def test_runnable_commands_work_offline_in_a_fresh_copy(
    where: str, script: str, tmp_path: Path
) -> None:
    shutil.copytree(
        ROOT / "examples",
        tmp_path / "examples",
        ignore=shutil.ignore_patterns("__pycache__", ".minions", "*.pyc"),
    )
    unset = ("MINIONS_MODEL", "MINIONS_DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL")
    env = {k: v for k, v in os.environ.items() if k not in unset and "PROXY" not in k.upper()}
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env["NO_PROXY"] = "*"
    log = tmp_path / "output.txt"
    with log.open("w") as output:
        # A session of its own: the jobs the script leaves in the background are stopped
        # with it. Its output goes to a file, which those jobs may keep open.
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    said = log.read_text()
    assert code == 0, f"{where} failed (exit code {code}):\n{script}\n{said[-4000:]}"
    assert "Traceback" not in said, f"{where}:\n{said[-4000:]}"
