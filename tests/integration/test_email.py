"""Email on real processes: `mallard mailbox serve` receives what send_email sends; an SMTP
server's 5xx and 4xx answers become Bounced and TryLater; and the links of a tracked email on
a real server: the pixel, click redirects to stored links only, one-click unsubscribe."""

from __future__ import annotations

import email
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from email import policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from aiosmtpd.controller import Controller

from mallard.paths import DataPaths
from orchestration.delivery.email import (
    Bounced,
    Email,
    TryLater,
    send_email,
    sign_token,
    store_links,
    track_links,
    unsubscribe_headers,
    unsubscribe_token,
)
from tests.browser import chromium
from tests.conftest import REPO, free_port, mallard, wait_landed
from tests.integration.prefs_support import PrefsEnv, start_prefs_env

pytestmark = pytest.mark.integration


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the mailbox exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} after {timeout}s")


def _mail(to: str, **kw: Any) -> Email:
    fields: dict[str, Any] = {
        "to": to,
        "sender": "Shop <shop@example.com>",
        "subject": "Hello Zoë",
        "text": "Hi Ann, see https://shop.example/a",
        "html": '<html><body><p>Hi Ann</p><a href="https://shop.example/a">a</a></body></html>',
        "message_id": "<send-1@mallard.example>",
        "headers": {},
        **kw,
    }
    return Email(**fields)


