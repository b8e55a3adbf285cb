"""The tag never asks a host but Mallard, on the paths where it fails or falls back: the settings
or its chunks failing to load (its error metrics went to api.segment.io), a plain <script> tag
over http without the snippet (its CDN was cdn.segment.com), an old browser that needs polyfills
(they came from cdnjs). Every request of each page is recorded; any off loopback fails the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from playwright.sync_api import Browser, BrowserContext, Page

from tests.browser import chromium
from tests.conftest import Server, free_port, init_data_dir
from tests.integration.test_tag_browser import LOOPBACK, PageServer, readme_snippet, wait_until

pytestmark = pytest.mark.integration

OLD_FIREFOX = "Mozilla/5.0 (Windows NT 10.0; rv:46.0) Gecko/20100101 Firefox/46"


class Requests:
    """Every request of a browser context, and its console's messages."""

    def __init__(self, context: BrowserContext) -> None:
        self.urls: list[str] = []
        self.console: list[str] = []
        context.on("request", lambda r: self.urls.append(r.url))
        context.on("console", lambda m: self.console.append(m.text))

    def foreign(self) -> list[str]:
        return [u for u in self.urls if urlparse(u).hostname not in LOOPBACK]

    def to(self, fragment: str) -> list[str]:
        return [u for u in self.urls if fragment in u]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Browser]]:
    d = tmp_path_factory.mktemp("tag-offline") / "data"
    server = Server(d, free_port(), init_data_dir(d), env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    server.start()
    try:
        with chromium() as browser:
            yield server, browser
    finally:
        server.stop()


def visit(
    browser: Browser,
    head: str,
    query: str = "",
    user_agent: str | None = None,
    route: tuple[str, Callable[[Any], None]] | None = None,
) -> tuple[Page, Requests, PageServer]:
    site = PageServer(f"<!doctype html><html><head>{head}</head><body>t</body></html>")
    context = browser.new_context(user_agent=user_agent)
    requests = Requests(context)
    if route:
        context.route(*route)
    page = context.new_page()
    page.goto(f"{site.url}/index.html{query}")
    return page, requests, site


def settle(page: Page, requests: Requests, server: Server) -> None:
    """A request the page makes now is reported after every request it made before: once it
    is seen, nothing the page did so far is still to come."""
    mark = f"{server.url}/health?settled={len(requests.urls)}"
    page.evaluate("url => fetch(url, {mode: 'no-cors'}).then(() => 0)", mark)
    wait_until(page, lambda: mark in requests.urls, "the settle request")


def started(page: Page, requests: Requests) -> None:
    """The tag initialized; a request off loopback on the way fails at once, naming it."""
    ready = "!!(window.analytics && window.analytics.initialized === true)"
    wait_until(page, lambda: bool(requests.foreign()) or page.evaluate(ready), "the tag to start")
    assert requests.foreign() == [], f"requests off loopback: {requests.foreign()}"


def test_settings_failing_to_load_send_nothing_elsewhere(setup: tuple[Server, Browser]) -> None:
    server, browser = setup
    snippet = readme_snippet(server.url, server.creds["writeKey"])
    page, requests, site = visit(
        browser, snippet, route=("**/cdp/v1/projects/*/settings", lambda r: r.abort())
    )
    try:
        wait_until(
            page,
            lambda: any("Failed to load Analytics.js" in m for m in requests.console),
            "the tag's load error",
        )
        settle(page, requests, server)
        assert requests.foreign() == [], f"requests off loopback: {requests.foreign()}"
        assert requests.to("/settings"), requests.urls
    finally:
        page.context.close()
        site.close()


def test_chunks_failing_to_load_send_nothing_elsewhere(setup: tuple[Server, Browser]) -> None:
    server, browser = setup
    key = server.creds["writeKey"]
    # A site that turns on the legacy video plugins needs their chunk to start, and the
    # querystring triggers need theirs: every chunk fails, so the tag fails to load.
    snippet = readme_snippet(server.url, key).replace(
        f'analytics.load("{key}");',
        f'analytics.load("{key}", {{updateCDNSettings: function (s) {{'
        " s.legacyVideoPluginsEnabled = true; return s; }});",
    )
    page, requests, site = visit(
        browser,
        snippet,
        query="?ajs_uid=chunkless&ajs_event=Chunk%20Failed",
        route=("**/cdp/analytics-next/bundles/*", lambda r: r.abort()),
    )
    try:
        wait_until(
            page,
            lambda: any("Failed to load Analytics.js" in m for m in requests.console),
            "the tag's load error",
        )
        page.evaluate("window.analytics.reset()")  # the snippet's stub: still no request out
        settle(page, requests, server)
        assert requests.foreign() == [], f"requests off loopback: {requests.foreign()}"
        assert requests.to("/bundles/legacyVideos."), requests.urls
    finally:
        page.context.close()
        site.close()


def test_a_plain_script_tag_over_http_finds_mallard(setup: tuple[Server, Browser]) -> None:
    server, browser = setup
    key = server.creds["writeKey"]
    tag = f'<script src="{server.url}/cdp/analytics.js/v1/{key}/analytics.min.js"></script>'
    page, requests, site = visit(browser, tag)
    try:
        started(page, requests)
        page.evaluate("analytics.track('Plain Tag')")
        wait_until(page, lambda: bool(requests.to("/cdp/events/std/t")), "the track")
        page.evaluate("analytics.reset()")
        settle(page, requests, server)
        assert requests.foreign() == [], f"requests off loopback: {requests.foreign()}"
        assert requests.to(f"{server.url}/cdp/v1/projects/{key}/settings")
    finally:
        page.context.close()
        site.close()


def test_an_old_browser_gets_its_polyfill_from_mallard(setup: tuple[Server, Browser]) -> None:
    server, browser = setup
    snippet = readme_snippet(server.url, server.creds["writeKey"])
    page, requests, site = visit(browser, snippet, user_agent=OLD_FIREFOX)
    try:
        started(page, requests)
        wait_until(page, lambda: bool(requests.to("/cdp/events/std/p")), "the snippet's page()")
        settle(page, requests, server)
        assert requests.foreign() == [], f"requests off loopback: {requests.foreign()}"
        assert requests.to(f"{server.url}/cdp/analytics-next/bundles/babel-polyfill-7.7.0.min.js")
    finally:
        page.context.close()
        site.close()
