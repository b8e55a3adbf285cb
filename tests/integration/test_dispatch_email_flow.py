"""A customer's email on real processes, from received messages: opening the pixel and
following a tracked link of a message at the loopback SMTP sink become `email_opened` and
`email_clicked`; the one-click unsubscribe of a received marketing message's List-Unsubscribe
header makes the next marketing send `email_skipped` (preferences) while a transactional one
still arrives. No MALLARD_PUBLIC_URL is set: every link points at the address the server
listens on."""

from __future__ import annotations

import email
import email.policy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from html import unescape
from typing import Any

import httpx
import pytest
from aiosmtpd.controller import Controller

from mallard.harness import pipeline_pass
from tests.conftest import Server, free_port, init_data_dir, wait_landed

pytestmark = pytest.mark.integration


class Sink:
    def __init__(self) -> None:
        self.raw: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.raw.append(envelope.original_content or envelope.content)
        return "250 OK"

    def messages(self) -> list[EmailMessage]:
        out = []
        for raw in self.raw:
            msg = email.message_from_bytes(raw, policy=email.policy.default)
            assert isinstance(msg, EmailMessage)
            out.append(msg)
        return out


@dataclass
class Flow:
    server: Server
    sink: Sink
    first: dict[str, EmailMessage] = field(default_factory=dict)  # assetId -> message
    later: list[EmailMessage] = field(default_factory=list)  # after the unsubscribe
    commands: dict[str, str] = field(default_factory=dict)  # name -> eventId
    subscription_id: str = ""
    preferences_link: str = ""  # in the welcome email
    pixel: httpx.Response | None = None
    click: httpx.Response | None = None
    clicked_url: str = ""
    unsubscribe: httpx.Response | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