def test_the_mailbox_keeps_what_send_email_sends(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mallard.cli", "mailbox", "serve", "--data-dir", str(data)]
        + ["--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        headers = unsubscribe_headers("http://127.0.0.1:8000", "TOKEN")
        answer = send_email(
            f"smtp://127.0.0.1:{port}", _mail("Ann <ann@example.com>", headers=headers)
        )
        assert answer.startswith("250 "), answer
        # A re-send after a crash carries the same Message-ID.
        send_email(f"smtp://127.0.0.1:{port}", _mail("ann@example.com", headers=headers))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0

    listed = mallard("mailbox", "list", "--json", data_dir=data)
    rows = json.loads(listed.stdout)
    assert [(r["n"], r["to"], r["messageId"]) for r in rows] == [
        (1, "Ann <ann@example.com>", "<send-1@mallard.example>"),
        (2, "ann@example.com", "<send-1@mallard.example>"),
    ]
    assert rows[0]["subject"] == "Hello Zoë" and rows[0]["from"] == "Shop <shop@example.com>"
    assert not list((data / "mailbox").glob(".*.tmp"))

    shown = mallard("mailbox", "show", "1", data_dir=data)
    msg = email.message_from_string(shown.stdout, policy=policy.default)
    assert isinstance(msg, EmailMessage)
    assert msg.get_content_type() == "multipart/alternative"
    parts = list(msg.iter_parts())
    assert [p.get_content_type() for p in parts] == ["text/plain", "text/html"]
    assert parts[0].get_content().strip() == "Hi Ann, see https://shop.example/a"  # type: ignore[attr-defined]
    assert '<a href="https://shop.example/a">' in parts[1].get_content()  # type: ignore[attr-defined]
    assert msg["Message-ID"] == "<send-1@mallard.example>"
    assert msg["Subject"] == "Hello Zoë"
    assert msg["List-Unsubscribe"] == "<http://127.0.0.1:8000/cdp/email/unsubscribe/TOKEN>"
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    by_id = mallard("mailbox", "show", "send-1@mallard.example", data_dir=data)
    assert "Message-ID: <send-1@mallard.example>" in by_id.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "mallard.cli", "mailbox", "show", "9", "--data-dir", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "no message" in missing.stderr


class Refusing:
    """Refuses some recipients the way mail servers do; keeps the rest."""

    def __init__(self) -> None:
        self.kept: list[bytes] = []

    async def handle_RCPT(  # noqa: N802
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        if address.startswith("gone@"):
            return "550 5.1.1 <gone@example.com>: user unknown"
        if address.startswith("busy@"):
            return "451 4.2.1 mailbox busy, try later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        if "spam@" in envelope.rcpt_tos[0]:
            return "554 5.7.1 message refused"
        self.kept.append(envelope.original_content)
        return "250 2.0.0 kept"


@pytest.fixture
def refusing() -> Iterator[tuple[str, Refusing]]:
    handler = Refusing()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield f"smtp://127.0.0.1:{port}", handler
    finally:
        controller.stop()


def test_5xx_bounces_and_4xx_or_no_server_is_tried_later(refusing: tuple[str, Refusing]) -> None:
    url, handler = refusing
    with pytest.raises(Bounced) as bounced:
        send_email(url, _mail("gone@example.com"))
    assert bounced.value.code == 550 and "user unknown" in bounced.value.message
    with pytest.raises(Bounced) as refused:
        send_email(url, _mail("spam@example.com"))
    assert refused.value.code == 554
    with pytest.raises(TryLater) as later:
        send_email(url, _mail("busy@example.com"))
    assert later.value.code == 451
    with pytest.raises(TryLater) as down:
        send_email(f"smtp://127.0.0.1:{free_port()}", _mail("ann@example.com"), timeout=5)
    assert down.value.code is None
    assert handler.kept == []
    assert send_email(url, _mail("ann@example.com")) == "250 2.0.0 kept"
    assert len(handler.kept) == 1


# --- the links of a tracked email on a real server -------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefsEnv]:
    users = {
        "reader": {"email": "reader@example.com"},
        "other": {"email": "o@example.com"},
        "browser": {"email": "b@example.com"},
    }
    yield from start_prefs_env(tmp_path_factory.mktemp("email-links"), users)


def _send(env: PrefsEnv, user: str, send_id: str) -> dict[str, Any]:
    c = env.server.creds
    return {
        "sendId": send_id,
        "assetId": "welcome",
        "eventId": f"cmd-{send_id}",
        "customerId": env.customer_ids[user],
        "clientId": c["clientId"],
        "accountId": c["accountId"],
        "brandId": c["brandId"],
        "userId": user,
    }


def _landed(data_dir: Path, event: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((data_dir / "landing").glob("date=*/*.parquet")):
        for row in pq.read_table(f, columns=["event", "message"]).to_pylist():
            if row["event"] == event:
                out.append(json.loads(row["message"]))
    return out


def _wait_for(data_dir: Path, event: str, n: int, timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _landed(data_dir, event)
        if len(found) >= n:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{n} {event} not landed after {timeout}s")


def test_open_and_click_are_events_and_clicks_go_only_to_stored_links(env: PrefsEnv) -> None:
    srv, paths = env.server, DataPaths(env.server.data_dir)
    send = _send(env, "reader", "send-links-1")
    html = (
        "<html><body>"
        '<a href="https://shop.example/a?x=1&amp;y=2">a</a>'
        '<a href="https://shop.example/b">b</a>'
        "</body></html>"
    )
    out, links = track_links(html, srv.url, paths, send)
    store_links(paths, send["sendId"], links)
    clicks = re.findall(r'href="([^"]+)"', out)
    pixel = re.search(r'<img src="([^"]+)"', out)
    assert len(clicks) == 2 and pixel

    r = httpx.get(pixel[1], timeout=30)
    assert r.status_code == 200 and r.headers["content-type"] == "image/gif"
    assert r.content.startswith(b"GIF89a") and "no-cache" in r.headers["cache-control"]
    # A tampered pixel still answers the GIF (and records nothing).
    bad = httpx.get(pixel[1].replace(".gif", "x.gif"), timeout=30)
    assert bad.status_code == 200 and bad.content == r.content

    r = httpx.get(clicks[1], timeout=30, follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == "https://shop.example/b"
    r = httpx.get(clicks[0], timeout=30, follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == "https://shop.example/a?x=1&y=2"

    token = clicks[0].rsplit("/", 1)[1]
    tampered = f"{token[:5]}{'A' if token[5] != 'A' else 'B'}{token[6:]}"
    beyond = sign_token(paths, {"s": send["sendId"], "k": "c", "i": 2, "u": "reader"})
    unknown_send = sign_token(paths, {"s": "no-such-send", "k": "c", "i": 0, "u": "reader"})
    for t in (tampered, beyond, unknown_send, "nonsense"):
        r = httpx.get(f"{srv.url}/cdp/email/c/{t}", timeout=30, follow_redirects=False)
        assert r.status_code == 404, (t, r.text)
        assert "location" not in r.headers
        assert r.json()["error"]["code"] == "not_found"

    opened = _wait_for(srv.data_dir, "email_opened", 1)
    clicked = _wait_for(srv.data_dir, "email_clicked", 2)
    # A handshake, not a pause: a recorded open or click is in the collector's log before its
    # answer, and this marker is acknowledged after every answer above; the one collector
    # lands its log's segments in order, so once the marker has landed, so has anything a
    # tampered token recorded.
    marker = srv.post("track", {"userId": "reader", "event": "after the tampered tokens"})
    assert marker.status_code == 200, marker.text
    wait_landed(srv.data_dir, [marker.json()["eventId"]])
    assert len(_landed(srv.data_dir, "email_opened")) == 1
    assert len(_landed(srv.data_dir, "email_clicked")) == 2
    o = opened[0]
    assert o["userId"] == "reader" and o["type"] == "track"
    assert o["properties"] == {
        "sendId": "send-links-1",
        "assetId": "welcome",
        "sendType": "email",
        "commandEventId": "cmd-send-links-1",
    }
    assert [c["properties"]["url"] for c in clicked] == [
        "https://shop.example/b",
        "https://shop.example/a?x=1&y=2",
    ]
    assert all(c["properties"]["sendType"] == "email" for c in clicked)

    assert srv.pipeline().returncode == 0
    r = srv.get("profiles/userId:reader/events", params={"sort": "asc", "size": 100})
    assert r.status_code == 200, r.text
    actions = [e["eventAction"] for e in r.json()["data"]]
    assert actions.count("email_opened") == 1 and actions.count("email_clicked") == 2


def test_one_click_unsubscribes_and_the_page_only_asks(env: PrefsEnv) -> None:
    srv, paths = env.server, DataPaths(env.server.data_dir)
    send = _send(env, "other", "send-unsub-1")
    headers = unsubscribe_headers(srv.url, unsubscribe_token(paths, send))
    url = headers["List-Unsubscribe"].strip("<>")
    assert env.get("other").json()["unsubscribeAll"] is False

    page = httpx.get(url, timeout=30)
    assert page.status_code == 200 and 'method="post"' in page.text
    assert 'name="List-Unsubscribe" value="One-Click"' in page.text
    assert env.get("other").json()["unsubscribeAll"] is False

    token = url.rsplit("/", 1)[1]
    forged = sign_token(paths, {"k": "c", "c": send["customerId"], "i": 0})
    for bad in (token[:-2] + "AA", forged):
        r = httpx.post(
            f"{srv.url}/cdp/email/unsubscribe/{bad}",
            content=b"List-Unsubscribe=One-Click",
            headers={"content-type": "application/x-www-form-urlencoded"},
            timeout=30,
        )
        assert r.status_code == 404
    assert env.get("other").json()["unsubscribeAll"] is False

    r = httpx.post(
        url,
        content=b"List-Unsubscribe=One-Click",
        headers={"content-type": "application/x-www-form-urlencoded"},
        timeout=30,
        follow_redirects=False,
    )
    assert r.status_code == 200 and "unsubscribed" in r.text
    assert env.get("other").json()["unsubscribeAll"] is True
    assert env.get("reader").json()["unsubscribeAll"] is False

    assert srv.pipeline().returncode == 0
    events = srv.get("profiles/userId:other/events", params={"sort": "asc", "size": 100})
    unsub = [e for e in events.json()["data"] if e["eventAction"] == "unsubscribed"]
    assert len(unsub) == 1 and unsub[0]["rawData"]["properties"]["assetId"] == "welcome"
    assert env.get("other").json()["unsubscribeAll"] is True


def test_the_unsubscribe_page_works_in_a_browser_talking_only_to_mallard(env: PrefsEnv) -> None:
    """The page a mail's unsubscribe link opens, in Chromium: it renders, its button
    unsubscribes, and the page asks nothing of any host but Mallard's."""
    srv, paths = env.server, DataPaths(env.server.data_dir)
    send = _send(env, "browser", "send-unsub-browser")
    url = unsubscribe_headers(srv.url, unsubscribe_token(paths, send))["List-Unsubscribe"]
    with chromium() as browser:
        page = browser.new_page()
        foreign: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(srv.url) else foreign.append(r.url))
        page.goto(url.strip("<>"))
        assert env.get("browser").json()["unsubscribeAll"] is False  # the GET changed nothing
        page.get_by_role("button", name="Unsubscribe").click()
        page.wait_for_load_state()
        assert "unsubscribed" in page.content()
    assert foreign == []
    assert env.get("browser").json()["unsubscribeAll"] is True
