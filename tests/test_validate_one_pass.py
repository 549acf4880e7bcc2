"""`minions validate` (and every load) says every problem of every step in one pass, by line:
a step that cannot be read (an unknown field, no kind, no id, a bad recipe id) no longer hides
the unknown dependencies, tools and template references of the others; `cache:` where the step
cache never serves a step is refused."""

from __future__ import annotations

import gc
import os
import textwrap
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minions import AgentRecipe, DefaultStep, LoopStep, MessageBundle, ToolStep, Transition
from minions._yaml import BIG_TEXT, collector_paused
from minions.cli import app
from minions.errors import RecipeError
from minions.recipes import RecipeStep, load_recipe, parse_recipe, recipe_problems
from minions.recipes._loader import MAX_RECIPE_BYTES

TOOLS = '''
from minions import tool

@tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()
'''

BROKEN = """\
id: bad id
inputs:
  topic: string
tools: [tools]
steps:
  - id: a
    goal: "About {{ inputs.topic }}"
    colour: red
  - id: b
    depends_on: [nope_b]
  - id: c
    goal: "{{ missing.output }}"
    depends_on: [a, nope]
  - id: d
    tool: shuot
    tools: [{x: 1}]
  - goal: no id
    tools: [shoot]
  - id: e
    goal: "{{ a.output }}"
    depends_on: a
    next: [{when: "output.x"}, c]
    parallel: 2
  - id: f
    goal: [not, text]
    depends_on: [ghost]
  - just a string
  - id: g
    goal: x
    tool: shout
    depends_on: [phantom]
"""

EXPECTED = [
    "recipe.yaml:1: field 'id': recipe id 'bad id' must be 1 to 64 letters, digits, '_' or "
    "'-', starting with a letter or a digit (it names the run's workspace folder)",
    "recipe.yaml:8: step 'a', field 'colour': unknown field 'colour'",
    "recipe.yaml:9: step 'b': a step needs exactly one of goal (agent step), tool (tool step), "
    "analyze (analysis step) or recipe (sub-recipe step); it has none",
    "recipe.yaml:10: step 'b', field 'depends_on': unknown step 'nope_b'",
    "recipe.yaml:12: step 'c', field 'goal': template {{ missing.output }} refers to "
    "'missing', which is not an input, a step or a saved result",
    "recipe.yaml:13: step 'c', field 'depends_on': unknown step 'nope'",
    "recipe.yaml:15: step 'd', field 'tool': unknown tool 'shuot' (did you mean 'shout'?); "
    "known tools: current_datetime, list_files, read_file, shout, write_file",
    "recipe.yaml:16: step 'd', field 'tools.0': Input should be a valid string",
    "recipe.yaml:17: step '#5', field 'id': is required",
    "recipe.yaml:18: step '#5', field 'tools': unknown tool 'shoot' (did you mean 'shout'?); "
    "known tools: current_datetime, list_files, read_file, shout, write_file",
    "recipe.yaml:19: step 'e': `parallel` needs `loop`",
    "recipe.yaml:22: step 'e', field 'next.0.step': is required",
    "recipe.yaml:25: step 'f', field 'goal': Input should be a valid string",
    "recipe.yaml:26: step 'f', field 'depends_on': unknown step 'ghost'",
    "recipe.yaml:27: step '#8': Input should be a valid dictionary or instance of StepSpec",
    "recipe.yaml:28: step 'g': a step needs exactly one of goal (agent step), tool (tool step), "
    "analyze (analysis step) or recipe (sub-recipe step); it has goal, tool",
    "recipe.yaml:31: step 'g', field 'depends_on': unknown step 'phantom'",
]


def write(folder: Path, text: str) -> Path:
    (folder / "tools.py").write_text(TOOLS)
    path = folder / "recipe.yaml"
    path.write_text(text)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    return [str(p).replace(f"{path.parent}/", "") for p in caught.value.problems]


def test_every_problem_of_every_step_in_one_pass_by_line(tmp_path: Path) -> None:
    assert problems_of(write(tmp_path, BROKEN)) == EXPECTED


def test_validate_prints_them_all_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, BROKEN)
    result = CliRunner().invoke(app, ["validate", "recipe.yaml"])
    assert result.exit_code == 2
    assert result.output.splitlines()[1:] == [f"  {line}" for line in EXPECTED]


