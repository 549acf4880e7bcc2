"""A damaged run store (rows changed by hand, a file a failed disk left) is named in one line:
which row, which value, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from runs_helpers import insert_run
from typer.testing import CliRunner

from minions.cli._app import app
from minions.runs._db import Database


def store_with_a_run(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    database = Database(url, create=True)
    insert_run(database, "r1")
    database.close()
    return url


def damage(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as db:
        for statement in statements:
            db.execute(sa.text(statement))
    engine.dispose()


def said(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--database-url", url])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("column", "value"), [("inputs", "{broken"), ("output", "[1"), ("usage", "nan-ish")]
)
@pytest.mark.parametrize("command", [("runs", "list"), ("runs", "show", "r1")])
def test_a_row_that_is_not_json_is_named(
    tmp_path: Path, column: str, value: str, command: tuple[str, ...]
) -> None:
    url = store_with_a_run(tmp_path)
    damage(url, f"UPDATE minions_runs SET {column} = '{value}'")
    code, text = said(url, *command)
    assert code != 0
    assert "the run store" in text
    assert f"is damaged: run r1's {column}: not JSON" in text


@pytest.mark.parametrize(
    ("statement", "words"),
    [
        ("UPDATE minions_meta SET value = 'six' WHERE key = 'schema_version'", "'six' is not a"),
        ("UPDATE minions_meta SET value = '' WHERE key = 'schema_version'", "is not a whole"),
        ("DELETE FROM minions_meta", "minions_meta has no schema_version"),
    ],
)
def test_a_bad_meta_row_is_named(tmp_path: Path, statement: str, words: str) -> None:
    url = store_with_a_run(tmp_path)
    damage(url, statement)
    code, text = said(url, "runs", "list")
    assert code != 0
    assert "is damaged" in text
    assert words in text


def test_a_file_whose_pages_a_disk_damaged_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    database = Database(url, create=True)
    for n in range(200):
        insert_run(database, f"r{n}")
    database.close()
    path = tmp_path / "runs.db"
    data = bytearray(path.read_bytes())
    for offset in range(len(data) - 4096 * 3, len(data), 4096):  # the last pages: runs
        data[offset : offset + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))
    code, text = said(url, "runs", "list")
    assert code != 0
    assert "is damaged: database disk image is malformed" in text


def test_a_file_that_is_no_database_is_named(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(b"not a database at all" * 500)
    code, text = said(f"sqlite:///{path}", "runs", "list")
    assert code != 0
    assert "is not a minions run store: file is not a database" in text
