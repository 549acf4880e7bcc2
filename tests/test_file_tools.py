"""File tools are bounded: no link (symbolic or hard) leads them outside the workspace, even
one swapped in during a call; no `.env` is written; long names, deep paths and huge
patterns are clear `ToolError`s; and no message names the host's path."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from minions.errors import ToolError
from minions.tools import ToolRegistry, _builtin, file_tools


def tools(workspace: Path) -> dict[str, Callable[..., Any]]:
    registry = ToolRegistry(file_tools(workspace))
    found = {name: registry.get(name) for name in ("read_file", "write_file", "list_files")}
    return {name: t.fn for name, t in found.items() if t is not None}


def refused(call: Callable[..., Any], *args: Any, host: Path, **kwargs: Any) -> str:
    """The message of the `ToolError` the call raises; it never names the host's path."""
    with pytest.raises(ToolError) as raised:
        call(*args, **kwargs)
    message = str(raised.value)
    assert str(host) not in message
    return message


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return workspace, outside


def test_a_link_swapped_in_during_writes_never_leads_outside(places: tuple[Path, Path]) -> None:
    workspace, outside = places
    write = tools(workspace)["write_file"]
    (workspace / "d").mkdir()
    (workspace / "a.txt").write_text("a")
    stop = threading.Event()
    swaps = 0
    racer_errors: list[BaseException] = []

    def put_back() -> None:
        # A write may have made a folder d meanwhile: the real one goes back anyway.
        while True:
            try:
                os.rename(workspace / "d.aside", workspace / "d")
                return
            except OSError:
                with contextlib.suppress(OSError):  # the writes go on meanwhile
                    if (workspace / "d").is_symlink():
                        (workspace / "d").unlink()
                    elif (workspace / "d").is_dir():
                        shutil.rmtree(workspace / "d")

    def swap() -> None:
        # Turn a.txt into a link to the secret and back, and the folder d into a link to the
        # outside folder and back, as fast as possible.
        nonlocal swaps
        try:
            while not stop.is_set() and swaps < 200_000:
                os.symlink(outside / "secret.txt", workspace / "a.link")
                os.replace(workspace / "a.link", workspace / "a.txt")
                os.rename(workspace / "d", workspace / "d.aside")
                with contextlib.suppress(FileExistsError):
                    os.symlink(outside, workspace / "d")
                (workspace / "a.plain").write_text("a")
                os.replace(workspace / "a.plain", workspace / "a.txt")
                put_back()
                swaps += 1
        except BaseException as exc:  # the test says so, rather than a thread warning
            racer_errors.append(exc)

    racer = threading.Thread(target=swap)
    racer.start()
    written = 0
    refusals: list[str] = []
    try:
        for i in range(10_000):
            try:
                write(path="a.txt" if i % 2 else "d/b.txt", content="pwned")
                written += 1
            except ToolError as exc:
                refusals.append(str(exc))
    finally:
        stop.set()
        racer.join()
    assert racer_errors == []
    reasons = {r.split(" ", 1)[1] for r in refusals}
    assert reasons <= {
        "is a symbolic link; file tools never follow links (use the path it points to, "
        "inside the workspace).",
        "is a file, not a folder.",
        "folder for 'd/b.txt' in the workspace.",
    }, reasons
    assert swaps > 0
    assert written > 0
    assert (outside / "secret.txt").read_text() == "secret"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_hard_link_to_an_outside_file_is_neither_read_nor_written(
    places: tuple[Path, Path],
) -> None:
    workspace, outside = places
    os.link(outside / "secret.txt", workspace / "linked.txt")
    found = tools(workspace)
    for call, kwargs in [(found["read_file"], {}), (found["write_file"], {"content": "pwned"})]:
        message = refused(call, path="linked.txt", host=workspace, **kwargs)
        assert message == (
            "'linked.txt' has other hard links (it may be a file outside the workspace); file "
            "tools never read or write such a file."
        )
    assert (outside / "secret.txt").read_text() == "secret"  # not even truncated


