"""The console in a real browser: Debian's chromium driven by Playwright.

A person opens the page, gives the token (generated at the server's first start, printed
once), submits a run, watches its events arrive and its steps change colour, approves the call
it waits for, and sees it complete; a model's answer streams into the page as it is written.
The page follows a run with the browser's `EventSource`, opened with a stream ticket (never
the token in a URL), and closes it at the run's end: it never comes back.

An operator finds runs (by status, recipe, creation time and id, a page at a time), reads a
run's timeline (parallel steps side by side, loop items, a wait for a person, retries), opens
a step's calls, reads a failed step's error once and short (never the note meant for the
model), with the keyboard too, at a desktop's and a phone's width, light and dark.
Screenshots go to the test's folder (to docs/ with ``MINIONS_SCREENSHOTS=docs``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sqlite3
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest
from browser_helpers import MISSING, launch
from playwright.sync_api import Browser, Page, expect, sync_playwright
from runs_helpers import run_here
from service_helpers import (
    ANSWER,
    TOKEN,
    app_in_thread,
    auth,
    server,
    submit,
    write_chat_recipe,
    write_recipes,
)

from minions.errors import ModelError
from minions.runs import RunStore
from minions.runs._runner import RunFailedError
from minions.service import ServiceConfig, create_app
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest, ScriptedModel

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def test_a_missing_chromium_fails_the_tests_with_how_to_install_it(tmp_path: Path) -> None:
    with sync_playwright() as playwright, pytest.raises(pytest.fail.Exception) as failed:
        launch(playwright, str(tmp_path / "chromium"))
    assert str(failed.value) == MISSING.format(path=tmp_path / "chromium")
    assert "apt-get install chromium" in str(failed.value)


def test_a_person_runs_watches_and_approves_a_run_in_the_console(
    browser: Browser, tmp_path: Path
) -> None:
    release = threading.Event()

    def answer(request: FakeRequest) -> str:
        release.wait(60)  # until the page is watching: token deltas are live only
        return ANSWER

    recipes = write_recipes(tmp_path / "recipes")
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with FakeOpenAIServer(answer) as model:
        write_chat_recipe(recipes, model.url)
        with server(tmp_path, url, "--recipes", str(recipes), token=None) as service:
            # The token was generated, printed once on stdout, and kept owner-only.
            token = service.out.read_text().strip()
            kept = tmp_path / "store" / "api-token"
            assert kept.read_text().strip() == token
            assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            try:
                run_in_console(page, service.base, token, release, tmp_path)
            finally:
                page.close()
        # A second start reuses the token and prints it no more.
        with server(tmp_path, url, "--recipes", str(recipes), token=None) as again:
            assert again.out.read_text() == ""
            assert "API token: in" in again.log.read_text()


RECORD_SOURCES = """
window.__sources = [];
const Original = window.EventSource;
window.EventSource = class extends Original {
  constructor(...args) { super(...args); window.__sources.push(this); }
};
"""
"""Keeps every EventSource the page makes, to look at their state."""


def sources(page: Page) -> list[int]:
    """The states of the page's EventSources (1 open, 2 closed for good)."""
    states: list[int] = page.evaluate("window.__sources.map((s) => s.readyState)")
    return states


def log_in(page: Page, base: str, token: str, query: str = "") -> None:
    page.goto(f"{base}/{query}")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", token)
    page.click("#login button")
    expect(page.locator("#app")).to_be_visible()


def submit_in_console(page: Page, recipe: str, inputs: str) -> str:
    page.goto(page.url.split("#")[0] + "#/")
    if not page.locator("details.new-run").evaluate("(d) => d.open"):
        page.click("details.new-run summary")
    page.select_option("#recipe", recipe)
    page.fill("#inputs", inputs)
    page.click("#submit")
    expect(page.locator("#run-view")).to_be_visible()
    run_id = page.locator("#run-id").inner_text()
    assert len(run_id) == 32
    return run_id


