"""Headless Debian chromium for the browser tests, driven by Playwright (never its download)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags chromium keeps dialling Google's hosts, which this
# machine's closed network refuses; a page under test must reach loopback only.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Chromium's own lookups (accounts.google.com, update.googleapis.com, clients2.google.com:
    # seen by make test-airgap) never leave the machine; a page's request to another host is
    # still made, recorded by the tests' request listeners, and fails at once.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    # Fail, never skip: `make test-deps` installs it, and a skipped browser test proves nothing.
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test-deps` installs Debian chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