def test_fixing_what_was_reported_leaves_nothing_unreported(tmp_path: Path) -> None:
    """Each problem reported is one the recipe has: fixing them all gives a valid recipe (no
    second round of problems the first pass hid)."""
    fixed = (
        BROKEN.replace("id: bad id", "id: good")
        .replace("    colour: red\n", "")
        .replace("  - id: b\n", "  - id: b\n    goal: B\n")
        .replace("[nope_b]", "[a]")
        .replace("missing.output", "a.output")
        .replace("[a, nope]", "[a]")
        .replace("shuot", "shout")
        .replace("    tools: [{x: 1}]\n", "    params: {text: hi}\n")
        .replace("  - goal: no id\n", "  - id: h\n    goal: no id\n")
        .replace("[shoot]", "[shout]")
        .replace("    parallel: 2\n", "")
        .replace('[{when: "output.x"}, c]', "[c]")
        .replace("goal: [not, text]", "goal: F")
        .replace("[ghost]", "[a]")
        .replace("  - just a string\n", "")
        .replace("    tool: shout\n    depends_on: [phantom]", "    depends_on: [a]")
    )
    recipe = load_recipe(write(tmp_path, fixed))
    assert [s.id for s in recipe.steps] == ["a", "b", "c", "d", "h", "e", "f", "g"]