def run_in_console(
    page: Page, base: str, token: str, release: threading.Event, artifacts: Path
) -> None:
    streams: list[tuple[str, str]] = []
    page.on(
        "request",
        lambda r: streams.append((r.url, r.resource_type)) if "/events/stream" in r.url else None,
    )
    page.add_init_script(RECORD_SOURCES)
    page.goto(base + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", "wrong")
    page.click("#login button")
    expect(page.locator("#login-error")).to_have_text("the token was refused")
    page.fill("#token", token)
    page.click("#login button")
    expect(page.locator("#app")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('minions-token')") == token

    # Submit a run that waits for a person.
    run_id = submit_in_console(page, "release", '{"text": "go"}')

    # Its events arrive; the step waits, coloured so, with the call to approve.
    expect(page.locator('#events li[data-kind="approval_requested"]')).to_have_count(1)
    expect(page.locator('#graph g[data-step="say"]')).to_have_attribute("data-status", "waiting")
    expect(page.locator("#run-status")).to_have_text("waiting")
    approval = page.locator("#approvals .approval")
    expect(approval).to_contain_text('step say wants to call shout({"text":"go"})')
    page.screenshot(path=str(artifacts / "console-waiting.png"), full_page=True)
    assert sources(page) == [1]  # an EventSource follows the run, live
    approval.locator("button.approve").click()

    # It completes: every step green, the output shown, the wait marked on the timeline.
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator('#events li[data-kind="run_completed"]')).to_have_count(1)
    for step in ("say", "after"):
        expect(page.locator(f'#graph g[data-step="{step}"]')).to_have_attribute(
            "data-status", "completed"
        )
    expect(page.locator("#run-output")).to_have_text("DONE")
    expect(page.locator('#steps tr[data-step="say"]')).to_contain_text("GO")
    expect(page.locator('#timeline .tl-row[data-step="say"] .tl-wait')).to_have_count(1)
    seqs = page.locator("#events li .seq").all_inner_texts()
    assert [int(s) for s in seqs] == list(range(1, len(seqs) + 1))
    # The run ended: its EventSource was closed for good, having connected once, with a
    # ticket in its URL and never the token.
    page.wait_for_function("window.__sources.every((s) => s.readyState === 2)")
    assert sources(page) == [2]
    assert len(streams) == 1
    url, kind = streams[0]
    assert kind == "eventsource"
    assert f"/runs/{run_id}/events/stream?ticket=" in url
    assert token not in url
    page.click("a.back")
    expect(page.locator(f'#runs tr[data-run="{run_id}"]')).to_contain_text("completed")

    # A model's answer streams in as it is written.
    submit_in_console(page, "chat", "{}")
    expect(page.locator('#events li[data-kind="model_call_started"]')).to_have_count(1)
    release.set()
    expect(page.locator('#tokens pre[data-step="answer"]')).to_have_text(ANSWER)
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#run-usage")).to_contain_text("1 model calls")
    page.screenshot(path=str(artifacts / "console-streaming.png"), full_page=True)
    page.wait_for_function("window.__sources.every((s) => s.readyState === 2)")
    assert sources(page) == [2, 2]
    assert len(streams) == 2


# -- an operator's view ---------------------------------------------------------------------

FANOUT = """\
id: fanout
description: Three steps side by side, then a loop of three items, two at a time.
tools: [tools]
steps:
  - {id: start, tool: mark, params: {run: fan, step: start}}
  - {id: north, depends_on: [start], tool: mark, params: {run: fan, step: north, seconds: 0.4}}
  - {id: south, depends_on: [start], tool: mark, params: {run: fan, step: south, seconds: 0.4}}
  - {id: west, depends_on: [start], tool: mark, params: {run: fan, step: west, seconds: 0.4}}
  - id: each
    depends_on: [north, south, west]
    loop: [a, b, c]
    parallel: 2
    tool: mark
    params: {run: fan, step: "{{ loop.item }}", seconds: 0.2}
  - {id: done, depends_on: [each], tool: mark, params: {run: fan, step: done}}
"""

BRIEF = """\
id: brief
description: A model whose answers are always cut off at the length limit.
model: openai-compatible:fake-model@{url}/v1
steps:
  - id: essay
    goal: Write a long essay.
    config: {{retry_initial_delay: 0.0}}
"""

NOTE_TO_THE_MODEL = "Answer again"


def answers(request: FakeRequest) -> FakeReply:
    """The operator's model: a cut-off answer to the essay, a short one to the rest."""
    text = " ".join(str(m.get("content") or "") for m in request.messages)
    if "long essay" in text:
        return FakeReply.cut_off("Once upon a time")
    return FakeReply.text(ANSWER)


@pytest.fixture
def operator(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A server with runs of every kind finished: their ids by name."""
    recipes = write_recipes(tmp_path / "recipes")
    (recipes / "fanout.yaml").write_text(FANOUT)
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with FakeOpenAIServer(answers) as model:
        write_chat_recipe(recipes, model.url)
        (recipes / "brief.yaml").write_text(BRIEF.format(url=model.url))
        env = {"LEDGER": str(tmp_path / "ledger.txt"), "FLAKY_OK": str(tmp_path / "ok")}
        with (
            server(tmp_path, url, "--recipes", str(recipes), **env) as service,
            httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client,
        ):
            runs = {
                "ledger": submit(client, "ledger", tag="one"),
                "flaky": submit(client, "flaky"),
                "fanout": submit(client, "fanout"),
                "brief": submit(client, "brief"),
                "chat": submit(client, "chat"),
                "release": submit(client, "release", text="hold"),
            }
            for name, run_id in runs.items():
                until_settled(client, run_id, "waiting" if name == "release" else None)
            yield service.base, runs


def until_settled(client: httpx2.Client, run_id: str, status: str | None) -> None:
    """Follow the run's stream until it ends (or asks for approval)."""
    with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
        for line in response.iter_lines():
            if line in ("event: run_completed", "event: run_failed"):
                return
            if status == "waiting" and line == "event: approval_requested":
                return


def test_an_operator_finds_runs_and_reads_what_happened_when_and_why(
    browser: Browser, operator: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    base, runs = operator
    shots = DOCS if os.environ.get("MINIONS_SCREENSHOTS") == "docs" else tmp_path
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        log_in(page, base, TOKEN, "?page_size=4")
        find_runs(page, runs)
        read_a_parallel_run(page, runs["fanout"])
        shoot(page, shots, "run", runs["fanout"])
        read_failures(page, runs, shots)
        use_the_keyboard(page, runs)
    finally:
        page.close()


def test_a_step_drawer_shows_the_request_and_answer_a_capturing_server_kept(
    browser: Browser, tmp_path: Path
) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    capture = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    with FakeOpenAIServer(lambda request: ANSWER) as model:
        write_chat_recipe(recipes, model.url)
        with (
            server(tmp_path, url, "--recipes", str(recipes), **capture) as service,
            httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client,
        ):
            run_id = submit(client, "chat")
            until_settled(client, run_id, None)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            try:
                log_in(page, service.base, TOKEN, f"#/runs/{run_id}")
                expect(page.locator("#run-status")).to_have_text("completed")
                page.click('#steps tr[data-step="answer"] button')
                call = page.locator("#drawer .model-call")
                expect(call.locator("details.answer pre")).to_have_text(ANSWER)
                request = call.locator("details.request")
                expect(request.locator("summary")).to_have_text("request (1 message)")
                request.locator("summary").click()
                expect(request.locator("pre")).to_have_text(
                    "── user ──\nHow do bees tell where flowers are?"
                )
                expect(page.locator("#drawer .prompts-not-kept")).to_have_count(0)
            finally:
                page.close()


def test_a_run_cancelled_before_it_started_shows_every_step_pending(
    browser: Browser, tmp_path: Path
) -> None:
    """Its only event is its end: the server's fold of it (the first `states` of its stream)
    has no execution, and the page draws the recipe's steps as pending, none started."""
    config = ServiceConfig(
        token=TOKEN,
        database_url=f"sqlite:///{tmp_path / 'minions.db'}",
        recipes=write_recipes(tmp_path / "recipes"),
    )
    with (
        app_in_thread(create_app(config)) as base,  # no worker: the run stays queued
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as client,
    ):
        run_id = submit(client, "ledger", tag="never")
        assert client.post(f"/runs/{run_id}/cancel").json()["status"] == "cancelled"
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            log_in(page, base, TOKEN, f"#/runs/{run_id}")
            expect(page.locator("#run-status")).to_have_text("cancelled")
            expect(page.locator('#graph g[data-status="pending"]')).to_have_count(5)
            expect(page.locator("#timeline")).to_have_text("No step has started yet.")
            expect(page.locator('#steps tr[data-status="pending"]')).to_have_count(5)
        finally:
            page.close()


def test_a_run_that_moved_between_workers_is_marked_on_its_timeline(
    browser: Browser, tmp_path: Path
) -> None:
    """A run drained by a stopping worker and handed back: its log says so, and the
    timeline draws a row of marks (the drain, the hand-back) above its steps, the step cut
    short pending until it starts again."""
    import sqlalchemy as sa

    from minions import events as ev
    from minions.runs._db import Database
    from minions.runs._events import insert, row_of
    from minions.runs._tables import runs_table

    url = f"sqlite:///{tmp_path / 'minions.db'}"
    config = ServiceConfig(
        token=TOKEN, database_url=url, recipes=write_recipes(tmp_path / "recipes")
    )
    with (
        app_in_thread(create_app(config)) as base,  # no worker: the run stays queued
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as client,
    ):
        run_id = submit(client, "ledger", tag="moved")
        said: list[ev.Event] = [
            ev.RunStarted(recipe_id="ledger"),
            ev.StepStarted(step_id="one"),
            ev.RunDraining(executor_id="w1", grace=30.0, in_flight=("one",)),
            ev.RunHandedBack(executor_id="w1", attempt=2, cut_short=("one",)),
        ]
        database = Database(url)
        with database.begin() as db:  # what a worker and its drain would have written
            insert(
                db,
                run_id,
                [
                    row_of(dataclasses.replace(e, run_id=run_id, seq=i, timestamp=1e9 + i))
                    for i, e in enumerate(said, start=1)
                ],
            )
            db.execute(
                sa.update(runs_table).where(runs_table.c.run_id == run_id).values(last_seq=4)
            )
        database.close()
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            log_in(page, base, TOKEN, f"#/runs/{run_id}")
            marks = page.locator("#timeline .tl-run .tl-handoff")
            expect(marks).to_have_count(2)
            expect(marks.nth(0)).to_have_attribute(
                "title", re.compile("worker w1 stopping: one may finish")
            )
            expect(marks.nth(1)).to_have_attribute(
                "title",
                re.compile("handed back by worker w1 .it stopped.*attempt 2; cut short: one"),
            )
            expect(page.locator('#timeline .tl-row[data-step="one"]')).to_have_attribute(
                "data-status", "pending"
            )
            expect(page.locator('#events li[data-kind="run_handed_back"]')).to_contain_text(
                "cut short: one"
            )
        finally:
            page.close()


DOWN = (
    "openai-compatible:qwen at http://127.0.0.1:8080/v1/chat/completions: connection failed "
    "(Connection error.)"
)
"""What a model server that is down answers: it showed as `)` on every page."""


def test_cancel_asks_first_and_a_server_down_is_said_whole(
    browser: Browser, tmp_path: Path
) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    (recipes / "ask.yaml").write_text("id: ask\nsteps:\n  - id: answer\n    goal: Say hi.\n")
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    config = ServiceConfig(token=TOKEN, database_url=url, recipes=recipes)
    with (
        app_in_thread(create_app(config)) as base,  # no worker: runs stay queued
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as client,
    ):
        down = submit(client, "ask")
        model = ScriptedModel([ModelError(DOWN)])
        with ThreadPoolExecutor(1) as thread, pytest.raises(RunFailedError):
            # Playwright's loop runs in this thread: the run goes in another.
            thread.submit(asyncio.run, run_here(url, down, model=model)).result()
        queued = submit(client, "ledger", tag="kept")
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            log_in(page, base, TOKEN)
            error = page.locator(f'#runs tr[data-run="{down}"] td.error')
            expect(error).to_have_attribute("title", f"step 'answer' failed: {DOWN}")
            expect(error).to_contain_text("step 'answer' failed: openai-compatible:qwen at http://")
            page.goto(f"{base}/#/runs/{down}")
            expect(page.locator('#steps tr[data-step="answer"] td.result')).to_have_text(DOWN)
            page.click('#steps tr[data-step="answer"] button')
            expect(page.locator("#drawer .step-error")).to_have_text(DOWN)
            page.click("#drawer-close")

            # Cancel asks first, naming the run; "keep it" (the focused button) keeps it.
            page.goto(f"{base}/#/runs/{queued}")
            expect(page.locator("#run-status")).to_have_text("queued")
            page.click("#cancel")
            dialog = page.locator("#cancel-dialog")
            expect(dialog).to_be_visible()
            expect(page.locator("#cancel-what")).to_contain_text(f"Run {queued} of ledger, queued")
            expect(page.locator("#cancel-keep")).to_be_focused()
            page.keyboard.press("Enter")
            expect(dialog).to_be_hidden()
            assert client.get(f"/runs/{queued}").json()["status"] == "queued"
            page.click("#cancel")
            page.click("#cancel-confirm")
            expect(dialog).to_be_hidden()
            expect(page.locator("#run-status")).to_have_text("cancelled")
            assert client.get(f"/runs/{queued}").json()["status"] == "cancelled"
            expect(page.locator("#cancel")).to_be_disabled()
        finally:
            page.close()


def shown(first: int, last: int, total: int) -> str:
    """What the pager says of a page."""
    return f"{first}\u2013{last} of {total}"


def rows(page: Page) -> list[str]:
    found: list[str] = page.locator("#runs tbody tr[data-run]").evaluate_all(
        "(rows) => rows.map((r) => r.dataset.run)"
    )
    return found


def find_runs(page: Page, runs: dict[str, str]) -> None:
    newest_first = list(runs.values())[::-1]
    # Pages of four, newest first: dates, durations and tokens on each row.
    expect(page.locator("#page-info")).to_have_text(shown(1, 4, 6))
    assert rows(page) == newest_first[:4]
    chat = page.locator(f'#runs tr[data-run="{runs["chat"]}"]')
    expect(chat).to_contain_text(re.compile(r"just now|\d+ s ago"))
    expect(chat.locator("td.num").first).to_have_text(re.compile(r"^\d+\.\d+ s$"))
    expect(chat.locator("td.num").nth(1)).to_have_text(re.compile(r"^\d+$"))
    expect(page.locator("#newer")).to_be_disabled()
    page.click("#older")
    expect(page.locator("#page-info")).to_have_text(shown(5, 6, 6))
    assert rows(page) == newest_first[4:]
    expect(page.locator("#older")).to_be_disabled()
    page.click("#newer")
    expect(page.locator("#page-info")).to_have_text(shown(1, 4, 6))

    # Filters: status, recipe, together; a time range; none matching.
    page.select_option("#f-status", "failed")
    expect(page.locator("#page-info")).to_have_text(shown(1, 2, 2))
    assert set(rows(page)) == {runs["flaky"], runs["brief"]}
    page.select_option("#f-recipe", "flaky")
    expect(page.locator("#page-info")).to_have_text(shown(1, 1, 1))
    failed = page.locator(f'#runs tr[data-run="{runs["flaky"]}"]')
    expect(failed.locator("td.error")).to_contain_text("not yet")
    page.click("#f-clear")
    expect(page.locator("#page-info")).to_have_text(shown(1, 4, 6))
    page.select_option("#f-since", "3600")
    expect(page.locator("#page-info")).to_have_text(shown(1, 4, 6))
    page.select_option("#f-since", "custom")
    page.fill("#f-to", "2020-01-01T00:00:00")
    page.locator("#f-to").dispatch_event("change")
    expect(page.locator("#runs tbody")).to_have_text("No runs match.")
    expect(page.locator("#page-info")).to_have_text("0 of 0")
    page.click("#f-clear")

    # Search by id: a prefix finds the run; Enter opens it.
    page.fill("#f-id", runs["fanout"][:10])
    expect(page.locator("#page-info")).to_have_text(shown(1, 1, 1))
    assert rows(page) == [runs["fanout"]]
    page.press("#f-id", "Enter")
    expect(page.locator("#run-view")).to_be_visible()
    expect(page.locator("#list-view")).to_be_hidden()
    expect(page.locator("#run-id")).to_have_text(runs["fanout"])


def bar(page: Page, step: str) -> dict[str, float]:
    box = page.locator(f'#timeline .tl-row[data-step="{step}"] .tl-bar').bounding_box()
    assert box is not None
    return box  # type: ignore[return-value]


def read_a_parallel_run(page: Page, run_id: str) -> None:
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator('#events li[data-kind="run_completed"]')).to_have_count(1)
    # The timeline: a row per step and loop item, in the order they started.
    timeline = page.locator("#timeline .tl-row")
    expect(timeline).to_have_count(9)
    labels = page.locator("#timeline .tl-label").all_inner_texts()
    assert labels[0] == "start"
    assert set(labels[1:4]) == {"north", "south", "west"}
    assert labels[4:] == ["each", "each[0]", "each[1]", "each[2]", "done"]
    # Parallel steps side by side: each bar overlaps the others; the loop comes after.
    north, south, west, each = (bar(page, s) for s in ("north", "south", "west", "each"))
    for one, other in ((north, south), (south, west), (north, west)):
        assert one["x"] < other["x"] + other["width"]
        assert other["x"] < one["x"] + one["width"]
    assert each["x"] >= max(b["x"] + b["width"] for b in (north, south, west)) - 2
    first, third = bar(page, "each[0]"), bar(page, "each[2]")
    assert third["x"] >= first["x"] + first["width"] - 2  # two at a time: the third waits
    # The graph: arrows along the edges, nodes coloured by status.
    expect(page.locator("#graph path[marker-end]")).to_have_count(7)
    expect(page.locator('#graph g[data-status="completed"]')).to_have_count(6)
    # A step's detail: its tool call's arguments and result, its times.
    page.click('#timeline .tl-row[data-step="north"] .tl-label')
    drawer = page.locator("#drawer")
    expect(drawer).to_be_visible()
    expect(page.locator("#drawer-title")).to_contain_text("step north")
    call = drawer.locator(".tool-call")
    expect(call).to_have_count(1)
    expect(call.locator(".arguments")).to_contain_text('"step": "north"')
    expect(call.locator(".result")).to_have_text("fan:north")
    expect(drawer.locator("dl")).to_contain_text("took")
    page.keyboard.press("Escape")
    expect(drawer).to_be_hidden()
    # The loop's items in its drawer.
    page.click('#steps tr[data-step="each"] button')
    expect(drawer.locator("table tbody tr")).to_have_count(3)
    expect(drawer.locator(".tool-call")).to_have_count(3)
    page.click("#drawer-close")
    expect(drawer).to_be_hidden()


def read_failures(page: Page, runs: dict[str, str], shots: Path) -> None:
    # A failed tool step: its error on its row, once; the banner names the step.
    page.goto(f"{page.url.split('#')[0]}#/runs/{runs['flaky']}")
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#run-error")).to_have_text(re.compile(r"^Failed at step second\."))
    row = page.locator('#steps tr[data-step="second"]')
    expect(row.locator("td.result")).to_contain_text("not yet")
    assert page.locator("#steps").inner_text().count("not yet") == 1
    assert "not yet" not in page.locator("#run-output").inner_text()
    # A model whose answers were cut off: retries marked, the reason told for a person, the
    # note meant for the model nowhere on the page.
    page.goto(f"{page.url.split('#')[0]}#/runs/{runs['brief']}")
    expect(page.locator("#run-status")).to_have_text("failed")
    essay = page.locator('#steps tr[data-step="essay"]')
    expect(essay.locator("td.result")).to_contain_text("cut off at the length limit")
    expect(essay.locator("td.num").nth(1)).not_to_have_text("")  # the tokens it used
    expect(page.locator('#timeline .tl-row[data-step="essay"] .tl-retry')).to_have_count(2)
    page.click('#steps tr[data-step="essay"] button')
    drawer = page.locator("#drawer")
    expect(drawer.locator(".model-call")).to_have_count(3)
    expect(drawer.locator(".retry")).to_have_count(2)
    expect(drawer.locator(".retry").first).to_contain_text("the answer was unusable")
    expect(drawer.locator(".step-error")).to_contain_text("cut off at the length limit")
    # Prompts are not kept on this server: said once, with the switch that keeps them.
    expect(drawer.locator(".prompts-not-kept")).to_have_count(1)
    expect(drawer.locator(".prompts-not-kept")).to_contain_text(
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true"
    )
    expect(drawer.locator("details.request")).to_have_count(0)
    expect(drawer.locator("dl")).to_contain_text(re.compile(r"tokens\s*\d+ \(\d+ in, \d+ out\)"))
    assert NOTE_TO_THE_MODEL not in page.locator("body").inner_text()
    page.screenshot(path=str(shots / "console-step-desktop-light.png"))
    page.keyboard.press("Escape")


def use_the_keyboard(page: Page, runs: dict[str, str]) -> None:
    # A graph node opens with Enter; Escape closes the drawer and gives the focus back.
    page.goto(f"{page.url.split('#')[0]}#/runs/{runs['ledger']}")
    expect(page.locator("#run-status")).to_have_text("completed")
    node = page.locator('#graph g[data-step="three"]')
    node.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#drawer-title")).to_contain_text("step three")
    expect(page.locator("#drawer-close")).to_be_focused()
    page.keyboard.press("Escape")
    expect(node).to_be_focused()
    # The runs list: a run's link is reached with Tab and opened with Enter.
    page.goto(f"{page.url.split('#')[0]}#/")
    link = page.locator(f'#runs tr[data-run="{runs["chat"]}"] a')
    expect(link).to_be_visible()
    link.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#run-id")).to_have_text(runs["chat"])


PANES = ("#timeline", "#steps-frame", "#events", "#run-output", "#tokens")
"""The run page's panes that grow with the run."""


def shoot(page: Page, folder: Path, name: str, run_id: str) -> None:
    """The run page and the list at a desktop's width and a phone's, light and dark; nothing
    wider than the window."""
    base = page.url.split("#")[0]
    page.goto(f"{base}#/")
    page.click("#f-clear")
    schemes: tuple[Literal["light", "dark"], ...] = ("light", "dark")
    for scheme in schemes:
        page.emulate_media(color_scheme=scheme)
        for width, device in ((1280, "desktop"), (420, "phone")):
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{base}#/runs/{run_id}")
            expect(page.locator("#run-status")).to_have_text("completed")
            expect(page.locator("#timeline .tl-row")).to_have_count(9)
            expect(page.locator('#events li[data-kind="run_completed"]')).to_have_count(1)
            wide: Any = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"{device}, {scheme}: the page is {wide} px wide"
            for pane in PANES:  # each scrolls inside itself
                limit = page.locator(pane).evaluate("(p) => getComputedStyle(p).maxHeight")
                assert limit != "none", f"{pane} has no height limit"
            page.screenshot(path=str(folder / f"console-{name}-{device}-{scheme}.png"))
            page.goto(f"{base}#/")
            expect(page.locator("#runs tbody tr[data-run]")).to_have_count(4)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"{device}, {scheme}: the list is {wide} px wide"
            page.screenshot(path=str(folder / f"console-list-{device}-{scheme}.png"))
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1280, "height": 900})


