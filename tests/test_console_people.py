"""The console for people, in a real browser (Debian's chromium driven by Playwright): each
person sees who they are; an approver sees how many calls wait for them, follows the count to
the waiting run and rejects its call; the run then shows `rejected` with who rejected it and
why, never the note meant for the model; a viewer is offered neither a count nor the audit; an
admin reads the audit log, filtered. Screenshots (the count, a rejected run, the audit page)
go to the test's folder
(to docs/ with ``MINIONS_SCREENSHOTS=docs``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest
from browser_helpers import launch
from playwright.sync_api import Browser, Page, expect, sync_playwright
from service_helpers import auth, server, write_recipes

from minions.runs import RunStore

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parent.parent / "docs"
NOTE = "Do not make it again"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def log_in(browser: Browser, base: str, key: str) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{base}/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", key)
    page.click("#login button")
    expect(page.locator("#app")).to_be_visible()
    return page


def test_people_see_who_they_are_what_waits_for_them_and_the_audit(
    browser: Browser, tmp_path: Path
) -> None:
    shots = DOCS if os.environ.get("MINIONS_SCREENSHOTS") == "docs" else tmp_path
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipes = write_recipes(tmp_path / "recipes")

    async def keys() -> dict[str, str]:
        store = RunStore(url, create=True)
        made = {
            name: (await store.add_key(name, role=role, actor="cli:ops")).key
            for name, role in (
                ("ada", "admin"),
                ("olga", "operator"),
                ("alice", "approver"),
                ("vic", "viewer"),
            )
        }
        await store.aclose()
        return made

    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        made = pool.submit(asyncio.run, keys()).result()
    with server(
        tmp_path, url, "--recipes", str(recipes), LEDGER=str(tmp_path / "l.txt")
    ) as service:
        olga = httpx2.Client(base_url=service.base, headers=auth(made["olga"]), timeout=60)
        done = olga.post("/runs", json={"recipe": "ledger", "inputs": {"tag": "a"}}).json()
        run_id = olga.post("/runs", json={"recipe": "release", "inputs": {"text": "go"}}).json()[
            "run_id"
        ]
        alice = log_in(browser, service.base, made["alice"])
        try:
            # Who alice is, and the call that waits for her (once the worker asked).
            expect(alice.locator("#me")).to_have_text("alice · approver")
            expect(alice.locator("#nav-audit")).to_be_hidden()
            waiting = alice.locator("#waiting")
            expect(waiting).to_have_text("1 waits for you", timeout=60_000)
            # The count leads to the runs that wait.
            waiting.click()
            expect(alice.locator("#f-status")).to_have_value("waiting")
            expect(alice.locator("#runs tbody tr[data-run]")).to_have_count(1)
            alice.screenshot(path=str(shots / "console-waiting-for-you.png"))
            alice.click(f'#runs tr[data-run="{run_id}"] a')
            box = alice.locator("#approvals .approval")
            expect(box).to_contain_text("step say wants to call shout")
            box.locator("input.reason").fill("not on a Friday")
            box.locator("button.reject").click()
            # A rejection is its own outcome, with who decided and why; no note for a model.
            expect(alice.locator("#run-status")).to_have_text("rejected", timeout=60_000)
            decision = alice.locator("#decisions li")
            expect(decision).to_have_count(1)
            expect(decision).to_contain_text("alice rejected shout in step say")
            expect(decision).to_contain_text("not on a Friday")
            expect(waiting).to_have_text("0 wait for you")
            alice.screenshot(path=str(shots / "console-rejected.png"))
            alice.locator('#steps tr[data-step="say"] button').first.click()
            expect(alice.locator("#drawer")).to_be_visible()
            expect(alice.locator("#drawer")).to_contain_text("rejected by alice")
            assert NOTE not in alice.content()
            alice.keyboard.press("Escape")
            alice.click("a.back")
            expect(alice.locator(f'#runs tr[data-run="{run_id}"]')).to_have_count(
                0
            )  # waits no more
            alice.click("#f-clear")
            row = alice.locator(f'#runs tr[data-run="{run_id}"]')
            expect(row.locator(".status")).to_have_text("rejected")
            assert NOTE not in alice.content()
        finally:
            alice.close()
        vic = log_in(browser, service.base, made["vic"])
        try:
            expect(vic.locator("#me")).to_have_text("vic · viewer")
            expect(vic.locator("#waiting")).to_be_hidden()
            expect(vic.locator("#nav-audit")).to_be_hidden()
            vic.goto(f"{service.base}/#/audit")
            expect(vic.locator("#audit-error")).to_contain_text("this needs the admin role")
        finally:
            vic.close()
        ada = log_in(browser, service.base, made["ada"])
        try:
            expect(ada.locator("#me")).to_have_text("ada · admin")
            expect(ada.locator("#waiting")).to_have_text("0 wait for you")
            ada.click("#nav-audit")
            expect(ada.locator("#audit-view")).to_be_visible()
            rows = ada.locator("#audit tbody tr[data-action]")
            expect(rows).to_have_count(7)  # four keys, two submits, one rejection
            first = rows.first
            expect(first).to_contain_text("alice")
            expect(first).to_contain_text("approval.reject")
            expect(first).to_contain_text("127.0.0.1")
            expect(first).to_contain_text("reason=not on a Friday")
            expect(rows.nth(1)).to_contain_text("olga")
            expect(rows.nth(1)).to_contain_text("run.submit")
            ada.screenshot(path=str(shots / "console-audit.png"), full_page=True)
            ada.fill("#a-actor", "olga")
            expect(rows).to_have_count(2)
            ada.select_option("#a-action", "key")
            expect(ada.locator("#audit tbody tr.empty")).to_have_text("No changes match.")
            ada.click("#audit-filters button[type=reset]")
            expect(rows).to_have_count(7)
            ada.select_option("#a-action", "key")
            expect(rows).to_have_count(4)
            expect(rows.first).to_contain_text("cli:ops")
            # Every change here is of project default: another project has none.
            ada.click("#audit-filters button[type=reset]")
            ada.fill("#a-project", "web")
            expect(ada.locator("#audit tbody tr.empty")).to_have_text("No changes match.")
            ada.fill("#a-project", "default")
            expect(rows).to_have_count(7)
            expect(rows.first.locator("td").nth(4)).to_have_text("default")
            # A run's id leads to the run.
            ada.select_option("#a-action", "approval.reject")
            ada.click(f'#audit a[href="#/runs/{run_id}"]')
            expect(ada.locator("#run-id")).to_have_text(run_id)
        finally:
            ada.close()
        assert done["status"] == "queued"
        olga.close()
