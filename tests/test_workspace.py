"""The file tools' workspace: a folder of the run's own by default, `--workspace` to choose,
and never the recipe's own files (its YAML, the tool modules it imports) or a `.env`."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import SETTINGS, write_recipe
from typer.testing import CliRunner

from minions.cli._app import app
from minions.recipes import load_recipe_file
from minions.tools import ToolRegistry, file_tools

WRITER = """\
id: writer
tools: [tools]
inputs:
  path: {type: string, default: notes.txt}
steps:
  - id: save
    tool: write_file
    params: {path: "{{ inputs.path }}", content: "hello"}
"""


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", *args], obj=SETTINGS)
    return result.exit_code, result.output


def test_a_recipe_without_a_workspace_writes_in_a_folder_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = write_recipe(tmp_path / "recipe", WRITER)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, output = run(str(recipe), "--json")
    assert code == 0, output
    assert (here / ".minions" / "workspace" / "writer" / "notes.txt").read_text() == "hello"
    assert not (recipe.parent / "notes.txt").exists()


def test_workspace_option_chooses_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = write_recipe(
        tmp_path, WRITER.replace("tools: [tools]", "tools: [tools]\nworkspace: .")
    )
    monkeypatch.chdir(tmp_path)
    code, output = run(str(recipe), "--workspace", "out")
    assert code == 0, output
    assert (tmp_path / "out" / "notes.txt").read_text() == "hello"
    assert not (tmp_path / "notes.txt").exists()  # the option beats the recipe's `workspace:`


def test_workspace_option_must_be_a_folder(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, WRITER)
    code, output = run(str(recipe), "--workspace", str(recipe))
    assert code == 2
    assert "is not a folder" in output


@pytest.mark.parametrize("target", ["recipe.yaml", "tools.py", "child.yaml"])
def test_file_tools_never_write_the_recipes_own_files(tmp_path: Path, target: str) -> None:
    # Even with the workspace set to the recipe's own folder: the next run would import it.
    (tmp_path / "child.yaml").write_text("id: child\nsteps: [{id: c, tool: current_datetime}]\n")
    recipe = write_recipe(
        tmp_path,
        WRITER.replace("tools: [tools]", "tools: [tools]\nworkspace: .")
        + "  - id: sub\n    recipe: child.yaml\n",
    )
    before = (tmp_path / target).read_text()
    code, output = run(str(recipe), "-i", f"path={target}")
    assert code == 1
    said = " ".join(output.split())
    assert f"'{target}' is part of the recipe (its YAML or a tools module)" in said
    assert (tmp_path / target).read_text() == before
    # Other files of the folder are the workspace's.
    assert run(str(recipe), "-i", "path=ok.txt")[0] == 0
    assert (tmp_path / "ok.txt").read_text() == "hello"


@pytest.mark.parametrize("name", [".env", ".env.local", "sub/.env"])
def test_read_file_never_reads_a_dotenv(tmp_path: Path, name: str) -> None:
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text("OPENAI_API_KEY=sk-secret")
    read = ToolRegistry(file_tools(tmp_path)).get("read_file")
    assert read is not None
    with pytest.raises(Exception, match=r"holds secrets \(a \.env file\)") as raised:
        read.fn(path=name)
    assert "sk-secret" not in str(raised.value)


def test_an_included_recipe_works_in_the_including_ones_workspace(tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text(
        "id: child\nsteps: [{id: c, tool: write_file, params: {path: c.txt, content: x}}]\n"
    )
    (tmp_path / "parent.yaml").write_text(
        "id: parent\nworkspace: shared\nsteps: [{id: sub, recipe: child.yaml}]\n"
    )
    loaded = load_recipe_file(tmp_path / "parent.yaml")
    code, output = run(str(tmp_path / "parent.yaml"), "--json")
    assert code == 0, output
    assert (tmp_path / "shared" / "c.txt").read_text() == "x"
    assert loaded.recipe.id == "parent"


def test_listing_a_workspace_nothing_wrote_yet_is_empty(tmp_path: Path) -> None:
    tools = ToolRegistry(file_tools(tmp_path / "not-yet"))
    listing = tools.get("list_files")
    assert listing is not None
    assert listing.fn() == []
    assert not (tmp_path / "not-yet").exists()
