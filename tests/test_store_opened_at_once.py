"""Processes that make a new run store at once (`minions worker &` then `minions submit`, as
the README does) each find it whole: on SQLite the driver committed each CREATE TABLE on its
own, and an opener meanwhile saw the tables without their schema version ("damaged"), made
them twice, or was told the file was locked while another set it to WAL."""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa

from minions.runs._db import Database
from minions.runs._tables import SCHEMA_VERSION, meta_table

OPENERS = 8
VERSIONS = sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")


def open_at_once(url: str) -> list[str]:
    """`OPENERS` threads (each its own connections) open `url` together; their errors."""
    start = threading.Barrier(OPENERS)
    errors: list[str] = []

    def open_() -> None:
        start.wait()
        try:
            Database(url, create=True).close()
        except Exception as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=open_) for _ in range(OPENERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def made_whole_at_once(url: str) -> bool:
    """Whether every opener of `url` at once succeeded and the store has one version, ours."""
    if errors := open_at_once(url):
        raise AssertionError(errors)
    store = Database(url)
    with store.read() as db:
        versions = db.execute(VERSIONS).scalars().all()
    store.close()
    return versions == [str(SCHEMA_VERSION)]


def test_threads_making_a_new_sqlite_store_at_once_each_find_it_whole(tmp_path: Path) -> None:
    for attempt in range(10):  # before the fix, each of these failed
        url = f"sqlite:///{tmp_path / str(attempt) / 'minions.db'}"
        assert made_whole_at_once(url), attempt


def test_threads_making_a_new_postgres_store_at_once_each_find_it_whole(postgres: str) -> None:
    from postgres import fresh_database

    for attempt in range(3):
        url = fresh_database(postgres, f"at_once_{attempt}")
        assert made_whole_at_once(url), attempt