def test_a_step_that_cannot_be_built_does_not_hide_the_others(tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text("id: child\nsteps:\n  - id: x\n    goal: [1]\n")
    path = write(
        tmp_path,
        textwrap.dedent(
            """\
            id: parent
            steps:
              - id: sub
                recipe: child.yaml
              - id: after
                goal: "{{ sub.output }} {{ nothing }}"
                depends_on: [sub, gone]
            """
        ),
    )
    problems = problems_of(path)
    assert problems[0].startswith("recipe.yaml:4: step 'sub', field 'recipe': in ")
    assert problems[0].endswith(
        "child.yaml:4: step 'x', field 'goal': Input should be a valid string"
    )
    assert problems[1:] == [
        "recipe.yaml:6: step 'after', field 'goal': template {{ nothing }} refers to 'nothing', "
        "which is not an input, a step or a saved result",
        "recipe.yaml:7: step 'after', field 'depends_on': unknown step 'gone'",
    ]


def test_parse_recipe_and_recipe_problems_say_the_same(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as caught:
        parse_recipe(BROKEN.replace("tools: [tools]\n", ""), base=tmp_path)
    messages = [p.message for p in caught.value.problems]
    assert "unknown step 'nope_b'" in messages
    assert "unknown step 'phantom'" in messages


def test_a_depends_on_cycle_does_not_hide_a_transition_deadlock_elsewhere() -> None:
    def step(step_id: str, *depends_on: str) -> DefaultStep:
        return DefaultStep(step_id, MessageBundle(goal=step_id), depends_on=depends_on)

    deadlock = [step("r"), step("s", "u"), step("t"), step("u", "t")]
    transitions = [Transition("r", "s"), Transition("s", "t")]
    expected = (
        "s",
        "depends_on",
        "waits for 'u', which can only run after 's' itself (through transitions): neither "
        "could start",
    )
    alone = AgentRecipe(id="alone", steps=deadlock, transitions=transitions)
    assert [(p.step, p.field, p.message) for p in recipe_problems(alone)] == [expected]
    both = AgentRecipe(
        id="both", steps=[step("a", "b"), step("b", "a"), *deadlock], transitions=transitions
    )
    assert [(p.step, p.field, p.message) for p in recipe_problems(both)] == [
        ("a", "depends_on", "depends_on forms a cycle: a -> b -> a (each step waits for the next)"),
        expected,
    ]


# -- cache: where the step cache never serves a step -----------------------------------------


def test_cache_on_a_tool_or_sub_recipe_step_is_refused_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text("id: child\nsteps:\n  - id: x\n    goal: hi\n")
    path = write(
        tmp_path,
        textwrap.dedent(
            """\
            id: caching
            tools: [tools]
            steps:
              - id: loud
                tool: shout
                params: {text: hi}
                cache: true
              - id: each
                loop: [a, b]
                tool: shout
                params: {text: "{{ loop.item }}"}
                cache: {ttl: 1h}
              - id: sub
                recipe: child.yaml
                cache: true
              - id: think
                goal: hi
                cache: true
              - id: judge
                analyze: Is it loud?
                input: "{{ loud.output }}"
                depends_on: loud
                cache: true
            """
        ),
    )
    assert problems_of(path) == [
        "recipe.yaml:7: step 'loud', field 'cache': a tool step is never served from the step "
        "cache (it calls its tool directly: there is no model call to reuse); remove `cache`",
        "recipe.yaml:12: step 'each', field 'cache': a tool step is never served from the step "
        "cache (it calls its tool directly: there is no model call to reuse); remove `cache`",
        "recipe.yaml:15: step 'sub', field 'cache': a sub-recipe step is not cached as a "
        "whole; give `cache` to the steps of the sub-recipe that may be reused",
    ]


def test_cache_where_it_cannot_apply_is_a_problem_of_python_recipes_too() -> None:
    child = AgentRecipe(id="child", steps=[DefaultStep("x", MessageBundle(goal="hi"))])
    recipe = AgentRecipe(
        id="py",
        steps=[
            ToolStep("t", "current_datetime", cache=True),
            LoopStep(DefaultStep("l", MessageBundle(goal="{{ loop.item }}")), [1], cache=True),
            LoopStep(ToolStep("lt", "current_datetime", cache=True), [1]),
            RecipeStep("r", child, cache=True),
            DefaultStep("ok", MessageBundle(goal="hi"), cache=True),
        ],
    )
    found = [(p.step, p.field, p.message.split(" (")[0]) for p in recipe_problems(recipe)]
    assert found == [
        ("t", "cache", "a tool step is never served from the step cache"),
        ("l", "cache", "a loop step is not cached as a whole; give `cache` to its body"),
        ("lt", "cache", "a tool step is never served from the step cache"),
        (
            "r",
            "cache",
            "a sub-recipe step is not cached as a whole; give `cache` to the steps of the sub-recipe that may be reused",
        ),
    ]


def test_cache_and_http_of_the_wrong_form_are_one_problem_each() -> None:
    text = """\
id: forms
http: 3
steps:
  - id: a
    goal: x
    cache: {ttl: soon}
  - id: b
    goal: y
    cache: 3
"""
    with pytest.raises(RecipeError) as caught:
        parse_recipe(text)
    assert [str(p) for p in caught.value.problems] == [
        "recipe:2: field 'http': must be true, false or {enabled: ..., allowed_hosts: [...]}",
        "recipe:6: step 'a', field 'cache.ttl': cache ttl: 'soon' is not a duration: give a "
        "positive duration: seconds, or a number and a unit, s, m, h, d or w (90, 90s, 5m, 12h, "
        "30d, 2w, 1h30m)",
        "recipe:9: step 'b', field 'cache': must be true, false or {ttl: ..., side_effects: ...}",
    ]


# -- a big recipe is read with the cyclic garbage collector paused ----------------------------


def test_a_big_recipe_is_read_with_the_collector_paused_and_left_as_found(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(
        "import gc\nfrom pathlib import Path\n"
        "Path(__file__).with_name('seen.txt').write_text(str(gc.isenabled()))\n"
        "from minions import tool\n\n@tool\ndef noop() -> str:\n    return 'ok'\n"
    )
    text = "id: big\ntools: [tools]\nsteps:\n  - id: a\n    tool: noop\n"
    big = tmp_path / "big.yaml"
    big.write_text(f"description: {'x' * BIG_TEXT}\n{text}")
    assert gc.isenabled()
    load_recipe(big)
    assert (tmp_path / "seen.txt").read_text() == "False"
    assert gc.isenabled()
    with pytest.raises(RecipeError):
        parse_recipe(f"description: {'x' * BIG_TEXT}\nid: [bad]\nsteps: []\n")
    assert gc.isenabled()
    gc.disable()
    try:
        load_recipe(big)
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()


def test_the_collector_comes_back_when_the_last_of_several_loads_ends() -> None:
    big = "x" * BIG_TEXT
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collector_paused(big):
            first_in.set()
            second_in.wait()
        first_out.set()

    def second() -> None:
        first_in.wait()
        with collector_paused(big):
            second_in.set()
            first_out.wait()
            seen.append(gc.isenabled())  # the first load ended, this one goes on
        seen.append(gc.isenabled())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [False, True]
    with collector_paused("small"):
        assert gc.isenabled()


# -- a recipe file that is not a file ---------------------------------------------------------


def test_a_recipe_that_is_a_device_a_folder_or_huge_is_one_problem(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as file:
        file.truncate(MAX_RECIPE_BYTES + 1)  # sparse: costs no disk
    for path, said in [
        (Path("/dev/zero"), "a character device, not a regular file"),
        (tmp_path, "a folder, not a regular file"),
        (huge, "larger than 64 MiB"),
    ]:
        with pytest.raises(RecipeError) as caught:
            load_recipe(path)
        assert [str(p) for p in caught.value.problems] == [f"{path}: {said}"]


def test_a_recipe_is_read_from_a_pipe(tmp_path: Path) -> None:
    read, write_end = os.pipe()
    with os.fdopen(write_end, "w") as writer:
        writer.write("id: piped\nsteps:\n  - {id: a, goal: hi}\n")
    try:
        assert load_recipe(f"/dev/fd/{read}").id == "piped"
    finally:
        os.close(read)
