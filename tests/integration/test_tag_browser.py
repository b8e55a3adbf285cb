"""The website tag in a real browser: the README snippet on a page of another origin, headless
Debian chromium, Mallard serving analytics.js, its chunks and settings, then the pipeline and the
read API.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from tests.browser import chromium
from tests.conftest import REPO, Server, free_port, init_data_dir

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
QS = (
    "?ajs_uid=qs-user-2&ajs_trait_email=q2%40example.com&ajs_trait_plan=basic"
    "&ajs_event=Clicked%20Email&ajs_prop_campaign=spring&ajs_aid=qs-anon-2"
)


def readme_snippet(events_url: str, write_key: str) -> str:
    """The snippet exactly as README.md tells users to paste it, for this server and key."""
    readme = (REPO / "README.md").read_text()
    m = re.search(r"<!-- tag-snippet -->\n```html\n(.*?)```", readme, re.S)
    assert m, "README.md has no tag snippet block"
    snippet = m.group(1)
    assert "YOUR_WRITE_KEY" in snippet and "http://127.0.0.1:8000" in snippet
    return snippet.replace("http://127.0.0.1:8000", events_url).replace("YOUR_WRITE_KEY", write_key)


class PageServer:
    """A tiny site on its own loopback port: another origin than Mallard, so CORS is real."""

    def __init__(self, html: str) -> None:
        body = html.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if urlparse(self.path).path != "/index.html":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Traffic:
    """Every request the pages made, and the answers of Mallard's event endpoints."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.allow_origin: list[str | None] = []  # on each answer to an event POST
        self.delivered: list[tuple[str, dict[str, Any]]] = []  # (path, body) answered 200
        self.statuses: list[tuple[str, int]] = []
        self.retry_headers: list[str] = []

    def on_request(self, request: Any) -> None:
        self.urls.append(request.url)
        if "/cdp/events/" in request.url and "x-retry-count" in request.headers:
            self.retry_headers.append(request.headers["x-retry-count"])

    def on_response(self, response: Any) -> None:
        request = response.request
        if request.method != "POST" or "/cdp/events/std/" not in request.url:
            return
        path = urlparse(request.url).path
        self.statuses.append((path, response.status))
        self.allow_origin.append(response.headers.get("access-control-allow-origin"))
        if response.status == 200:
            self.delivered.append((path, json.loads(request.post_data or "{}")))

    def delivered_where(self, **want: Any) -> list[dict[str, Any]]:
        return [b for _, b in self.delivered if all(b.get(k) == v for k, v in want.items())]


