"""Bad and hostile input files: each a clear error naming the file, never a traceback, in
bounded time and memory."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minions.cli import app
from minions.errors import RecipeError, RecordingError
from minions.models import Recording
from minions.recipes import load_recipe

BOMB = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
id: bomb
steps: [{id: s, goal: "{{ g }}"}]
"""


def problems_of(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    assert all(p.file == str(path) for p in raised.value.problems)
    return [str(p) for p in raised.value.problems]


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    [problem] = problems_of(path)
    assert "aliases add more than 100,000 values once they are expanded" in problem


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("id: deep\nsteps: " + "[" * 500 + "]" * 500 + "\n")
    [problem] = problems_of(path)
    assert "nest" in problem


def test_a_recipe_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("id: caf\xe9\nsteps: []\n".encode("latin-1"))
    [problem] = problems_of(path)
    assert problem == f"{path}: not UTF-8 text (byte 7 cannot be read); save the recipe as UTF-8"


def test_a_character_yaml_does_not_allow_is_named_with_its_line(tmp_path: Path) -> None:
    # Found by tests/test_fuzz.py: a NUL byte raised yaml's ReaderError past the loader.
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"id: a\nsteps:\n  - {id: s, goal: \x00}\n")
    [problem] = problems_of(path)
    assert problem == f"{path}:3: invalid YAML: character '\\x00' is not allowed in YAML text"


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("id: a\nsteps: []\nsteps: []\n", "steps", "lines 2 and 3"),
        ("id: a\nsteps:\n  - id: s\n    goal: x\n    goal: y\n", "goal", "lines 4 and 5"),
        ("id: a\nsteps: [{id: s, goal: x, goal: y}]\n", "goal", "lines 2 and 2"),
    ],
)
def test_duplicate_keys_are_an_error_naming_both_lines(
    tmp_path: Path, text: str, key: str, lines: str
) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    [problem] = problems_of(path)
    assert f"the key {key!r} is given twice ({lines})" in problem


def chain(steps: int) -> str:
    """A recipe of `steps` steps in a chain, each depending on the one before: no alias."""
    lines = ["id: chain", "steps:", "  - {id: s0, goal: Start.}"]
    lines += [
        f"  - {{id: s{i}, goal: 'Go on from {{{{ s{i - 1} }}}}.', depends_on: [s{i - 1}]}}"
        for i in range(1, steps)
    ]
    return "\n".join(lines) + "\n"


def test_a_big_recipe_is_judged_by_its_size_and_a_bomb_by_what_its_aliases_add(
    tmp_path: Path,
) -> None:
    # A generated 20,000-step chain holds 120,000 values and no alias: it was refused as a
    # bomb, for every value counted (issue 25).
    big, bomb = tmp_path / "big.yaml", tmp_path / "bomb.yaml"
    big.write_text(chain(20_000))
    bomb.write_text(BOMB)
    runner = CliRunner()

    valid = runner.invoke(app, ["validate", str(big)])
    refused = runner.invoke(app, ["validate", str(bomb)])

    assert valid.exit_code == 0, valid.stderr
    assert valid.stdout == f"OK: {big} (chain, 20000 steps)\n"
    assert refused.exit_code == 2
    assert "alias bomb" in refused.stderr


def test_aliases_add_up_wherever_they_are_expanded(tmp_path: Path) -> None:
    # A bomb defined and expanded in a mapping's key (which becomes text), and mappings that
    # merge one (`<<`): each copy counts.
    levels = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"&{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in itertools.pairwise("abcdefg")]
    in_key = f"? [{', '.join(levels)}]\n: x\nid: bomb\nsteps: [{{id: s, goal: go}}]\n"
    merged = "\n".join(
        ["base: &base {" + ", ".join(f"k{i}: {i}" for i in range(400)) + "}", "id: merged"]
        + [f"m{i}: {{<<: *base}}" for i in range(400)]
        + ["steps: [{id: s, goal: go}]"]
    )
    for name, text in [("key", in_key), ("merged", merged)]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        [problem] = problems_of(path)
        assert "once they are expanded" in problem


def test_the_cli_says_it_with_exit_code_2_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "alias bomb" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe{}", "is not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
        (json.dumps({"format": "minions.recording/1", "calls": []}).encode(), "'calls' and"),
        (
            json.dumps({"format": "minions.recording/1", "calls": {"s#1/1": {}}}).encode(),
            "call 's#1/1': needs a 'response' (or an 'error') object",
        ),
        (
            json.dumps(
                {
                    "format": "minions.recording/1",
                    "calls": {"s#1/1": {"response": {"tool_calls": [{"name": 3}]}}},
                }
            ).encode(),
            "'tool_calls' must be a list of objects",
        ),
    ],
)
def test_bad_recordings_are_named(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "bad.recording.json"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        Recording.load(path)