# -- reruns, their parents, schedules --------------------------------------------------------

SHOUTS = """\
id: shouts
description: Shout three times; the second says the input.
tools: [shouting]
inputs: {text: {type: string, default: first}}
steps:
  - {id: one, tool: shout, params: {text: one}}
  - {id: two, depends_on: [one], tool: shout, params: {text: "{{ inputs.text }}"}}
  - {id: three, depends_on: [two], tool: shout, params: {text: three}}
"""


def test_an_operator_reruns_compares_pauses_a_schedule_and_sees_waits_for_a_model(
    browser: Browser, tmp_path: Path
) -> None:
    release = threading.Event()

    def answer(request: FakeRequest) -> str:
        release.wait(60)  # the first run's call holds the endpoint's only slot meanwhile
        return ANSWER

    recipes = write_recipes(tmp_path / "recipes")
    (recipes / "shouts.yaml").write_text(SHOUTS)
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    shots = DOCS if os.environ.get("MINIONS_SCREENSHOTS") == "docs" else tmp_path
    with FakeOpenAIServer(answer) as model:
        write_chat_recipe(recipes, model.url)
        limits = tmp_path / "limits.yaml"
        limits.write_text(f'endpoints:\n  - {{match: "{model.url}/v1", max_concurrent: 1}}\n')
        with (
            server(tmp_path, url, "--recipes", str(recipes), "--limits", str(limits)) as service,
            httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client,
        ):
            parent = submit(client, "shouts", text="first")
            until_settled(client, parent, None)
            for body in (
                {"recipe": "shouts", "every": "1d", "name": "daily"},
                {"recipe": "shouts", "cron": "0 7 * * 1-5", "timezone": "Europe/Paris"},
            ):
                made = client.post("/schedules", json=body)
                assert made.status_code == 201, made.text
            assert client.post("/schedules/shouts/pause").status_code == 200
            with sqlite3.connect(tmp_path / "store" / "minions.db") as db:  # as a tick flags it
                db.execute(
                    "UPDATE minions_schedules SET late = 1, late_slots = 4, "
                    "late_reason = 'overlap' WHERE name = 'shouts'"
                )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            try:
                log_in(page, service.base, TOKEN)
                rerun_in_console(page, parent, shots)
                pause_a_schedule(page, shots)
                see_a_wait_for_a_model(page, client, release)
                # Pruned history: the runs list says how far back it goes.
                failed = submit(client, "flaky")
                until_settled(client, failed, None)
                page.click("#nav-runs")
                expect(page.locator("#history")).to_be_hidden()
                with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
                    pool.submit(asyncio.run, prune_failed(url)).result()
                expect(page.locator("#history")).to_contain_text(
                    re.compile(
                        r"^History goes back to .+: runs that finished before .+ were pruned\.$"
                    )
                )
                assert failed not in rows(page)
            finally:
                release.set()
                page.close()


