"""A limits file that cannot be limits (not UTF-8, `/dev/zero`, a folder, a FIFO, a huge file,
YAML that does not build) is a clear error naming the file: `ConfigError` in Python, exit 2
with no traceback on the command line; read within a bound, never blocking."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from typer.testing import CliRunner

from minions.cli import app
from minions.errors import ConfigError
from minions.models import Limits
from minions.models._limits import MAX_LIMITS_BYTES

T = TypeVar("T")


def not_utf8(folder: Path) -> Path:
    path = folder / "limits.yaml"
    path.write_bytes(b"endpoints: []\n# caf\xe9\n")
    return path


def a_folder(folder: Path) -> Path:
    path = folder / "limits.d"
    path.mkdir()
    return path


def huge(folder: Path) -> Path:
    path = folder / "limits.yaml"
    with path.open("wb") as file:
        file.truncate(MAX_LIMITS_BYTES * 4)  # sparse: costs no disk
    return path


def a_fifo(folder: Path) -> Path:
    path = folder / "limits.fifo"
    os.mkfifo(path)
    return path


def bad_date(folder: Path) -> Path:
    path = folder / "limits.yaml"
    path.write_text("capability_expiry: 2001-13-45\n")
    return path


def deep(folder: Path) -> Path:
    path = folder / "limits.yaml"
    path.write_text("endpoints: " + "[" * 50_000 + "]" * 50_000 + "\n")
    return path


def dev_zero(folder: Path) -> Path:
    return Path("/dev/zero")


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "not UTF-8": (not_utf8, "not UTF-8 text (byte 19 cannot be read)"),
    "/dev/zero": (dev_zero, "a character device, not a regular file"),
    "a folder": (a_folder, "a folder, not a regular file"),
    "a FIFO": (a_fifo, "a FIFO (named pipe), not a regular file"),
    "huge": (huge, "larger than 1 MiB"),
    "a bad date": (bad_date, "is not valid YAML: month must be in 1..12"),
    "deep": (deep, "is not valid YAML"),
    "missing": (lambda folder: folder / "nowhere.yaml", "no such file"),
}


def within_bounds(call: Callable[[], T], path: Path) -> T:
    """`call()`'s result, from a thread: a read that blocks (on a FIFO) fails the test instead
    of hanging it."""
    results: list[T] = []
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():  # let a reader blocked on a FIFO go, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join()
        raise AssertionError(f"reading {path} blocked")
    [result] = results
    return result


def load_error(path: Path) -> BaseException | None:
    try:
        Limits.load(path)
    except BaseException as exc:  # the test says what it was
        return exc
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_a_limits_file_that_cannot_be_limits_is_a_clear_error(tmp_path: Path, case: str) -> None:
    make, said = CASES[case]
    path = make(tmp_path)
    error = within_bounds(lambda: load_error(path), path)
    assert isinstance(error, ConfigError), repr(error)
    message = str(error)
    assert f"the limits file {str(path)!r}" in message
    assert said in message
    assert len(message) < 500


@pytest.mark.parametrize("command", ["run", "worker"])
@pytest.mark.parametrize("case", ["not UTF-8", "/dev/zero", "a FIFO", "huge"])
def test_the_commands_say_it_with_exit_2(tmp_path: Path, case: str, command: str) -> None:
    make, said = CASES[case]
    path = make(tmp_path)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("id: ask\nsteps:\n  - {id: ask, goal: say hi}\n")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    args = {
        "run": ["run", str(recipe), "--model", "test"],
        "worker": ["worker", "--database-url", url],
    }[command]
    result = within_bounds(lambda: CliRunner().invoke(app, [*args, "--limits", str(path)]), path)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs.db").exists()  # nothing started


def test_many_problems_are_said_in_a_bounded_message(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("endpoints:\n" + "  - {match: nowhere}\n" * 5_000)
    error = load_error(path)
    assert isinstance(error, ConfigError), repr(error)
    message = str(error)
    assert message.count("endpoints.") == 10
    assert message.endswith("and 4,990 more")