def _track(server: Server, body: dict[str, Any]) -> str:
    r = server.post("track", body)
    assert r.status_code == 200, r.text
    return str(r.json()["eventId"])


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    root = tmp_path_factory.mktemp("email-flow")
    sink, smtp_port = Sink(), free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    data = root / "data"
    server = Server(data, free_port(), init_data_dir(data), env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    server.start()

    def run_pass() -> None:
        pipeline_pass(data, {"MALLARD_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}"})

    try:
        f = Flow(server, sink)
        r = server.post(
            "identify",
            {
                "userId": "u1",
                "event": "identify",
                "traits": {"email": "ann@example.com", "firstName": "Ann"},
            },
        )
        assert r.status_code == 200, r.text
        wait_landed(data, [str(r.json()["eventId"])])
        run_pass()
        sid = f.subscription_id = server.get("profiles/userId:u1/meta").json()["_subscriptionId"]
        # Opted in to email and to the newsletter's category, through the preferences API.
        r = httpx.post(
            f"{server.url}/cdp/marketing-preferences/{sid}",
            json={
                "channels": [{"channel": "email", "subscribed": True}],
                "categories": [{"category": "weekly_news", "subscribed": True}],
            },
            timeout=30,
        )
        assert r.status_code == 200, r.text
        f.commands["news1"] = _track(
            server,
            {
                "userId": "u1",
                "event": "send_email",
                "assetId": "newsletter",
                "items": [{"title": "Ducks", "url": "https://shop.example/ducks?a=1&b=2"}],
            },
        )
        f.commands["welcome1"] = _track(
            server, {"userId": "u1", "event": "send_email", "assetId": "welcome"}
        )
        wait_landed(data, list(f.commands.values()))
        run_pass()
        msgs = sink.messages()
        assert len(msgs) == 2, [m["Subject"] for m in msgs]
        f.first = {("newsletter" if "List-Unsubscribe" in m else "welcome"): m for m in msgs}
        assert set(f.first) == {"newsletter", "welcome"}
        link = re.search(r"Your preferences: (\S+)", _text(f.first["welcome"]))
        assert link, _text(f.first["welcome"])
        f.preferences_link = link[1]

        # Open and click the newsletter as a mail client would.
        html_part = f.first["newsletter"].get_body(preferencelist=("html",))
        assert html_part is not None
        html = html_part.get_content()  # type: ignore[attr-defined]
        pixel = re.search(r'<img src="([^"]+/cdp/email/o/[^"]+)"', html)
        links = [unescape(u) for u in re.findall(r'href="([^"]+/cdp/email/c/[^"]+)"', html)]
        assert pixel and links, html
        f.pixel = httpx.get(unescape(pixel[1]), timeout=30)
        f.click = httpx.get(links[0], timeout=30, follow_redirects=False)
        # One-click unsubscribe from the received header (RFC 8058).
        header = str(f.first["newsletter"]["List-Unsubscribe"])
        f.unsubscribe = httpx.post(
            header.strip().strip("<>"),
            content=b"List-Unsubscribe=One-Click",
            headers={"content-type": "application/x-www-form-urlencoded"},
            timeout=30,
            follow_redirects=False,
        )
        # Then a marketing send and a transactional one.
        f.commands["news2"] = _track(
            server, {"userId": "u1", "event": "send_email", "assetId": "newsletter"}
        )
        f.commands["welcome2"] = _track(
            server, {"userId": "u1", "event": "send_email", "assetId": "welcome"}
        )
        wait_landed(data, [f.commands["news2"], f.commands["welcome2"]])
        run_pass()
        f.later = sink.messages()[2:]
        run_pass()  # the outcome events of the last dispatch load
        r = server.get("events/", params={"sort": "asc", "size": 100})
        assert r.status_code == 200, r.text
        f.events = r.json()["data"]
        yield f
    finally:
        server.stop()
        controller.stop()


def _text(msg: EmailMessage) -> str:
    part = msg.get_body(preferencelist=("plain",))
    assert part is not None
    return str(part.get_content())  # type: ignore[attr-defined]


def _props(e: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = e["rawData"]["properties"]
    return props


def _send_id(msg: EmailMessage) -> str:
    m = re.fullmatch(r"<([0-9a-f]+)@mallard>", str(msg["Message-ID"]))
    assert m, msg["Message-ID"]
    return m[1]


def test_opening_and_clicking_a_received_message_are_events(flow: Flow) -> None:
    assert flow.pixel is not None and flow.pixel.status_code == 200
    assert flow.pixel.content.startswith(b"GIF89a")
    assert flow.click is not None and flow.click.status_code == 302
    assert flow.click.headers["location"] == "https://shop.example/ducks?a=1&b=2"

    sid = _send_id(flow.first["newsletter"])
    opened = [e for e in flow.events if e["eventAction"] == "email_opened"]
    clicked = [e for e in flow.events if e["eventAction"] == "email_clicked"]
    assert len(opened) == 1 and len(clicked) == 1, [e["eventAction"] for e in flow.events]
    for e in opened + clicked:
        assert e["userId"] == "u1"
        p = _props(e)
        assert p["sendId"] == sid and p["assetId"] == "newsletter"
        assert p["commandEventId"] == flow.commands["news1"]
    assert _props(clicked[0])["url"] == "https://shop.example/ducks?a=1&b=2"


def test_the_demo_welcome_email_links_to_the_servers_preferences_page(flow: Flow) -> None:
    assert flow.preferences_link == f"{flow.server.url}/content?s={flow.subscription_id}"
    page = httpx.get(flow.preferences_link, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<h1>Your communication preferences</h1>" in page.text, page.text[:500]
    # A marketing email gets one link to the page, with its campaign, added when it is sent.
    news = _text(flow.first["newsletter"])
    assert re.findall(r"\S+/content\?\S+", news) == [
        f"{flow.server.url}/content?s={flow.subscription_id}&utm_campaign=newsletter"
    ]


def test_one_click_unsubscribe_skips_marketing_but_not_transactional(flow: Flow) -> None:
    assert flow.unsubscribe is not None and flow.unsubscribe.status_code == 200
    assert "unsubscribed" in flow.unsubscribe.text
    assert "List-Unsubscribe" not in flow.first["welcome"]
    assert flow.first["newsletter"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"

    # After the unsubscribe only the transactional message arrived.
    assert [str(m["Subject"]) for m in flow.later] == ["Welcome, Ann"]
    skipped = [e for e in flow.events if e["eventAction"] == "email_skipped"]
    assert len(skipped) == 1, [e["eventAction"] for e in flow.events]
    p = _props(skipped[0])
    assert p["reason"] == "preferences" and p["assetId"] == "newsletter"
    assert p["commandEventId"] == flow.commands["news2"]
    sent = {_props(e)["commandEventId"] for e in flow.events if e["eventAction"] == "email_sent"}
    assert sent == {flow.commands["news1"], flow.commands["welcome1"], flow.commands["welcome2"]}