def until_event(client: httpx2.Client, run_id: str, kind: str) -> None:
    """Follow the run's stream until an event of `kind`."""
    with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
        for line in response.iter_lines():
            if line == f"event: {kind}":
                return


def see_a_wait_for_a_model(page: Page, client: httpx2.Client, release: threading.Event) -> None:
    # The first run's call holds the endpoint's one slot: the second's waits, shown so.
    first = submit(client, "chat")
    until_event(client, first, "model_call_started")
    second = submit(client, "chat")
    until_event(client, second, "model_call_waiting")
    page.goto(f"{page.url.split('#')[0]}#/runs/{second}")
    waiting = page.locator('#events li[data-kind="model_call_waiting"]')
    expect(waiting).to_have_count(1)
    expect(waiting).to_contain_text("as many calls as allowed were in flight")
    expect(page.locator('#timeline .tl-row[data-step="answer"] .tl-wait.model')).to_have_count(1)
    release.set()
    expect(page.locator("#run-status")).to_have_text("completed")
    page.click('#steps tr[data-step="answer"] td:first-child button')
    expect(page.locator("#drawer .model-waits li")).to_have_count(1)
    expect(page.locator("#drawer .model-waits li")).to_contain_text(re.compile(r"waited \d"))
    page.keyboard.press("Escape")


