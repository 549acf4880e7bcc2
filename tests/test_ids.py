"""Recipe and step ids are slugs, in YAML files, YAML text and recipes built in code: refused
at load with the field named, stated in the JSON Schema, bounded in length; and a recipe's
default workspace stays a folder of ``.minions/workspace``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minions import AgentRecipe, DefaultStep, StepGraph
from minions.errors import RecipeError
from minions.recipes import load_recipe, load_recipe_file, parse_recipe, recipe_problems
from minions.recipes._schema import RecipeSpec

HOSTILE = [
    "../escape",
    "..",
    ".",
    ".hidden",
    "/etc",
    "a/b",
    "a\\b",
    "..\\..\\windows",
    "a%2F..",
    "a b",
    "a\x00b",
    "ok\n",
    "-flag",
    "_under",
    "café",
    "",
    "x" * 65,
]


def yaml_with(recipe_id: str, step_id: str = "a") -> str:
    return f"id: {json.dumps(recipe_id)}\nsteps:\n  - id: {json.dumps(step_id)}\n    goal: hi\n"


@pytest.mark.parametrize("bad", HOSTILE)
def test_a_recipe_id_that_is_not_a_slug_is_refused_in_a_file_in_text_and_in_code(
    tmp_path: Path, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "recipe.yaml"
    file.write_text(yaml_with(bad))
    with pytest.raises(RecipeError) as from_file:
        load_recipe(file)
    [problem] = from_file.value.problems
    assert (problem.file, problem.line, problem.field) == (str(file), 1, "id")
    assert "must be 1 to 64 letters, digits, '_' or '-'" in problem.message
    with pytest.raises(RecipeError) as from_text:
        parse_recipe(yaml_with(bad))
    assert [p.field for p in from_text.value.problems] == ["id"]
    with pytest.raises(RecipeError) as from_code:
        AgentRecipe(id=bad, steps=[DefaultStep("a", "hi")])
    assert [p.field for p in from_code.value.problems] == ["id"]
    assert not (tmp_path / ".minions").exists()  # no workspace was made for it
    assert not (tmp_path.parent / "escape").exists()


@pytest.mark.parametrize("good", ["a", "w1-linear-chain", "Research_Assistant", "0day", "x" * 64])
def test_slugs_are_recipe_ids(good: str) -> None:
    assert parse_recipe(yaml_with(good)).id == good
    assert AgentRecipe(id=good, steps=[DefaultStep("a", "hi")]).id == good


def test_a_long_recipe_id_is_shown_cut_with_its_length() -> None:
    with pytest.raises(RecipeError) as raised:
        AgentRecipe(id="y" * 10_000, steps=[DefaultStep("a", "hi")])
    message = str(raised.value)
    assert "(10000 characters)" in message
    assert len(message) < 400


@pytest.mark.parametrize("bad", [*HOSTILE[:13], "1st", "z" * 65])
def test_a_step_id_that_is_not_one_is_refused_in_yaml_and_in_code(bad: str) -> None:
    with pytest.raises(RecipeError) as raised:
        parse_recipe(yaml_with("ok", bad))
    [problem] = raised.value.problems
    assert (problem.line, problem.field) == (3, "id")
    assert "at most 64 characters long" in problem.message
    in_code = AgentRecipe(id="ok", steps=[DefaultStep(bad, "hi")])
    assert [p.field for p in recipe_problems(in_code)] == ["id"]
    with pytest.raises(Exception, match="at most 64 characters long"):
        StepGraph(in_code)


def test_the_longest_step_id_runs() -> None:
    longest = "s" * 64
    recipe = parse_recipe(yaml_with("r" * 64, longest))
    assert [s.id for s in recipe.steps] == [longest]
    assert recipe_problems(recipe) == []


def test_the_json_schema_states_the_id_patterns() -> None:
    schema = RecipeSpec.model_json_schema()
    recipe_id = schema["properties"]["id"]
    step_id = schema["$defs"]["StepSpec"]["properties"]["id"]
    assert (recipe_id["maxLength"], step_id["maxLength"]) == (64, 64)

    # JSON Schema's regular expressions are ECMA-262's, where `$` is the end of the text.
    def matches(pattern: str, text: str) -> bool:
        assert pattern[0] + pattern[-1] == "^$"
        return re.fullmatch(pattern[1:-1], text) is not None

    assert [bad for bad in HOSTILE if matches(recipe_id["pattern"], bad)] == []
    assert matches(recipe_id["pattern"], "w1-linear-chain")
    assert matches(step_id["pattern"], "_private")
    assert not matches(step_id["pattern"], "1st")


def test_a_link_planted_as_the_default_workspace_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "here"
    outside = tmp_path / "outside"
    (here / ".minions" / "workspace").mkdir(parents=True)
    outside.mkdir()
    (here / ".minions" / "workspace" / "writer").symlink_to(outside)
    monkeypatch.chdir(here)
    file = here / "writer.yaml"
    file.write_text(
        "id: writer\nsteps: [{id: w, tool: write_file, params: {path: a, content: x}}]\n"
    )
    with pytest.raises(RecipeError) as raised:
        load_recipe_file(file)
    [problem] = raised.value.problems
    assert (problem.file, problem.line, problem.field) == (str(file), 1, "workspace")
    assert "would not be a folder of .minions/workspace" in problem.message
    assert list(outside.iterdir()) == []
    # A recipe that names its workspace is not concerned.
    file.write_text(file.read_text().replace("steps:", "workspace: out\nsteps:"))
    assert load_recipe_file(file).recipe.id == "writer"
