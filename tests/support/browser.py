"""A real browser for the console's tests: Playwright driving Debian's Chromium, headless.

Playwright's own browser download is not reachable here, so it launches the ``chromium`` on the
PATH (``make test`` installs it when missing: scripts/services.sh). As root Chromium needs
``--no-sandbox``; the other flags keep it from reaching out to the network. Playwright gives
every launch a fresh, temporary profile (``--user-data-dir``) of its own, so runs stay
independent.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is not installed: run `make test` (scripts/services.sh installs it)")
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``) for the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()
