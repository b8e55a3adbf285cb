"""The hosted preferences page and the email links: no XSS, no open redirect (Chromium).

The page reflects `utm_campaign` into its forms' action and a JSON script block, and the
subscription id into both and the API address. Each hostile value below is sent by query and
by path, GET and the form's POST, in Chromium: no dialog opens, no script of ours is broken out
of (the raw HTML holds exactly the page's own two `</script>`), every request stays on the
server, and the forms still post to the page's own path. Email click links redirect only to the
link stored for the send: a token naming another target, or none, is 404 without a Location.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Browser, Dialog

from tests.browser import chromium
from tests.integration.prefs_support import PrefsEnv, start_prefs_env
from tests.reliability.conftest import FIGURES

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

HOSTILE = [
    "</script><script>alert(1)</script>",
    '"><img src=x onerror=alert(2)>',
    "'-alert(3)-'",
    "</SCRIPT ><svg onload=alert(4)>",
    "<!--<script>alert(5)//",
    "javascript:alert(6)",
    "\u2028\u2029alert(7)",
    "x\\u003c/script\\u003e",
    "//evil.example/x",
    "&quot;&#34;onmouseover=alert(8)",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefsEnv]:
    yield from start_prefs_env(tmp_path_factory.mktemp("xss"), {"xss": {"email": "x@x.test"}})


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def _urls(env: PrefsEnv, value: str) -> list[str]:
    sid, base = env.sids["xss"], env.server.url
    v = quote(value, safe="")
    return [
        f"{base}/content?s={sid}&utm_campaign={v}",
        f"{base}/content/{sid}?utm_campaign={v}",
        # the subscription id itself hostile: the not-found page, which reflects nothing
        f"{base}/content?s={v}&utm_campaign={v}",
        f"{base}/content/{v}",
    ]


def test_reflected_values_cannot_script_or_leave_the_page(env: PrefsEnv, browser: Browser) -> None:
    context = browser.new_context()
    page = context.new_page()
    dialogs: list[str] = []
    foreign: list[str] = []

    def on_dialog(d: Dialog) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)
    page.on(
        "request",
        lambda r: None if r.url.startswith(env.server.url) else foreign.append(r.url),
    )
    pages = 0
    for value in HOSTILE:
        for url in _urls(env, value):
            raw = httpx.get(url, timeout=30)
            assert raw.status_code in (200, 404), (url, raw.status_code)
            html = raw.text
            closings = len(re.findall(r"</script", html, re.I))
            assert closings == (2 if raw.status_code == 200 else 0), (url, closings)
            # The JSON data block holds the values as data, with no "<" to end it early;
            # nowhere else do they appear as markup.
            block = re.search(
                r'<script type="application/json" id="prefs-data">(.*?)</script>', html, re.S
            )
            if block is not None:
                assert "<" not in block.group(1), (url, block.group(1))
                html = html.replace(block.group(0), "")
            for markup in ("onerror=", "onload=", "<img src=x", "<svg", "javascript:"):
                assert markup not in html, (url, markup)
            page.goto(url)
            pages += 1
            if raw.status_code == 200:
                # The forms post to the page's own path; the data block parses.
                for action in page.eval_on_selector_all(
                    "form",
                    # getAttribute: the form's input named "action" shadows f.action
                    "fs => fs.map(f => new URL(f.getAttribute('action'), location.href).href)",
                ):
                    assert action.startswith(f"{env.server.url}/content/"), (url, action)
                api = page.evaluate(
                    "JSON.parse(document.getElementById('prefs-data').textContent).api"
                )
                assert api.startswith("/cdp/marketing-preferences/"), api
                # Saving with JavaScript goes to the same server, with the value as data.
                page.click("#prefs button[type=submit]")
                page.wait_for_function(
                    "() => { const s = document.getElementById('status').textContent;"
                    " return s && !s.startsWith('Saving'); }"
                )
                status = page.text_content("#status") or ""
                assert "saved" in status, status
    # The no-JavaScript path: the form's POST answers the page again, reflecting the same.
    sid = env.sids["xss"]
    for value in HOSTILE:
        r = httpx.post(
            f"{env.server.url}/content/{sid}?utm_campaign={quote(value, safe='')}",
            data={"action": "save", "channel": "email"},
            timeout=30,
        )
        assert r.status_code == 200, r.text[:200]
        assert len(re.findall(r"</script", r.text, re.I)) == 2
        assert "location" not in r.headers
    context.close()
    assert dialogs == [], dialogs
    assert foreign == [], foreign
    FIGURES.notes.append(
        f"preferences page: {len(HOSTILE)} hostile values x 4 addresses ({pages} pages in"
        " Chromium, saved with JavaScript and by form): no dialog, no request off the server,"
        " no broken-out script"
    )


def test_email_links_are_no_open_redirect(env: PrefsEnv) -> None:
    base = env.server.url
    for token in ["https:%2F%2Fevil.example", "x", "%2F%2Fevil.example", "c.evil", "0" * 64]:
        r = httpx.get(f"{base}/cdp/email/c/{token}", timeout=30, follow_redirects=False)
        assert r.status_code == 404, (token, r.status_code)
        assert "location" not in r.headers
    for q in ["url=https://evil.example", "next=//evil.example", "redirect=https://evil.example"]:
        for path in ("/content", f"/content/{env.sids['xss']}", "/cdp/email/unsubscribe/x"):
            r = httpx.get(f"{base}{path}?{q}", timeout=30, follow_redirects=False)
            assert r.status_code < 300 or r.status_code == 404, (path, q, r.status_code)
            assert "location" not in r.headers, (path, q)
