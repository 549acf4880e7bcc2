"""Fuzzing the loaders: recipes and recordings mutated byte by byte and value by value. The
loader returns a recipe (a recording) or raises `RecipeError` (`RecordingError`), never
another exception, in bounded time and memory."""

from __future__ import annotations

import copy
import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minions.errors import RecipeError, RecordingError
from minions.models import Recording
from minions.recipes import load_recipe_file

ROOT = Path(__file__).parent.parent
RECIPES = sorted(ROOT.glob("examples/*/recipe.yaml"))
RECORDINGS = sorted(ROOT.glob("examples/*/recipe.recording.json"))
SMALL = b"""\
id: small
inputs: {n: {type: integer, default: 2}}
steps:
  - {id: a, goal: "Count to {{ inputs.n }}.", output: {count: 0}}
  - id: b
    depends_on: [a]
    tool: current_datetime
    loop: "{{ a.output.count }}"
    next: [{step: a, when: "output.iso == 'x'"}]
"""
MEMORY_LIMIT = 64_000_000
"""Bytes a single load may allocate at its peak (an alias bomb would take gigabytes)."""

FUZZ = settings(
    max_examples=int(os.environ.get("MINIONS_FUZZ_EXAMPLES", "120")),
    deadline=3000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize="MINIONS_FUZZ_EXAMPLES" not in os.environ,
)

# -- mutations -----------------------------------------------------------------------------

BYTES = st.sampled_from([*(p.read_bytes() for p in RECIPES), SMALL])


@st.composite
def byte_mutations(draw: st.DrawFn, source: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(source))
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        operation = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "repeat"]))
        if operation == "flip":
            data[at] = draw(st.integers(0, 255))
        elif operation == "insert":
            data[at:at] = draw(
                st.sampled_from(
                    [
                        b"&a ",
                        b"*a",
                        b"{{",
                        b"}}",
                        b"[",
                        b"]",
                        b"\x00",
                        b"\xff\xfe",
                        b": ",
                        b"\n  - ",
                        b"!!python/object:os.system ",
                        b"<<: *a\n",
                    ]
                )
            )
        elif operation == "delete":
            del data[at : at + draw(st.integers(1, 40))]
        elif operation == "truncate":
            del data[at:]
        else:
            data[at:at] = data[at : at + draw(st.integers(1, 200))] * draw(st.integers(1, 50))
    return bytes(data)


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["{{", "{{ }}", "{{ a.output ", "{{ nope.output }}", "!x", "os:system"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just({"deep": _nested(70)}),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@st.composite
def structure_mutations(draw: st.DrawFn, documents: list[Any]) -> Any:
    document = copy.deepcopy(draw(st.sampled_from(documents)))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(document)
        path = draw(st.sampled_from(paths))
        if not path:
            document = copy.deepcopy(draw(ODD_VALUES))
            continue
        parent: Any = document
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        operation = draw(st.sampled_from(["replace", "delete", "duplicate", "rename"]))
        if operation == "replace":
            parent[last] = copy.deepcopy(draw(ODD_VALUES))
        elif operation == "delete":
            del parent[last]
        elif operation == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = parent.pop(last)
    return document


def _raised(expected: type[Exception], call: Any, *args: Any, **kwargs: Any) -> Exception | None:
    """The `expected` error `call` raised, or None; any other exception propagates."""
    try:
        call(*args, **kwargs)
    except expected as exc:
        return exc
    return None


def bounded(load: Any, *args: Any, **kwargs: Any) -> Any:
    tracemalloc.start()
    try:
        return load(*args, **kwargs)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MEMORY_LIMIT, f"a load took {peak / 1e6:.0f} MB"


# -- recipes -------------------------------------------------------------------------------


def _load_recipe(folder: Path, data: bytes) -> None:
    path = folder / "fuzzed.yaml"
    path.write_bytes(data)
    # No imports: mutated `tools:` could name any module; imports are not the loader.
    error = _raised(
        RecipeError, bounded, load_recipe_file, path, import_tools=False, workspace=folder
    )
    if isinstance(error, RecipeError):
        assert error.problems, "a RecipeError names its problems"
        assert all(str(p) for p in error.problems)


@FUZZ
@given(data=byte_mutations(BYTES))
def test_recipes_mutated_byte_by_byte(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    _load_recipe(tmp_path_factory.mktemp("fuzz"), data)


RECIPE_DOCUMENTS = [yaml.safe_load(p.read_text()) for p in RECIPES] + [yaml.safe_load(SMALL)]


@FUZZ
@given(document=structure_mutations(RECIPE_DOCUMENTS))
def test_recipes_mutated_value_by_value(
    tmp_path_factory: pytest.TempPathFactory, document: Any
) -> None:
    text = yaml.safe_dump(document, allow_unicode=True, width=10**6)
    _load_recipe(tmp_path_factory.mktemp("fuzz"), text.encode())


# -- recordings ----------------------------------------------------------------------------


def _load_recording(folder: Path, data: bytes) -> None:
    path = folder / "fuzzed.recording.json"
    path.write_bytes(data)
    error = _raised(RecordingError, bounded, Recording.load, path)
    assert error is None or str(error)


@FUZZ
@given(data=byte_mutations(st.sampled_from([p.read_bytes() for p in RECORDINGS])))
def test_recordings_mutated_byte_by_byte(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    _load_recording(tmp_path_factory.mktemp("fuzz"), data)


RECORDING_DOCUMENTS = [json.loads(p.read_text()) for p in RECORDINGS]


@FUZZ
@given(document=structure_mutations(RECORDING_DOCUMENTS))
def test_recordings_mutated_value_by_value(
    tmp_path_factory: pytest.TempPathFactory, document: Any
) -> None:
    try:
        text = json.dumps(document)
    except ValueError:
        return
    _load_recording(tmp_path_factory.mktemp("fuzz"), text.encode())
