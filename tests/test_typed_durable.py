"""Durable runs and deps: never stored, made by the worker's factory for each run it starts or
resumes; a run whose tools need deps the worker cannot make fails saying so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from minions.runs import RunStore
from minions.runs._async import AsyncDatabase
from minions.runs._db import Database
from minions.runs._runner import RunExecutor

TOOLS = '''\
from dataclasses import dataclass

from minions import ToolContext, tool


@dataclass
class Deps:
    user: str
    secret: str


@tool
def whoami(ctx: ToolContext[Deps]) -> str:
    """Who runs this, and how long their secret is."""
    return f"{ctx.deps.user} ({len(ctx.deps.secret)})"
'''

RECIPE = "id: who\ntools: [tools]\nsteps:\n  - {id: who, tool: whoami}\n"


async def run_with(tmp_path: Path, deps: Callable[[], object] | None) -> tuple[RunStore, str]:
    (tmp_path / "tools.py").write_text(TOOLS)
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(tmp_path / "recipe.yaml")
    async_store = AsyncDatabase(Database(url), patient=True)
    try:
        runner = RunExecutor(async_store, executor_id="w", incarnation="w", deps=deps)
        try:
            await runner.execute(run_id, 1)
        except Exception:
            pass  # a failed run is recorded as failed (and raised to DBOS)
    finally:
        async_store.close()
    return store, run_id


async def test_a_worker_makes_each_runs_deps_and_never_stores_them(tmp_path: Path) -> None:
    made: list[str] = []

    def factory() -> object:
        made.append("deps")
        return SimpleNamespace(user="ada", secret="s3cr3t-never-stored")  # what Deps has

    store, run_id = await run_with(tmp_path, factory)
    record = await store.get(run_id)
    assert record.status == "completed", record.error
    assert made == ["deps"]
    assert [s.output for s in record.steps] == ["ada (19)"]
    files = [p for p in (tmp_path / "store").iterdir() if p.is_file()]  # the WAL too
    assert files
    assert not [p for p in files if b"s3cr3t-never-stored" in p.read_bytes()]


async def test_a_run_whose_tools_need_deps_fails_without_a_factory(tmp_path: Path) -> None:
    store, run_id = await run_with(tmp_path, None)
    record = await store.get(run_id)
    assert record.status == "failed"
    assert record.error is not None
    assert "reads ctx.deps, and this run was given none" in record.error
    assert "durable Worker(deps=...)" in record.error


async def test_a_factory_that_raises_fails_the_run_saying_so(tmp_path: Path) -> None:
    def broken() -> object:
        raise ConnectionError("the database is down")

    store, run_id = await run_with(tmp_path, broken)
    record = await store.get(run_id)
    assert record.status == "failed"
    assert record.error == (
        "the worker's deps factory failed: ConnectionError: the database is down"
    )
