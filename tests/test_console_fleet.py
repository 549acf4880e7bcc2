"""The console's fleet pages in a real browser (Debian's chromium, driven by Playwright): an
operator opens Workers, Endpoints, Queue and Usage while a worker was killed and a model
endpoint (one place under ``--limits``) is saturated with a backlog behind it. The killed
worker shows dead, the live one its places used and the runs it holds; the endpoint its call
in flight and the worker waiting; the queue its backlog and oldest run; the usage the tokens
and cost of the runs by recipe and model, a server of one's own priced as unknown; the
notifications' last error. Screenshots go to the test's folder (to docs/ with
``MINIONS_SCREENSHOTS=docs``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa
from browser_helpers import launch
from playwright.sync_api import Browser, Page, expect, sync_playwright
from runs_helpers import WorkerProcess, insert_run, model_calls
from service_helpers import TOKEN, auth, free_port, server, submit, write_chat_recipe

from minions.runs import Notifier, NotifyTarget
from minions.runs._db import Database
from minions.testing import FakeOpenAIServer, FakeReply

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def until(check: Callable[[], bool], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        time.sleep(0.05)


def seed(url: str, now: float, endpoint: str) -> None:
    """An hour's history: a priced run of `triage` and a failed one; what the endpoint
    taught of its model's structured output."""
    database = Database(url)
    try:
        with database.begin() as db:
            db.execute(
                sa.text(
                    "INSERT INTO minions_capabilities (base_url, model, rejected, worked, "
                    "learned_at) VALUES (:url, 'fake-model', '[\"json_schema\"]', 'tool', :at)"
                ),
                {"url": endpoint, "at": now - 60},
            )
        for run_id in ("earlier", "broke"):
            insert_run(database, run_id)
        with database.begin() as db:
            db.execute(
                sa.text(
                    "UPDATE minions_runs SET recipe_id = 'triage', status = :s, finished_at = :at, "
                    "error = :e WHERE run_id = :r"
                ),
                [
                    {"s": "completed", "at": now - 3600, "e": None, "r": "earlier"},
                    {"s": "failed", "at": now - 5, "e": "step 'x' failed: no answer", "r": "broke"},
                ],
            )
        model_calls(
            database,
            "earlier",
            [
                ("gpt-4o", "https://api.openai.com/v1", 12000, 800, now - 3600),
                ("gpt-4o-mini", "https://api.openai.com/v1", 40000, 2000, now - 3500),
            ],
        )
    finally:
        database.close()


def test_an_operator_sees_a_dead_worker_a_saturated_endpoint_the_backlog_and_the_usage(
    browser: Browser, tmp_path: Path
) -> None:
    shots = DOCS if os.environ.get("MINIONS_SCREENSHOTS") == "docs" else tmp_path
    gate = threading.Event()
    with FakeOpenAIServer(lambda _: FakeReply.text("Bees dance."), gate=gate) as model:
        recipes = tmp_path / "recipes"
        recipes.mkdir()
        write_chat_recipe(recipes, f"http://127.0.0.1:{model.port}")
        limits = tmp_path / "limits.yaml"
        endpoint = model.url
        limits.write_text(f"endpoints:\n  - {{match: '{endpoint}', max_concurrent: 1}}\n")
        url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
        args = ("--recipes", str(recipes), "--limits", str(limits))
        with (
            server(tmp_path, url, *args) as service,
            httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client,
        ):
            now = time.time()
            seed(url, now, endpoint)
            # A worker that is killed: its record stays, dead.
            doomed = WorkerProcess(url, tmp_path, "doomed", tmp_path / "ledger.txt")
            doomed.kill()

            def dead() -> bool:
                found = {w["executor_id"]: w for w in client.get("/workers").json()}
                return "doomed" in found and not found["doomed"]["alive"]

            until(dead)
            # Six runs behind an endpoint of one place: one call in flight, the worker's
            # other runs waiting for it, two runs queued beyond the worker's four places.
            runs = [submit(client, "chat") for _ in range(6)]
            until(lambda: model.in_flight == 1)

            def saturated() -> bool:
                (status,) = client.get("/endpoints/status").json()
                queue = client.get("/queue").json()
                return bool(status["load"]["waiting"] == 1 and queue["queued"] == 2)

            until(saturated)
            # Notifications to a receiver that is down: the Workers page says so.
            notifier = Notifier(
                url, [NotifyTarget.parse(f"http://127.0.0.1:{free_port()}/hook")], secret="s"
            )
            try:
                notifier.find()
                notifier.deliver()
            finally:
                notifier.close()

            page = browser.new_page(viewport={"width": 1280, "height": 800})
            try:
                page.goto(f"{service.base}/#/workers")
                page.fill("#token", TOKEN)
                page.click("#login button")
                see_the_workers(page, shots)
                see_the_endpoint(page, endpoint, shots)
                see_the_queue(page, runs, shots)
                gate.set()
                until(
                    lambda: (
                        {client.get(f"/runs/{r}").json()["status"] for r in runs} == {"completed"}
                    )
                )
                see_the_usage(page, shots)
            finally:
                page.close()


