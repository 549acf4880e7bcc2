"""Usage by project, and kept apart by project: ``group_by=project`` in `RunStore.usage`,
``GET /usage`` and ``minions usage``; a key of project A never sees B's tokens, cost,
recipes, schedules or models in any grouping (day, recipe, schedule, model, project, and
the total), through the API, the CLI and the console (Chromium), against a store with model
calls in both; an admin and a key of both see both; a bad group is a 400 (exit 2) naming
the allowed ones."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from runs_helpers import insert_run, model_calls
from service_helpers import TOKEN, auth, write_recipes
from typer.testing import CliRunner

from minions.cli import app as cli
from minions.runs import RunStore
from minions.runs._db import Database
from minions.service import ServiceConfig, create_app

NOW = time.time()
PRICED = "https://api.openai.com/v1"  # an endpoint the price table knows
A, B = "team-a", "team-b"
GROUPS = ("day", "recipe", "schedule", "model", "project")

# Each project's runs: (run, recipe, schedule, [(model, prompt, answer)]), priced at PRICED.
RUNS = {
    A: [
        ("a-hand", "triage", None, [("gpt-4o", 1000, 100)]),
        ("a-night", "triage", "a-nightly", [("gpt-4o", 10, 1), ("gpt-4o", 20, 2)]),
    ],
    B: [
        ("b-hand", "b-secret-recipe", None, [("gpt-4o-mini", 7000, 700)]),
        ("b-night", "b-secret-recipe", "b-nightly", [("gpt-4.1-nano", 5000, 500)]),
    ],
}
MARKERS = ("b-secret-recipe", "b-nightly", "gpt-4o-mini", "gpt-4.1-nano", B)
"""What of B's a reader of A must never see (B's tokens are checked by value)."""


def _tokens(project: str) -> tuple[int, int, int]:
    calls = [c for *_, made in RUNS[project] for c in made]
    return sum(c[1] for c in calls), sum(c[2] for c in calls), len(calls)


def _store(url: str) -> None:
    database = Database(url, create=True)
    for project, made in RUNS.items():
        for run_id, recipe, schedule, calls in made:
            insert_run(database, run_id)
            with database.begin() as db:
                db.execute(
                    sa.text(
                        "UPDATE minions_runs SET recipe_id = :recipe, schedule = :schedule, "
                        "project = :project, status = 'completed', finished_at = :end "
                        "WHERE run_id = :run"
                    ),
                    {"recipe": recipe, "schedule": schedule, "project": project,
                     "end": NOW - 5, "run": run_id},
                )  # fmt: skip
            model_calls(database, run_id, [(m, PRICED, p, c, NOW - 60) for m, p, c in calls])
    database.close()


def _groupings() -> Iterator[str]:
    """Every grouping of one or two groups, and the total alone."""
    yield ""
    yield from GROUPS
    yield from (",".join(pair) for pair in itertools.permutations(GROUPS, 2))


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("usage")
    url = f"sqlite:///{folder / 'store' / 'minions.db'}"
    _store(url)
    return url


async def test_usage_groups_by_project_and_narrows_to_projects(url: str) -> None:
    _store(url)
    store = RunStore(url)
    try:
        every = await store.usage(since=NOW - 3600, group_by=["project", "model"])
        assert [(r.project, r.model, r.calls) for r in every.rows] == [
            (A, "gpt-4o", 3),
            (B, "gpt-4.1-nano", 1),
            (B, "gpt-4o-mini", 1),
        ]
        a_only = await store.usage(since=NOW - 3600, group_by=["project"], projects=[A])
        assert [r.project for r in a_only.rows] == [A]
        prompt, answer, calls = _tokens(A)
        assert (a_only.total.prompt_tokens, a_only.total.completion_tokens) == (prompt, answer)
        assert a_only.total.calls == calls
        assert a_only.total.cost == pytest.approx(prompt * 2.5e-6 + answer * 10e-6)
        none = await store.usage(since=NOW - 3600, group_by=["project"], projects=["nobody"])
        assert (none.rows, none.total.calls, none.total.cost) == ((), 0, None)
    finally:
        await store.aclose()


def test_a_key_of_one_project_never_sees_anothers_usage_in_any_grouping(
    store_url: str, tmp_path: Path
) -> None:
    async def keys() -> dict[str, str]:
        store = RunStore(store_url)
        try:
            made = {}
            for name, role, projects in (
                ("alice", "viewer", [A]),
                ("multi", "viewer", [A, B]),
                ("boss", "admin", []),
            ):
                made[name] = (await store.add_key(name, role=role, projects=projects)).key
            return made
        finally:
            await store.aclose()

    made = asyncio.run(keys())
    config = ServiceConfig(
        token=TOKEN, database_url=store_url, recipes=write_recipes(tmp_path / "r")
    )
    prompt, answer, calls = _tokens(A)
    all_prompt = prompt + _tokens(B)[0]
    with TestClient(create_app(config)) as client:
        for grouping in _groupings():
            got = client.get(
                "/usage", params={"since": "1h", "group_by": grouping}, headers=auth(made["alice"])
            )
            assert got.status_code == 200, (grouping, got.text)
            for marker in MARKERS:
                assert marker not in got.text, (grouping, marker)
            body = got.json()
            assert (body["total"]["prompt_tokens"], body["total"]["calls"]) == (prompt, calls)
            assert sum(r["prompt_tokens"] for r in body["rows"]) == (prompt if grouping else 0)
            assert sum(r["completion_tokens"] for r in body["rows"]) == (answer if grouping else 0)
            assert body["total"]["cost"] == pytest.approx(prompt * 2.5e-6 + answer * 10e-6)
            # The admin, the server's token and a key of both see both.
            for who in (made["boss"], TOKEN, made["multi"]):
                both = client.get(
                    "/usage", params={"since": "1h", "group_by": grouping}, headers=auth(who)
                ).json()
                assert both["total"]["prompt_tokens"] == all_prompt, grouping
        by_project = client.get(
            "/usage", params={"since": "1h", "group_by": "project"}, headers=auth(made["multi"])
        ).json()
        assert [(r["project"], r["prompt_tokens"]) for r in by_project["rows"]] == [
            (A, prompt),
            (B, _tokens(B)[0]),
        ]
        # A project of the key's narrows; one not its own is unknown (B is not confirmed).
        only_b = client.get(
            "/usage", params={"since": "1h", "project": B}, headers=auth(made["multi"])
        ).json()
        assert only_b["total"]["prompt_tokens"] == _tokens(B)[0]
        refused = client.get("/usage", params={"project": B}, headers=auth(made["alice"]))
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["type"] == "unknown_project"
        assert (
            client.get("/usage", params={"project": "no/such"}, headers=auth()).status_code == 422
        )
        # A bad group: a 400 naming the allowed ones.
        for bad in ("tenant", "project,project", "day,teams"):
            answer_ = client.get("/usage", params={"group_by": bad}, headers=auth(made["alice"]))
            assert answer_.status_code == 400, (bad, answer_.text)
            assert "day, recipe, schedule, model, project" in answer_.json()["error"]["message"]


def test_minions_usage_groups_by_project_and_shows_one_projects_alone(store_url: str) -> None:
    runner = CliRunner()

    def usage(*args: str) -> Any:
        done = runner.invoke(cli, ["usage", "--since", "1h", *args, "--database-url", store_url])
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout) if "--json" in args else done.stdout

    by_project = usage("--group-by", "project", "--json")
    assert [(r["project"], r["prompt_tokens"]) for r in by_project["rows"]] == [
        (A, _tokens(A)[0]),
        (B, _tokens(B)[0]),
    ]
    table = usage("--by", "project,model")
    assert A in table
    assert B in table
    prompt, answer, calls = _tokens(A)
    for grouping in _groupings():
        shown = usage("--project", A, "--by", grouping or "total", "--json")
        text = json.dumps(shown)
        for marker in MARKERS:
            assert marker not in text, (grouping, marker)
        assert (shown["total"]["prompt_tokens"], shown["total"]["calls"]) == (prompt, calls)
        assert shown["total"]["completion_tokens"] == answer
        assert B not in usage("--project", A, "--by", grouping or "total")
    for wrong in (["--by", "tenant"], ["--group-by", "model,model"], ["--project", "no/such"]):
        refused = runner.invoke(cli, ["usage", *wrong, "--database-url", store_url])
        assert refused.exit_code == 2, (wrong, refused.output)
        assert "Traceback" not in refused.output
    named = runner.invoke(cli, ["usage", "--by", "tenant", "--database-url", store_url])
    assert "day, recipe, schedule, model, project" in named.output


def test_the_consoles_usage_page_of_a_key_of_one_project_shows_its_projects_only(
    store_url: str, tmp_path: Path
) -> None:
    """In Chromium, logged in with a key of A: the usage page, in each of its groupings,
    shows A's tokens and nothing of B's (the page's HTML is searched)."""
    from browser_helpers import launch
    from playwright.sync_api import expect, sync_playwright
    from service_helpers import app_in_thread

    async def key() -> str:
        store = RunStore(store_url)
        try:
            return (await store.add_key("ann", role="viewer", projects=[A])).key
        finally:
            await store.aclose()

    key_of = asyncio.run(key())
    config = ServiceConfig(
        token=TOKEN, database_url=store_url, recipes=write_recipes(tmp_path / "r")
    )
    prompt = f"{_tokens(A)[0]:,}"
    with app_in_thread(create_app(config)) as base, sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto(f"{base}/")
            page.fill("#token", key_of)
            page.click("#login button")
            expect(page.locator("#app")).to_be_visible()
            page.click("#nav-usage")
            options = page.locator("#usage-by option")
            groupings = [options.nth(i).get_attribute("value") for i in range(options.count())]
            assert "project" in groupings
            for grouping in groupings:
                assert grouping is not None
                page.select_option("#usage-by", grouping)
                expect(page.locator("#usage-head th").first).to_have_text(grouping.split(",")[0])
                expect(page.locator("#usage tr.total")).to_contain_text(prompt)
                html = page.content()
                for marker in MARKERS:
                    assert marker not in html, (grouping, marker)
            expect(page.locator("#usage tbody tr:not(.total)").first).to_contain_text(A)
        finally:
            page.close()
            browser.close()


async def test_each_ended_attempt_is_paired_with_its_own_start_as_the_events_say(
    tmp_path: Path,
) -> None:
    from minions import events as ev
    from minions.runs._events import row_of

    def used(prompt: int, answer: int) -> ev.UsageRecord:
        return ev.UsageRecord(prompt_tokens=prompt, completion_tokens=answer, calls=1)

    asked = (ev.MessageRecord(role="user", text="hello"),)  # content captured: not needed
    told: list[ev.Event] = [
        # Two loop items' calls interleaved, the same turn and attempt: each by its step id.
        ev.ModelCallStarted(step_id="each[0]", model="gpt-4o", endpoint=PRICED, messages=asked),
        ev.ModelCallStarted(step_id="each[1]", model="qwen", endpoint="http://127.0.0.1:1/v1"),
        ev.ModelCallCompleted(step_id="each[1]", usage=used(50, 5)),
        # An attempt that failed with tokens spent counts, and so does its retry.
        ev.ModelCallFailed(step_id="each[0]", error="not JSON", usage=used(1000, 100)),
        ev.ModelCallStarted(step_id="each[0]", attempt=2, model="gpt-4o", endpoint=PRICED),
        ev.ModelCallCompleted(step_id="each[0]", attempt=2, usage=used(1000, 100)),
        # An end whose start is not stored: counted, its model and price unknown.
        ev.ModelCallCompleted(step_id="lost", usage=used(7, 7)),
        ev.ModelCallStarted(step_id="last", model="gpt-4o", endpoint=PRICED),  # in flight
    ]
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    database = Database(url, create=True)
    insert_run(database, "going")
    rows = [
        {"run_id": "going", **row_of(dataclasses.replace(e, seq=i, timestamp=NOW - 30))._asdict()}
        for i, e in enumerate(told, start=1)
    ]
    with database.begin() as db:
        db.execute(
            sa.text(
                "INSERT INTO minions_events (run_id, seq, kind, step_id, data) "
                "VALUES (:run_id, :seq, :kind, :step_id, :data)"
            ),
            rows,
        )
        db.execute(sa.text("UPDATE minions_runs SET status = 'running' WHERE run_id = 'going'"))
    database.close()
    store = RunStore(url)
    try:
        report = await store.usage(since=NOW - 60, group_by=["model"])
        rows_by = {r.model: r for r in report.rows}
        assert {m: (r.prompt_tokens, r.completion_tokens, r.calls) for m, r in rows_by.items()} == {
            None: (7, 7, 1),
            "gpt-4o": (2000, 200, 2),
            "qwen": (50, 5, 1),
        }
        assert rows_by["gpt-4o"].cost == pytest.approx(2000 * 2.5e-6 + 200 * 10e-6)
        assert (rows_by["qwen"].cost, rows_by["qwen"].unpriced_calls) == (None, 1)
        assert (rows_by[None].cost, rows_by[None].unpriced_calls) == (None, 1)
        # A running run's usage so far: every ended attempt's tokens.
        going = await store.get("going")
        assert going.usage == {
            "prompt_tokens": 2057,
            "completion_tokens": 212,
            "calls": 4,
            "unknown_calls": 0,
        }
    finally:
        await store.aclose()
