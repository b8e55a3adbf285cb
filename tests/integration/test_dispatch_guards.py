"""Every guard of a send on real processes, each seen through `GET events/{eventId}/status`
and the events API: a server with preference categories, `mallard pipeline run` as the
dispatcher, a loopback SMTP sink that refuses one address (550), and Debian Chromium on the
hosted preferences page a received newsletter links to.

- no email trait: `skipped: no_address`, nothing at the sink;
- opted in to email but out of the newsletter's category: the newsletter `skipped:
  preferences`, a transactional welcome still sent;
- unsubscribed from everything on the hosted page (reached from a received newsletter's
  link): the next newsletter skipped, a welcome still sent;
- an address the server refused: `email_bounced`, and the next send to it `skipped:
  suppressed` without asking the server again;
- a command already landed when a Suppress regulation is filed: nothing sent, no outcome.
"""

from __future__ import annotations

import email
import email.policy
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from playwright.sync_api import expect

from orchestration.delivery.dispatch import BACKOFF_S
from tests.browser import chromium
from tests.conftest import free_port, wait_landed
from tests.integration.prefs_support import PrefsEnv, start_prefs_env

pytestmark = pytest.mark.integration

REFUSED = "gone@example.com"
BUSY = "busy@example.com"  # answered 451 (try later) the first time


class Sink:
    """Keeps what arrives; refuses REFUSED at RCPT as a mail server does an unknown user, and
    greylists BUSY once."""

    def __init__(self) -> None:
        self.rcpt_attempts: list[str] = []
        self.busy_times: list[float] = []  # when BUSY was tried (time.monotonic)
        self.raw: list[bytes] = []

    async def handle_RCPT(  # noqa: N802
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        self.rcpt_attempts.append(address)
        if address == BUSY:
            self.busy_times.append(time.monotonic())
        if address == REFUSED:
            return "550 5.1.1 user unknown"
        if address == BUSY and self.rcpt_attempts.count(BUSY) == 1:
            return "451 4.7.1 greylisted, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

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

    def to(self, address: str) -> list[EmailMessage]:
        return [m for m in self.messages() if m["To"] == address]


@dataclass
class Guards:
    env: PrefsEnv
    sink: Sink
    commands: dict[str, str] = field(default_factory=dict)  # name -> eventId
    first_round: int = 0  # messages at the sink after the first dispatch, but busy's
    busy_first: dict[str, Any] = field(default_factory=dict)  # busy's status after it
    events: list[dict[str, Any]] = field(default_factory=list)

    def command(self, name: str, user: str, asset: str) -> None:
        r = self.env.server.post("track", {"userId": user, "event": "send_email", "assetId": asset})
        assert r.status_code == 200, r.text
        self.commands[name] = str(r.json()["eventId"])

    def status(self, name: str) -> dict[str, Any]:
        r = self.env.server.get(f"events/{self.commands[name]}/status")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def sends(self, name: str) -> list[tuple[str, str | None]]:
        return [(s["status"], s["reason"]) for s in self.status(name)["sends"]]

    def outcomes(self, name: str) -> list[dict[str, Any]]:
        """The outcome events (email_*) whose command is `name`."""
        return [
            e
            for e in self.events
            if e["eventAction"].startswith("email_")
            and e["rawData"]["properties"].get("commandEventId") == self.commands[name]
        ]


def _pass(env: PrefsEnv) -> None:
    out = env.server.pipeline()
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def guards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guards]:
    sink, smtp_port, port = Sink(), free_port(), free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    users = {
        "noaddr": {"firstName": "Nadia"},
        "cat": {"email": "cat@example.com"},
        "page": {"email": "page@example.com", "firstName": "Paige"},
        "gone": {"email": REFUSED},
        "reg": {"email": "reg@example.com"},
        "busy": {"email": BUSY},
    }
    env_vars = {
        "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}",
        "MALLARD_PUBLIC_URL": f"http://127.0.0.1:{port}",
    }
    try:
        for env in start_prefs_env(
            tmp_path_factory.mktemp("guards"), users, env=env_vars, port=port
        ):
            g = Guards(env, sink)
            for user, categories in (("cat", False), ("page", True)):
                r = env.post(
                    user,
                    {
                        "channels": [{"channel": "email", "subscribed": True}],
                        "categories": [{"category": "weekly_news", "subscribed": categories}],
                    },
                )
                assert r.status_code == 200, r.text
            g.command("noaddr", "noaddr", "welcome")
            g.command("cat_news", "cat", "newsletter")
            g.command("cat_welcome", "cat", "welcome")
            g.command("page_news1", "page", "newsletter")
            g.command("gone1", "gone", "welcome")
            g.command("reg", "reg", "welcome")
            g.command("busy", "busy", "welcome")
            wait_landed(env.server.data_dir, list(g.commands.values()))
            # Filed after the command was accepted and landed, before any dispatch.
            r = env.server.post(
                "regulations",
                {"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": ["reg"]}},
            )
            assert r.status_code == 200, r.text
            _pass(env)
            g.first_round = len([m for m in sink.messages() if m["To"] != BUSY])
            g.busy_first = g.status("busy")

            _unsubscribe_on_the_hosted_page(sink.to("page@example.com"))
            g.command("page_news2", "page", "newsletter")
            g.command("page_welcome", "page", "welcome")
            g.command("gone2", "gone", "welcome")
            wait_landed(env.server.data_dir, [g.commands[n] for n in ("page_news2", "gone2")])
            _pass(env)
            _pass(env)  # the last dispatch's outcome events load
            r = env.server.get("events/", params={"sort": "asc", "size": 100})
            assert r.status_code == 200, r.text
            g.events = r.json()["data"]
            yield g
    finally:
        controller.stop()


