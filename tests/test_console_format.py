"""The console's texts for a person (its module `format.js`, run in Debian's chromium): an
error naming an address shows whole, never as ``)``; a duration never says ``4 min 60 s``.

The module is served to the page from the package's folder by Playwright's router: no
server, no network."""

from __future__ import annotations

import mimetypes
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
from browser_helpers import launch
from playwright.sync_api import Page, Route, sync_playwright

CONSOLE = resources.files("minions.service") / "console"
ORIGIN = "http://console.test"


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    def serve(route: Route) -> None:
        name = route.request.url.removeprefix(ORIGIN + "/")
        if name == "":
            route.fulfill(body="<!doctype html><title>format</title>", content_type="text/html")
            return
        kind = mimetypes.guess_type(name)[0] or "text/plain"
        route.fulfill(body=(CONSOLE / name).read_text(), content_type=kind)

    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page()
        page.route(f"{ORIGIN}/**", serve)
        page.goto(f"{ORIGIN}/")
        page.evaluate("import('/format.js').then((m) => { window.format = m; })")
        yield page
        browser.close()


def call(page: Page, function: str, *args: Any) -> Any:
    return page.evaluate(f"(args) => window.format.{function}(...args)", list(args))


DOWN = (
    "step 'draft' failed: model call failed after 4 attempts: openai-compatible:qwen at "
    "http://127.0.0.1:8080/v1: connection failed (Connection error.)"
)


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        # A model server that was down: the whole error, its address included (it was `)`).
        (DOWN, DOWN),
        (
            "connection failed (Connection error.); is the server up? "
            "http://10.0.0.2:8080/v1 refused.",
            "connection failed (Connection error.); is the server up? "
            "http://10.0.0.2:8080/v1 refused.",
        ),
        ("GET https://api.example.com/v1.2/models failed.", None),
        # A note to the model is left out; a sentence with an address is never taken for one.
        ("The answer is not JSON. Answer again, more briefly.", "The answer is not JSON."),
        (
            "Connection refused. Call to http://127.0.0.1:11434/v1 failed.",
            "Connection refused. Call to http://127.0.0.1:11434/v1 failed.",
        ),
    ],
)
def test_an_error_shows_whole_to_a_person(page: Page, error: str, shown: str | None) -> None:
    assert call(page, "forPerson", error, 1000) == (error if shown is None else shown)


def test_a_long_error_is_cut_with_a_mark_at_its_limit(page: Page) -> None:
    cut: str = call(page, "forPerson", DOWN, 90)
    assert len(cut) == 90
    assert cut.endswith("…")
    assert DOWN.startswith(cut[:-1])


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.42, "0.42 s"),
        (9.996, "10.0 s"),
        (59.5, "59.5 s"),
        (59.96, "1 min 00 s"),
        (119.6, "2 min 00 s"),
        (299.6, "5 min 00 s"),  # was "4 min 60 s"
        (3599.4, "59 min 59 s"),
        (3599.7, "1 h 00 min"),  # was "59 min 60 s"
        (5400, "1 h 30 min"),
        (7199.9, "2 h 00 min"),
        (90061, "25 h 01 min"),
        (-3, "0.00 s"),
        (None, ""),
    ],
)
def test_a_duration_never_says_60_of_a_unit(page: Page, seconds: float, shown: str) -> None:
    assert call(page, "duration", seconds) == shown


def test_a_time_ahead_never_says_60_minutes(page: Page) -> None:
    now: float = page.evaluate("Date.now() / 1000")
    assert call(page, "relative", now + 3590) == "in 1 h"  # was "in 60 min"
    assert call(page, "relative", now + 600) in ("in 10 min", "in 9 min")
