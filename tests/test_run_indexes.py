"""The runs' indexes (schema 14): a run's insert and its status changes write only the index
pages its looks need. The runs by status are read through the index by status and end (schema
12); the index by schedule holds only the runs a schedule fired. A store made before gets the
same indexes as a new one."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from runs_helpers import insert_run

from minions.runs._db import Database
from minions.runs._tables import SCHEMA_VERSION, meta_table


def indexes(database: Database) -> dict[str, str]:
    with database.read() as db:
        rows = db.execute(
            sa.text(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                "AND tbl_name = 'minions_runs' AND sql IS NOT NULL"
            )
        ).all()
    return {name: " ".join(sql.split()) for name, sql in rows}


def plan(database: Database, where: str) -> str:
    with database.read() as db:
        rows = db.execute(
            sa.text(f"EXPLAIN QUERY PLAN SELECT run_id FROM minions_runs WHERE {where}")
        ).all()
    return " ".join(str(row) for row in rows)


def made_by_schema_13(url: str) -> None:
    """A store with a run, as schema 13 made it: an index of the runs by status alone, and
    one by schedule of every run."""
    made = Database(url, create=True)
    insert_run(made, "before")
    with made.begin() as db:
        db.execute(meta_table.update().values(value="13"))
        db.execute(sa.text("DROP INDEX ix_minions_runs_schedule"))
        db.execute(sa.text("CREATE INDEX ix_minions_runs_schedule ON minions_runs (schedule)"))
        db.execute(sa.text("CREATE INDEX ix_minions_runs_status ON minions_runs (status)"))
    made.close()


def test_a_store_of_schema_13_gets_the_indexes_of_a_new_one(tmp_path: Path) -> None:
    new = Database(f"sqlite:///{tmp_path / 'new.db'}", create=True)
    url = f"sqlite:///{tmp_path / 'old.db'}"
    made_by_schema_13(url)
    old = Database(url)
    assert indexes(old) == indexes(new)
    assert "ix_minions_runs_status" not in indexes(old)
    assert indexes(old)["ix_minions_runs_schedule"].endswith("WHERE schedule IS NOT NULL")
    with old.read() as db:
        assert db.execute(sa.select(meta_table.c.value)).scalar() == str(SCHEMA_VERSION)
        assert db.execute(sa.text("SELECT run_id FROM minions_runs")).scalars().all() == ["before"]
    for database in (old, new):
        # Every look by status, or by schedule, still goes through an index.
        assert "ix_minions_runs_status_finished" in plan(database, "status = 'queued'")
        assert "ix_minions_runs_status_finished" in plan(
            database, "status IN ('queued', 'running', 'waiting')"
        )
        assert "ix_minions_runs_schedule" in plan(database, "schedule = 'nightly'")
        database.close()


def test_a_postgres_store_of_schema_13_gets_the_indexes_of_a_new_one(postgres: str) -> None:
    from postgres import fresh_database

    def named(database: Database) -> dict[str, str]:
        with database.read() as db:
            rows = db.execute(
                sa.text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'minions_runs'"
                )
            ).all()
        return {str(name): str(definition) for name, definition in rows}

    new = Database(fresh_database(postgres, "indexes_new"), create=True)
    url = fresh_database(postgres, "indexes_old")
    made_by_schema_13(url)
    old = Database(url)
    assert named(old) == named(new)
    assert "ix_minions_runs_status" not in named(old)
    assert named(old)["ix_minions_runs_schedule"].endswith("WHERE (schedule IS NOT NULL)")
    old.close()
    new.close()
