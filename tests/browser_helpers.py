"""Debian's chromium, driven by Playwright, for the console's tests: a missing browser fails
them with how to get it, not a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MISSING = (
    "the console's tests need Debian's chromium at {path}, which is missing: install it "
    "with `sudo apt-get install chromium` (`make check` runs these tests)"
)


def launch(playwright: Playwright, path: str = CHROMIUM) -> Browser:
    """Chromium at `path`, headless; a test fails with how to install it when it is missing."""
    if not Path(path).exists():
        pytest.fail(MISSING.format(path=path), pytrace=False)
    return playwright.chromium.launch(executable_path=path, headless=True, args=ARGS)