async def prune_failed(url: str) -> None:
    """Prune the failed runs of the store at `url`, as `minions runs prune` would."""
    store = RunStore(url)
    try:
        assert (await store.prune(0.0, statuses=["failed"])).runs == 1
    finally:
        store.close()


def rerun_in_console(page: Page, parent: str, shots: Path) -> None:
    base = page.url.split("#")[0]
    page.goto(f"{base}#/runs/{parent}")
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#lineage")).to_be_hidden()
    # From step three's drawer: the run's inputs to edit, an error in plain words.
    page.click('#steps tr[data-step="three"] td:first-child button')
    page.click("#drawer button.rerun")
    dialog = page.locator("#rerun-dialog")
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")  # the editor closes, the drawer under it stays
    expect(dialog).to_be_hidden()
    expect(page.locator("#drawer")).to_be_visible()
    page.click("#drawer button.rerun")
    expect(dialog).to_be_visible()
    expect(page.locator("#rerun-title")).to_have_text("rerun from step three")
    assert '"text": "first"' in page.locator("#rerun-inputs").input_value()
    page.fill("#rerun-inputs", "{not json")
    page.click("#rerun-submit")
    expect(page.locator("#rerun-error")).to_have_text("The inputs are not valid JSON.")
    # The server's plan: with the same inputs, what three does not depend on is reused, and
    # those steps may have their output replaced.
    expect(page.locator("#rerun-reused")).to_have_text("reused as recorded: one, two")
    expect(page.locator("#rerun-again")).to_have_text("run again: three")
    expect(page.locator("#rerun-set option")).to_have_text(["— none —", "one", "two"])
    # A new input: two renders it, so it runs again too (the server's rule, not the graph's
    # downstream of three), and its output can no longer be replaced.
    page.fill("#rerun-inputs", '{"text": "second"}')
    expect(page.locator("#rerun-reused")).to_have_text("reused as recorded: one")
    expect(page.locator("#rerun-again")).to_have_text("run again: two (its inputs changed), three")
    expect(page.locator("#rerun-set option")).to_have_text(["— none —", "one"])
    page.locator("#rerun-dialog").screenshot(path=str(shots / "console-rerun-plan.png"))
    page.click("#rerun-submit")

    # The new run's page: its lineage; step one reused (the input did not change it), step
    # two run again (its rendered params did change), three too; it completes.
    expect(page.locator("#lineage")).to_contain_text(f"Rerun of run {parent[:12]} from step three")
    rerun = page.locator("#run-id").inner_text()
    assert rerun != parent
    expect(page.locator("#run-status")).to_have_text("completed")
    # The timeline is the server's fold of the run's events: the same watched live as read
    # later (a reused step's bar is where the rerun reused it, not where it was queued).
    expect(page.locator('#events li[data-kind="run_completed"]')).to_have_count(1)
    watched = bars(page)
    page.reload()
    expect(page.locator('#events li[data-kind="run_completed"]')).to_have_count(1)
    expect(page.locator("#timeline .tl-row")).to_have_count(3)
    assert bars(page) == watched
    expect(page.locator('#steps tr[data-step="one"]')).to_have_attribute("data-status", "reused")
    expect(page.locator('#graph g[data-step="one"]')).to_have_attribute("data-status", "reused")
    expect(page.locator('#timeline .tl-row[data-step="one"] .tl-bar.s-reused')).to_have_count(1)
    expect(page.locator('#steps tr[data-step="two"]')).to_contain_text("SECOND")
    expect(page.locator('#steps tr[data-step="two"]')).to_have_attribute("data-status", "completed")
    expect(page.locator('#events li[data-kind="step_reused"]')).to_have_count(1)
    page.click('#steps tr[data-step="one"] td:first-child button')
    expect(page.locator("#drawer .reused-note")).to_contain_text(
        f"Reused as recorded in run {parent[:12]}"
    )
    page.keyboard.press("Escape")

    # Compared with its parent: step two diverges first, its output's change listed.
    page.click("#compare")
    expect(page.locator("#diff-first")).to_have_text("First divergence: step two")
    first = page.locator("#diff-table tr.first")
    expect(first).to_have_count(1)
    expect(first).to_have_attribute("data-step", "two")
    expect(first.locator("td.changes")).to_contain_text("FIRST")
    expect(first.locator("td.changes")).to_contain_text("SECOND")
    expect(page.locator('#diff-table tr[data-step="one"]')).to_contain_text("reused")
    page.locator("#diff").screenshot(path=str(shots / "console-rerun-diff.png"))

    # A rerun of the rerun, with step one's output set by hand: what follows it runs again.
    page.click('#steps tr[data-step="three"] button.rerun')
    # Inputs the recipe refuses: the plan says so, and so does the rerun, in the editor.
    page.fill("#rerun-inputs", '{"text": 5}')
    expect(page.locator("#rerun-plan")).to_contain_text("This rerun is not possible")
    page.click("#rerun-submit")
    expect(page.locator("#rerun-error")).to_contain_text("text")
    # Step two runs again with a new input: its output is not offered to replace.
    page.fill("#rerun-inputs", '{"text": "third"}')
    expect(page.locator("#rerun-set option")).to_have_text(["— none —", "one"])
    page.fill("#rerun-inputs", '{"text": "second"}')
    expect(page.locator("#rerun-set option")).to_have_text(["— none —", "one", "two"])
    page.select_option("#rerun-set", "one")
    # One's output set by hand: what follows it runs again, as the plan says.
    expect(page.locator("#rerun-again")).to_have_text("run again: two, three")
    expect(page.locator("#rerun-output")).to_have_value('"ONE"')
    page.fill("#rerun-output", "EDITED")
    page.click("#rerun-submit")
    expect(page.locator("#rerun-error")).to_have_text(
        "The new output of step one is not valid JSON (a text goes in quotes)."
    )
    page.fill("#rerun-output", '"EDITED"')
    page.click("#rerun-submit")
    expect(page.locator("#lineage")).to_contain_text(f"Rerun of run {rerun[:12]} from step three")
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator('#steps tr[data-step="one"]')).to_contain_text("EDITED")
    expect(page.locator('#steps tr[data-step="one"]')).to_have_attribute("data-status", "reused")
    expect(page.locator('#events li[data-kind="step_reused"]')).to_contain_text("set by hand")

    # The parent link leads back.
    page.click("#lineage a.parent")
    expect(page.locator("#run-id")).to_have_text(rerun)
    page.click("#lineage a.parent")
    expect(page.locator("#run-id")).to_have_text(parent)


