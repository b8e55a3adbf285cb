"""Commands to delivery on real processes: a server, `mallard pipeline run` and a loopback
SMTP sink (aiosmtpd). Each test counts the messages at the sink."""

from __future__ import annotations

import email
import email.policy
import sqlite3
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.conftest import Server, free_port, wait_landed


class Sink:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(msg)  # type: ignore[arg-type]
        return "250 OK"


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Sink, int]]:
    handler = Sink()
    port = free_port()
    # `mallard pipeline run` (the dispatcher) inherits this process's environment.
    monkeypatch.setenv("MALLARD_SMTP_URL", f"smtp://127.0.0.1:{port}")
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    yield handler, port
    controller.stop()


def _server(server_factory: Any, port: int) -> Server:
    srv: Server = server_factory()
    return srv


def _post(server: Server, action: str, body: dict[str, Any]) -> str:
    r = server.post(action, body)
    assert r.status_code == 200, r.text
    return str(r.json()["eventId"])


def _outbox(server: Server) -> list[tuple[str, str, str | None]]:
    with sqlite3.connect(server.data_dir / "outbox.sqlite") as conn:
        return conn.execute(
            "select channel, status, reason from sends order by created_at"
        ).fetchall()


def test_send_email_once_per_command_and_pass(server_factory: Any, sink: Any) -> None:
    handler, port = sink
    server = _server(server_factory, port)
    ids = [
        _post(
            server,
            "identify",
            {
                "userId": "u1",
                "event": "identify",
                "traits": {"email": "ann@example.com", "firstName": "Ann"},
            },
        )
    ]
    command = {"userId": "u1", "event": "SEND_EMAIL", "assetId": "welcome", "messageId": "m-1"}
    ids.append(_post(server, "track", command))
    ids.append(_post(server, "track", command))  # replayed: the same messageId
    wait_landed(server.data_dir, ids)
    out = server.pipeline()
    assert "dispatch" in out.stdout, out.stdout + out.stderr
    assert len(handler.messages) == 1
    msg = handler.messages[0]
    assert msg["To"] == "ann@example.com"
    assert msg["Message-ID"].endswith("@mallard>")
    body = msg.get_body(preferencelist=("plain",))
    assert body is not None and "Hi Ann" in body.get_content()
    assert "List-Unsubscribe" not in msg  # transactional

    server.pipeline()  # the pass again: nothing more is sent
    assert len(handler.messages) == 1
    assert _outbox(server) == [("email", "sent", None)]

    # The outcome event lands and the next pass loads it.
    server.pipeline()
    events = server.get("events/", params={"sort": "asc"}).json()["data"]
    sent = [e for e in events if e["eventAction"] == "email_sent"]
    assert len(sent) == 1
    props = sent[0]["rawData"]["properties"]
    assert props["assetId"] == "welcome" and props["commandEventId"] == ids[1]
    assert sent[0]["userId"] == "u1"


def test_guards_not_identified_and_preferences(server_factory: Any, sink: Any) -> None:
    handler, port = sink
    server = _server(server_factory, port)
    ids = [
        _post(
            server,
            "identify",
            {
                "userId": "u2",
                "event": "identify",
                "traits": {"email": "bo@example.com"},
            },
        ),
        _post(
            server,
            "track",
            {"anonymousId": "visitor-1", "event": "send_email", "assetId": "welcome"},
        ),
        _post(server, "track", {"userId": "u2", "event": "send_email", "assetId": "newsletter"}),
        _post(server, "track", {"userId": "u2", "event": "send_email", "assetId": "welcome"}),
    ]
    wait_landed(server.data_dir, ids)
    server.pipeline()
    # Transactional goes out; marketing without an email opt-in is skipped.
    assert len(handler.messages) == 1
    assert sorted(_outbox(server)) == [
        ("email", "failed", "customer_not_identified"),
        ("email", "sent", None),
        ("email", "skipped", "preferences"),
    ]
    server.pipeline()
    events = server.get("events/", params={"sort": "asc"}).json()["data"]
    actions = sorted(e["eventAction"] for e in events if e["eventAction"].startswith("email_"))
    assert actions == ["email_failed", "email_sent", "email_skipped"]