def wait_until(page: Any, condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Poll while letting Playwright deliver its events (no fixed sleep)."""
    for _ in range(int(timeout_s * 10)):
        if condition():
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def browser_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Drive the tag through every scenario once, then run the pipeline once."""
    d = tmp_path_factory.mktemp("tag") / "data"
    creds = init_data_dir(d)
    server = Server(d, free_port(), creds, env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    server.start()
    html = (
        "<!doctype html><html><head><title>Mallard tag test</title>\n"
        + readme_snippet(server.url, creds["writeKey"])
        + "\n</head><body><h1>tag test</h1></body></html>"
    )
    site = PageServer(html)
    traffic = Traffic()
    try:
        with chromium() as browser:
            run_visitor(browser, site.url, traffic)
            run_querystring(browser, site.url, traffic)
        server.pipeline()
        yield {"server": server, "traffic": traffic, "site": site.url}
    finally:
        site.close()
        server.stop()


def _context(browser: Any, traffic: Traffic) -> Any:
    context = browser.new_context()
    context.on("request", traffic.on_request)
    context.on("response", traffic.on_response)
    return context


def run_visitor(browser: Any, site: str, traffic: Traffic) -> None:
    """page(), page(category, name), identify, track, a forced 500 and its retry, reset()."""
    context = _context(browser, traffic)
    page = context.new_page()
    failed_once: list[str] = []

    def fail_first_retry_tested(route: Any) -> None:
        # The first "Retry Tested" reaches Mallard (and is stored) but the tag sees a 500, so
        # it sends the same message again: the models must keep it once.
        body = json.loads(route.request.post_data or "{}")
        if body.get("event") == "Retry Tested" and not failed_once:
            route.fetch()
            failed_once.append(body["messageId"])
            route.fulfill(
                status=500,
                headers={"access-control-allow-origin": "*", "content-type": "application/json"},
                body='{"success":false,"message":"forced by the test"}',
            )
            return
        route.continue_()

    page.route("**/cdp/events/std/t", fail_first_retry_tested)
    page.goto(f"{site}/index.html")
    page.wait_for_function("window.analytics && window.analytics.initialized === true")
    wait_until(page, lambda: len(traffic.delivered_where(type="page")) == 1, "the snippet's page()")
    page.evaluate("analytics.page('Docs', 'Install', {section: 'tag'})")
    wait_until(page, lambda: bool(traffic.delivered_where(name="Install")), "page(category, name)")
    page.evaluate(
        "analytics.identify('tag-user-1', {email: 'tag1@example.com', plan: 'pro',"
        " firstName: 'Tag', lastName: 'User'})"
    )
    wait_until(page, lambda: bool(traffic.delivered_where(type="identify")), "identify")
    page.evaluate("analytics.track('Signed Up', {plan: 'pro', seats: 3})")
    page.evaluate("analytics.track('Retry Tested', {attempt: 'first'})")
    wait_until(page, lambda: bool(traffic.delivered_where(event="Retry Tested")), "the retry")
    anon_before = page.evaluate("analytics.user().anonymousId()")
    page.evaluate("analytics.reset()")
    page.evaluate("analytics.track('After Reset')")
    anon_after = page.evaluate("analytics.user().anonymousId()")
    page.evaluate(
        "analytics.page(null, 'Override', {}, {anonymousId: 'opt-anon-1',"
        " context: {ip: '203.0.113.9'}})"
    )
    wait_until(page, lambda: bool(traffic.delivered_where(event="After Reset")), "After Reset")
    wait_until(page, lambda: bool(traffic.delivered_where(name="Override")), "options override")
    traffic.anon_before_reset = anon_before  # type: ignore[attr-defined]
    traffic.anon_after_reset = anon_after  # type: ignore[attr-defined]
    traffic.failed_once = failed_once  # type: ignore[attr-defined]
    context.close()


def run_querystring(browser: Any, site: str, traffic: Traffic) -> None:
    """ajs_uid / ajs_trait_* / ajs_event / ajs_prop_* / ajs_aid on the landing URL."""
    context = _context(browser, traffic)
    page = context.new_page()
    page.goto(f"{site}/index.html{QS}")
    wait_until(
        page,
        lambda: (
            bool(traffic.delivered_where(event="Clicked Email"))
            and bool(traffic.delivered_where(type="identify", userId="qs-user-2"))
            and bool(traffic.delivered_where(type="page", anonymousId="qs-anon-2"))
        ),
        "the querystring triggers",
    )
    context.close()


def read_events(server: Server) -> list[dict[str, Any]]:
    r = server.get("events/", params={"size": 100, "sort": "asc"})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_page_only_talks_to_loopback(browser_run: dict[str, Any]) -> None:
    traffic: Traffic = browser_run["traffic"]
    hosts = {urlparse(u).hostname for u in traffic.urls}
    assert hosts <= LOOPBACK, f"the page contacted {hosts - LOOPBACK}"
    server: Server = browser_run["server"]
    loaded = [u for u in traffic.urls if u.startswith(server.url)]
    assert any(u.endswith("/analytics.min.js") for u in loaded)
    assert any("/cdp/v1/projects/" in u and u.endswith("/settings") for u in loaded)
    # The querystring triggers live in a lazy chunk: it came from Mallard too.
    assert any("/cdp/analytics-next/bundles/queryString." in u for u in loaded)


def test_events_are_cross_origin_with_cors(browser_run: dict[str, Any]) -> None:
    traffic: Traffic = browser_run["traffic"]
    server: Server = browser_run["server"]
    # The page is another origin than Mallard, and the tag's requests (Authorization and
    # X-Retry-Count headers: preflighted) were allowed.
    assert urlparse(browser_run["site"]).port != urlparse(server.url).port
    assert traffic.allow_origin and set(traffic.allow_origin) == {"*"}


def test_forced_500_is_retried_with_the_same_message(browser_run: dict[str, Any]) -> None:
    traffic: Traffic = browser_run["traffic"]
    (first,) = traffic.failed_once  # type: ignore[attr-defined]
    assert ("/cdp/events/std/t", 500) in traffic.statuses
    retried = traffic.delivered_where(event="Retry Tested")
    assert [b["messageId"] for b in retried] == [first]
    assert traffic.retry_headers, "the retry carried X-Retry-Count through CORS"


def test_read_api_shows_each_event_once(browser_run: dict[str, Any]) -> None:
    server: Server = browser_run["server"]
    traffic: Traffic = browser_run["traffic"]
    events = read_events(server)
    by_name: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in events:
        by_name.setdefault((e["eventAction"], e["rawData"]["event"]), []).append(e)
    expected = {
        ("page", "page"): 2,  # the snippet's page() in each browser context
        ("page", "Install"): 1,
        ("page", "Override"): 1,
        ("identify", "identify"): 2,
        ("signed_up", "Signed Up"): 1,
        ("retry_tested", "Retry Tested"): 1,
        ("after_reset", "After Reset"): 1,
        ("clicked_email", "Clicked Email"): 1,
    }
    assert {k: len(v) for k, v in by_name.items()} == expected
    assert all(e["source"] == "browser" for e in events)

    # Before identify, the visitor's page view is attributed to the user identified later.
    user1 = {k for k, v in by_name.items() for e in v if e["userId"] == "tag-user-1"}
    assert user1 == {
        ("page", "page"),
        ("page", "Install"),
        ("identify", "identify"),
        ("signed_up", "Signed Up"),
        ("retry_tested", "Retry Tested"),
    }
    install = by_name[("page", "Install")][0]["rawData"]
    assert install["properties"]["category"] == "Docs"
    assert install["properties"]["section"] == "tag"
    assert install["context"]["ip"] == "127.0.0.1"  # recorded from the request for the tag
    assert by_name[("signed_up", "Signed Up")][0]["rawData"]["properties"] == {
        "plan": "pro",
        "seats": 3,
    }

    # reset(): a new anonymous visitor, no userId.
    after = by_name[("after_reset", "After Reset")][0]
    assert after["userId"] is None
    assert after["rawData"]["anonymousId"] == traffic.anon_after_reset  # type: ignore[attr-defined]
    assert traffic.anon_after_reset != traffic.anon_before_reset  # type: ignore[attr-defined]
    # options.anonymousId and options.context.ip are honoured.
    override = by_name[("page", "Override")][0]["rawData"]
    assert override["anonymousId"] == "opt-anon-1"
    assert override["context"]["ip"] == "203.0.113.9"

    # Querystring triggers: identify with traits, track with properties, the given anonymousId.
    clicked = by_name[("clicked_email", "Clicked Email")][0]
    assert clicked["userId"] == "qs-user-2"
    assert clicked["rawData"]["properties"]["campaign"] == "spring"
    assert clicked["rawData"]["anonymousId"] == "qs-anon-2"


def test_read_api_shows_traits(browser_run: dict[str, Any]) -> None:
    server: Server = browser_run["server"]
    t1 = server.get("profiles/userId:tag-user-1/traits")
    assert t1.status_code == 200, t1.text
    traits = t1.json()
    assert traits["email"] == "tag1@example.com" and traits["plan"] == "pro"
    assert traits["name"] == "Tag User"
    t2 = server.get("profiles/userId:qs-user-2/traits").json()
    assert t2["email"] == "q2@example.com" and t2["plan"] == "basic"
    events = server.get("profiles/userId:tag-user-1/events", params={"size": 100}).json()["data"]
    assert sorted(e["eventAction"] for e in events) == [
        "identify",
        "page",
        "page",
        "retry_tested",
        "signed_up",
    ]


def test_the_read_api_has_no_cors(browser_run: dict[str, Any]) -> None:
    server: Server = browser_run["server"]
    r = httpx.request(
        "OPTIONS",
        server.base + "/events/",
        headers={"origin": browser_run["site"], "access-control-request-method": "GET"},
    )
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(
        server.base + "/events/", headers={**server.headers, "origin": browser_run["site"]}
    )
    assert "access-control-allow-origin" not in r.headers
