"""The console in a real browser: Debian's chromium driven by Playwright. A person opens the
page, gives the token (generated at the server's first start, printed once), submits a run,
sees it in the list, watches its events arrive and its steps change colour, approves the call
it waits for, and sees it complete; a screenshot is saved as the test's artifact. A model's
answer streams into the page as it is written. The page follows a run with the browser's
`EventSource`, opened with a stream ticket (never the token in a URL), and closes it at the
run's end: it never comes back."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from service_helpers import ANSWER, server, write_chat_recipe, write_recipes

from minions.testing import FakeOpenAIServer, FakeRequest

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield browser
        browser.close()


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
    page.select_option("#recipe", "release")
    page.fill("#inputs", '{"text": "go"}')
    page.click("#submit")
    expect(page.locator("#run-view")).to_be_visible()
    run_id = page.locator("#run-id").inner_text()
    assert len(run_id) == 32
    expect(page.locator(f'#runs tr[data-run="{run_id}"]')).to_be_visible()

    # Its events arrive; the step waits, coloured so, with the call to approve.
    expect(page.locator('#events li[data-kind="approval_requested"]')).to_have_count(1)
    expect(page.locator('#graph g[data-step="say"]')).to_have_attribute("data-status", "waiting")
    expect(page.locator("#run-status")).to_have_text("waiting")
    approval = page.locator("#approvals .approval")
    expect(approval).to_contain_text('step say wants to call shout({"text":"go"})')
    page.screenshot(path=str(artifacts / "console-waiting.png"), full_page=True)
    assert sources(page) == [1]  # an EventSource follows the run, live
    approval.locator("button.approve").click()

    # It completes: every step green, the output shown, the list updated.
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator('#events li[data-kind="run_completed"]')).to_have_count(1)
    for step in ("say", "after"):
        expect(page.locator(f'#graph g[data-step="{step}"]')).to_have_attribute(
            "data-status", "completed"
        )
    expect(page.locator("#run-output")).to_have_text('"DONE"')
    expect(page.locator('#steps tr[data-step="say"]')).to_contain_text("GO")
    expect(page.locator(f'#runs tr[data-run="{run_id}"]')).to_contain_text("completed")
    seqs = page.locator("#events li .seq").all_inner_texts()
    assert [int(s) for s in seqs] == list(range(1, len(seqs) + 1))
    page.screenshot(path=str(artifacts / "console.png"), full_page=True)
    # The run ended: its EventSource was closed for good, having connected once, with a
    # ticket in its URL and never the token.
    expect(page.locator("#run-status")).to_have_text("completed")
    page.wait_for_function("window.__sources.every((s) => s.readyState === 2)")
    assert sources(page) == [2]
    assert len(streams) == 1
    url, kind = streams[0]
    assert kind == "eventsource"
    assert f"/runs/{run_id}/events/stream?ticket=" in url
    assert token not in url

    # A model's answer streams in as it is written.
    page.select_option("#recipe", "chat")
    page.fill("#inputs", "{}")
    page.click("#submit")
    expect(page.locator('#events li[data-kind="model_call_started"]')).to_have_count(1)
    release.set()
    expect(page.locator('#tokens pre[data-step="answer"]')).to_have_text(ANSWER)
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#run-usage")).to_contain_text("1 model calls")
    page.screenshot(path=str(artifacts / "console-streaming.png"), full_page=True)
    page.wait_for_function("window.__sources.every((s) => s.readyState === 2)")
    assert sources(page) == [2, 2]
    assert len(streams) == 2