def bars(page: Page) -> dict[str, str]:
    """Where the timeline draws each step's bar (its style: left and width)."""
    page.wait_for_timeout(100)  # the frame that draws the last states
    found: dict[str, str] = page.locator("#timeline .tl-row").evaluate_all(
        "(rows) => Object.fromEntries(rows.map((r) => [r.dataset.step, "
        "(r.querySelector('.tl-bar') || {}).getAttribute?.('style') || '']))"
    )
    return found


def pause_a_schedule(page: Page, shots: Path) -> None:
    page.click("#nav-schedules")
    row = page.locator('#schedules tr[data-schedule="daily"]')
    expect(row).to_contain_text("shouts")
    expect(row).to_contain_text("every 1 d")
    expect(row).to_have_attribute("data-paused", "false")
    # The next fire, a day at most: "in 1 d" within half an hour of a day (rounded to the hour).
    expect(row).to_contain_text(re.compile(r"in (\d+ (s|min|h)|1 d)"))
    expect(row).to_contain_text("never")  # the last fire
    expect(row).to_contain_text("overlap skip")
    expect(row).to_have_attribute("data-late", "false")
    weekdays = page.locator('#schedules tr[data-schedule="shouts"]')
    expect(weekdays).to_contain_text("cron 0 7 * * 1-5 (Europe/Paris)")
    expect(weekdays).to_have_attribute("data-late", "true")
    expect(weekdays.locator(".s-late")).to_have_attribute(
        "title", "slots skipped while a run of it was active; 4 slot(s) late or skipped in all"
    )
    expect(weekdays).to_have_attribute("data-paused", "true")
    page.set_viewport_size({"width": 420, "height": 900})  # a phone: nothing wider
    wide: Any = page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 420, f"the schedules are {wide} px wide"
    page.set_viewport_size({"width": 1280, "height": 900})
    row.locator("button.pause").click()
    expect(row).to_have_attribute("data-paused", "true")
    expect(row).to_contain_text("paused")
    row.locator("button.resume").click()
    expect(row).to_have_attribute("data-paused", "false")
    # A schedule's runs: none fired yet.
    row.locator("a").first.click()
    expect(page.locator("#schedule-runs-title")).to_contain_text("runs of daily")
    expect(page.locator("#schedule-runs tbody")).to_contain_text("It has fired no run yet.")
    page.screenshot(path=str(shots / "console-schedules.png"))