@pytest.mark.parametrize("name", [".env", ".env.local", "sub/.env", ".ENV"])
def test_a_dotenv_is_never_written(tmp_path: Path, name: str) -> None:
    message = refused(tools(tmp_path)["write_file"], path=name, content="KEY=x", host=tmp_path)
    assert "would be a .env file, which holds secrets; file tools never write one" in message
    assert list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize(
    ("tool_name", "arguments", "expected"),
    [
        (
            "write_file",
            {"path": "n" * 300, "content": "x"},
            f"The name '{'n' * 100}...' in the path is 300 bytes long; a file or folder name "
            "has at most 255.",
        ),
        (
            "read_file",
            {"path": "é" * 200},
            f"The name '{'é' * 100}...' in the path is 400 bytes long",
        ),
        (
            "write_file",
            {"path": "a/" * 2100 + "x.txt", "content": "x"},
            f"The path '{'a/' * 50}...' is 2,101 levels deep; file tools go at most 64 levels",
        ),
        (
            "list_files",
            {"path": "a/" * 65},
            f"The path '{'a/' * 50}...' is 65 levels deep",
        ),
        (
            "write_file",
            {"path": ".", "content": "x"},
            "'.' is the workspace folder itself; write_file needs a file's path",
        ),
        ("write_file", {"path": "a/..", "content": "x"}, "'.' is the workspace folder itself"),
        ("read_file", {"path": "./"}, "'.' is the workspace folder; give a file's path"),
        ("write_file", {"path": "\ud800.txt", "content": "x"}, "The path '\\ud800.txt' holds"),
    ],
)
def test_impossible_paths_are_clear_tool_errors(
    tmp_path: Path, tool_name: str, arguments: dict[str, Any], expected: str
) -> None:
    message = refused(tools(tmp_path)[tool_name], host=tmp_path, **arguments)
    assert message.startswith(expected)
    assert list(tmp_path.rglob("*")) == []


def test_a_path_longer_than_the_system_takes_whole_works_name_by_name(tmp_path: Path) -> None:
    # 40 folders of 200 characters: 8,000 characters, twice PATH_MAX; each call opens one
    # name at a time, so the file tools neither fail nor reach outside on such a path.
    deep = "/".join(["f" * 200] * 40) + "/notes.txt"
    found = tools(tmp_path)
    assert found["write_file"](path=deep, content="deep") == {"path": deep, "bytes": 4}
    assert found["read_file"](path=deep) == "deep"
    assert found["list_files"](pattern="**/*.txt") == [deep]


def test_folders_and_other_things_that_are_not_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "plain.txt").write_text("x")
    os.mkfifo(tmp_path / "pipe")  # opening it must not wait for a writer
    found = tools(tmp_path)
    assert refused(found["write_file"], path="sub/", content="x", host=tmp_path) == (
        "'sub' is a folder, not a file."
    )
    assert (
        refused(found["read_file"], path="sub", host=tmp_path) == "'sub' is a folder, not a file."
    )
    assert refused(found["read_file"], path="pipe", host=tmp_path).startswith(
        "'pipe' is not a regular file"
    )
    assert refused(found["write_file"], path="pipe", content="x", host=tmp_path).startswith(
        "'pipe' is not a regular file"
    )
    assert refused(found["write_file"], path="plain.txt/x", content="x", host=tmp_path) == (
        "'plain.txt' is a file, not a folder."
    )
    assert refused(found["list_files"], path="plain.txt", host=tmp_path) == (
        "'plain.txt' is a file, not a folder."
    )
    assert refused(found["list_files"], path="nowhere", host=tmp_path) == (
        "No folder 'nowhere' in the workspace."
    )


def test_every_os_error_is_a_tool_error_naming_the_workspace_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    found = tools(tmp_path)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "notes" / "a.txt"))

    monkeypatch.setattr(_builtin._Workspace, "check", broken)
    assert refused(found["read_file"], path="notes/a.txt", host=tmp_path) == (
        "'notes/a.txt': Input/output error."
    )
    assert refused(found["write_file"], path="notes/a.txt", content="y", host=tmp_path) == (
        "'notes/a.txt': Input/output error."
    )
    monkeypatch.setattr(_builtin, "_walk", broken)
    assert refused(found["list_files"], path="notes", host=tmp_path) == (
        "'notes': Input/output error."
    )


def test_a_huge_recursive_pattern_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c.txt").write_text("x")
    (tmp_path / "top.txt").write_text("x")
    listing = tools(tmp_path)["list_files"]
    message = refused(listing, pattern="**/" * 10_000 + "*", host=tmp_path)
    assert (
        message
        == "The pattern is 30,001 characters long; a pattern has at most 256, such as '**/*.md'."
    )
    # Up to the bound, repeated ** mean one: matched level by level, never recursively.
    assert listing(pattern="**/" * 80 + "*.txt") == ["a/b/c.txt", "top.txt"]
    assert listing(pattern="a/**/*.txt") == ["a/b/c.txt"]
    assert listing(pattern="*/b/*") == ["a/b/c.txt"]
    assert listing(pattern="*" + "*a" * 100 + "*b") == []  # no backtracking blow-up
    assert refused(listing, pattern="../*", host=tmp_path) == (
        "The pattern '../*' must stay inside the folder (no '..')."
    )


def test_listing_never_goes_through_links_and_stops_at_its_bounds(
    places: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace, outside = places
    (workspace / "out").symlink_to(outside)
    for i in range(5):
        (workspace / f"f{i}.txt").write_text("x")
    listing = tools(workspace)["list_files"]
    assert listing(pattern="**/*") == [f"f{i}.txt" for i in range(5)]
    monkeypatch.setattr(_builtin, "MAX_LISTED", 3)
    listed = listing(pattern="**/*")
    assert len(listed) == 4
    assert listed[3] == "[cut: more files than the 3 listed; narrow the folder or the pattern]"