def see_the_workers(page: Page, shots: Path) -> None:
    expect(page.locator("#workers-pane")).to_be_visible()
    doomed = page.locator('#workers tr[data-worker="doomed"]')
    expect(doomed.locator(".status")).to_have_text("dead")
    expect(doomed.locator(".places")).to_have_text("0 / 4")
    alive = page.locator("#workers tr.worker-alive")
    expect(alive).to_have_count(1)
    expect(alive.locator(".places")).to_have_text("4 / 4")  # its own concurrency, all used
    expect(alive.locator("a")).to_have_count(4)  # the runs it holds, each a link
    expect(page.locator("#workers-summary")).to_have_text("1 alive, 1 dead")
    error = page.locator("#notifications td.error")
    expect(error).to_contain_text("ConnectError")
    page.screenshot(path=str(shots / "fleet-workers.png"), full_page=True)


def see_the_endpoint(page: Page, endpoint: str, shots: Path) -> None:
    page.click("#nav-endpoints")
    row = page.locator(f'#endpoints tr[data-endpoint="{endpoint}"]')
    expect(row.locator(".status")).to_have_text("saturated")
    expect(row.locator(".in-flight")).to_have_text("1")
    expect(row.locator(".waiting")).to_have_text("1")
    expect(row.locator(".learned")).to_have_text("fake-model: tool (refused json_schema)")
    page.screenshot(path=str(shots / "fleet-endpoints.png"), full_page=True)


def see_the_queue(page: Page, runs: list[str], shots: Path) -> None:
    page.click("#nav-queue")
    expect(page.locator("#queue-queued")).to_have_text("2")
    expect(page.locator("#queue-oldest")).to_be_visible()
    expect(page.locator("#queue-recipes tbody tr")).to_have_count(1)
    expect(page.locator("#queue-recipes tbody tr td").first).to_have_text("chat")
    queued = page.locator("#queue-runs tbody a")
    expect(queued).to_have_count(2)
    assert {queued.nth(i).get_attribute("title") for i in range(2)} <= set(runs)
    page.screenshot(path=str(shots / "fleet-queue.png"), full_page=True)


def see_the_usage(page: Page, shots: Path) -> None:
    page.click("#nav-usage")
    page.select_option("#usage-by", "recipe,model")
    rows = page.locator("#usage tbody tr:not(.total)")
    expect(rows).to_have_count(3)
    chat = rows.filter(has_text="fake-model")
    expect(chat.locator(".cost")).to_have_text("unknown")  # a server of one's own
    expect(chat.locator(".unpriced")).to_have_text("6")
    priced = rows.filter(has_text="gpt-4o-mini")
    # 40,000 prompt tokens at $0.15 and 2,000 answer tokens at $0.60 per million.
    expect(priced.locator(".cost")).to_have_text("$0.0072")
    expect(page.locator("#usage tr.total .unpriced")).to_have_text("6")
    expect(page.locator("#usage-prices")).to_contain_text("genai-prices")
    page.screenshot(path=str(shots / "fleet-usage.png"), full_page=True)
    # By project: every run here is of project default.
    page.select_option("#usage-by", "project")
    expect(page.locator("#usage-head th").first).to_have_text("project")
    by_project = page.locator("#usage tbody tr:not(.total)")
    expect(by_project).to_have_count(1)
    expect(by_project.locator("td").first).to_have_text("default")
