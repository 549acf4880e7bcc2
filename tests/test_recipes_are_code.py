"""A recipe is code: `validate` imports its tools, unless --no-import, and a module that exits
while being imported is a problem, not a silent exit."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from minions.cli import app
from minions.errors import RecipeError
from minions.recipes import load_recipe_file

RECIPE = """\
id: coded
tools: [{tools}]
steps:
  - id: a
    goal: hi
    tools: [{name}]
"""

EXITING = """\
import sys

from minions import tool

sys.exit(3)


@tool
def ping() -> str:
    \"\"\"Answer.\"\"\"
    return "pong"
"""

MARKER = """\
from pathlib import Path

from minions import tool

Path(__file__).with_name("imported.txt").write_text("ran")

if True:
    @tool
    def ping() -> str:
        \"\"\"Answer.\"\"\"
        return "pong"
"""


def write(tmp_path: Path, tools: str, name: str = "ping", module: str = MARKER) -> Path:
    (tmp_path / "tools.py").write_text(module)
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.format(tools=tools, name=name))
    return path


def test_a_tools_module_calling_sys_exit_is_a_problem_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "tools:ping", module=EXITING)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "failed: it called sys.exit(3)" in said
    assert "Traceback" not in said


def test_validate_no_import_runs_none_of_the_recipes_code(tmp_path: Path) -> None:
    path = write(tmp_path, "tools:ping")
    result = CliRunner().invoke(app, ["validate", "--no-import", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output == f"OK: {path} (coded, 1 step; 1 tool module found, not imported)\n"
    assert not (tmp_path / "imported.txt").exists()
    # Without the flag the module runs (which is why the flag exists).
    assert CliRunner().invoke(app, ["validate", str(path)]).exit_code == 0
    assert (tmp_path / "imported.txt").exists()


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        ("tools:pong", "'tools' has no 'pong'"),
        ("nowhere.at_all:x", "cannot find module 'nowhere' (tools from 'nowhere.at_all')"),
        ("json.nowhere", "cannot find module 'json.nowhere'"),
        ("json.decoder:nothing", "'json.decoder' has no 'nothing'"),
    ],
)
def test_no_import_still_finds_missing_modules_and_names(
    tmp_path: Path, tools: str, expected: str
) -> None:
    path = write(tmp_path, tools)
    with pytest.raises(RecipeError) as raised:
        load_recipe_file(path, import_tools=False)
    assert expected in str(raised.value)
    assert not (tmp_path / "imported.txt").exists()


@pytest.mark.parametrize("tools", ["os:system", "json.decoder:JSONDecoder", "sys:exit"])
def test_no_import_accepts_names_it_cannot_see_without_running_code(
    tmp_path: Path, tools: str
) -> None:
    # `os` takes `system` from a star import; `sys` is built in: neither can be read as source.
    path = write(tmp_path, tools, name="current_datetime")
    assert load_recipe_file(path, import_tools=False).recipe.id == "coded"