def _unsubscribe_on_the_hosted_page(received: list[EmailMessage]) -> None:
    """Follow the received newsletter's preferences link in Chromium and unsubscribe."""
    [news] = [m for m in received if "List-Unsubscribe" in m]
    text = news.get_body(preferencelist=("plain",))
    assert text is not None
    link = re.search(r"Manage your preferences: (\S+)", text.get_content())  # type: ignore[attr-defined]
    assert link, text.get_content()  # type: ignore[attr-defined]
    assert "utm_campaign=newsletter" in link[1]
    with chromium() as browser:
        page = browser.new_page()
        page.goto(link[1])
        expect(page.get_by_label("Email")).to_be_checked()
        page.get_by_role("button", name="Unsubscribe from everything").click()
        expect(page.get_by_role("status")).to_have_text("You are unsubscribed from everything.")
        page.close()


def test_no_address_is_skipped(guards: Guards) -> None:
    assert guards.sends("noaddr") == [("skipped", "no_address")]
    status = guards.status("noaddr")
    assert status["status"] == "processed" and status["errors"] == []
    assert "no address" in status["sends"][0]["error"]
    [outcome] = guards.outcomes("noaddr")
    assert outcome["eventAction"] == "email_skipped"
    assert outcome["rawData"]["properties"]["reason"] == "no_address"
    assert outcome["userId"] == "noaddr"


def test_category_opted_out_skips_marketing_only(guards: Guards) -> None:
    assert guards.sends("cat_news") == [("skipped", "preferences")]
    assert guards.sends("cat_welcome") == [("sent", None)]
    [received] = guards.sink.to("cat@example.com")
    assert "List-Unsubscribe" not in received  # the welcome, transactional
    [skipped] = guards.outcomes("cat_news")
    assert skipped["eventAction"] == "email_skipped"
    assert skipped["rawData"]["properties"]["assetId"] == "newsletter"


def test_unsubscribed_on_the_hosted_page_skips_the_next_newsletter(guards: Guards) -> None:
    assert guards.env.get("page").json()["unsubscribeAll"] is True
    assert guards.sends("page_news1") == [("sent", None)]
    assert guards.sends("page_news2") == [("skipped", "preferences")]
    assert guards.sends("page_welcome") == [("sent", None)]
    received = guards.sink.to("page@example.com")
    assert [("List-Unsubscribe" in m) for m in received] == [True, False]
    assert str(received[1]["Subject"]) == "Welcome, Paige"
    unsub = [e for e in guards.events if e["eventAction"] == "unsubscribed"]
    assert [e["userId"] for e in unsub] == ["page"]
    assert unsub[0]["rawData"]["properties"]["assetId"] == "newsletter"  # utm_campaign


def test_a_bounce_suppresses_the_address(guards: Guards) -> None:
    [bounce] = guards.status("gone1")["sends"]
    assert (bounce["status"], bounce["reason"]) == ("failed", "bounced")
    assert "550" in bounce["error"] and "user unknown" in bounce["error"]
    assert guards.status("gone1")["status"] == "failed"
    assert guards.sends("gone2") == [("skipped", "suppressed")]
    # The server was asked once: the suppressed send never reached it.
    assert guards.sink.rcpt_attempts.count(REFUSED) == 1
    assert guards.sink.to(REFUSED) == []
    assert [e["eventAction"] for e in guards.outcomes("gone1")] == ["email_bounced"]
    [skipped] = guards.outcomes("gone2")
    assert skipped["eventAction"] == "email_skipped"
    assert skipped["rawData"]["properties"]["reason"] == "suppressed"


def test_a_suppressed_customer_gets_nothing(guards: Guards) -> None:
    assert guards.sink.to("reg@example.com") == []
    assert "reg@example.com" not in guards.sink.rcpt_attempts
    assert guards.outcomes("reg") == []
    r = guards.env.server.get(f"events/{guards.commands['reg']}/status")
    # The command was accepted before the regulation: it has no sends, whatever the answer.
    assert r.status_code in (200, 404), r.text
    if r.status_code == 200:
        assert r.json()["sends"] == []
    # The others' sends were not held up: the first dispatch delivered cat's welcome and page's
    # newsletter (busy's was greylisted).
    assert guards.first_round == 2


def test_a_4xx_is_tried_again_later_and_then_sent(guards: Guards) -> None:
    [first] = guards.busy_first["sends"]
    # After the first pass busy's send waits for its retry; or, when that dispatch's sends
    # outlasted the backoff, the same dispatch has tried it again already.
    if first["status"] == "pending":
        assert first["attempts"] == 1, first
        assert "451" in first["error"] and "greylisted" in first["error"]
    else:
        assert (first["status"], first["attempts"]) == ("sent", 2), first
    assert guards.busy_first["status"] == "processed"
    # Tried again once the backoff had passed, and sent, with the same Message-ID.
    first_try, second_try = guards.sink.busy_times
    assert second_try - first_try >= BACKOFF_S[0]
    [then] = guards.status("busy")["sends"]
    assert (then["status"], then["attempts"], then["sendId"]) == ("sent", 2, first["sendId"])
    [received] = guards.sink.to(BUSY)
    assert received["Message-ID"] == f"<{first['sendId']}@mallard>"
    assert guards.sink.rcpt_attempts.count(BUSY) == 2
    assert [e["eventAction"] for e in guards.outcomes("busy")] == ["email_sent"]
