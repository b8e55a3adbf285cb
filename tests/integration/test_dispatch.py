"""Commands to delivery on real processes: a server, `mallard pipeline run` and a loopback
SMTP sink (aiosmtpd). Each test counts the messages at the sink.

The tests share one server, data dir and sink (module fixtures dispatch_server and smtp_sink,
also used by test_event_status.py; a server and its first pass cost a test ~30 s): each sends
as users of its own and counts only the messages, sends and outcome events of its commands."""

from __future__ import annotations

import email
import email.policy
import sqlite3
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.conftest import Server, free_port, init_data_dir, wait_landed


class Sink:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(msg)  # type: ignore[arg-type]
        return "250 OK"


@pytest.fixture(scope="module")
def smtp_sink() -> Iterator[tuple[Sink, int]]:
    handler = Sink()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    yield handler, port
    controller.stop()


@pytest.fixture(scope="module")
def dispatch_server(
    tmp_path_factory: pytest.TempPathFactory, smtp_sink: tuple[Sink, int]
) -> Iterator[Server]:
    """One server for the module; its passes (Server.pipeline, the dispatcher) send to the sink."""
    d = tmp_path_factory.mktemp("dispatch") / "data"
    port = smtp_sink[1]
    env = {"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{port}"}
    srv = Server(d, free_port(), init_data_dir(d), env=env)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def new_messages(handler: Sink, before: int) -> list[EmailMessage]:
    """What reached the sink since a test began (the tests before it sent theirs)."""
    return handler.messages[before:]


def _post(server: Server, action: str, body: dict[str, Any]) -> str:
    r = server.post(action, body)
    assert r.status_code == 200, r.text
    return str(r.json()["eventId"])


def _outbox(server: Server, ids: list[str]) -> list[tuple[str, str, str | None]]:
    """The sends of these commands (by their eventIds)."""
    marks = ",".join("?" * len(ids))
    with sqlite3.connect(server.data_dir / "outbox.sqlite") as conn:
        return conn.execute(
            "select channel, status, reason from sends"
            f" where command_event_id in ({marks}) order by created_at",
            ids,
        ).fetchall()


def _outcomes(server: Server, ids: list[str]) -> list[dict[str, Any]]:
    """The email_* outcome events of these commands (by their eventIds)."""
    r = server.get("events/", params={"sort": "asc", "size": 100})
    assert r.status_code == 200, r.text
    events = r.json()["data"]
    assert len(events) < 100, "more events than a page: page through them"
    return [
        e
        for e in events
        if e["eventAction"].startswith("email_")
        and e["rawData"]["properties"].get("commandEventId") in ids
    ]


def test_send_email_once_per_command_and_pass(
    dispatch_server: Server, smtp_sink: tuple[Sink, int]
) -> None:
    server, (handler, _) = dispatch_server, smtp_sink
    before = len(handler.messages)
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
    assert len(new_messages(handler, before)) == 1
    msg = new_messages(handler, before)[0]
    assert msg["To"] == "ann@example.com"
    assert msg["Message-ID"].endswith("@mallard>")
    body = msg.get_body(preferencelist=("plain",))
    assert body is not None and "Hi Ann" in body.get_content()
    assert "List-Unsubscribe" not in msg  # transactional

    server.pipeline()  # the pass again: nothing more is sent
    assert len(new_messages(handler, before)) == 1
    assert _outbox(server, ids) == [("email", "sent", None)]

    # The outcome event lands and the next pass loads it.
    server.pipeline()
    sent = [e for e in _outcomes(server, ids) if e["eventAction"] == "email_sent"]
    assert len(sent) == 1
    props = sent[0]["rawData"]["properties"]
    assert props["assetId"] == "welcome" and props["commandEventId"] == ids[1]
    assert sent[0]["userId"] == "u1"


def test_guards_not_identified_and_preferences(
    dispatch_server: Server, smtp_sink: tuple[Sink, int]
) -> None:
    server, (handler, _) = dispatch_server, smtp_sink
    before = len(handler.messages)
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
    assert [m["To"] for m in new_messages(handler, before)] == ["bo@example.com"]
    assert sorted(_outbox(server, ids)) == [
        ("email", "failed", "customer_not_identified"),
        ("email", "sent", None),
        ("email", "skipped", "preferences"),
    ]
    server.pipeline()
    actions = sorted(e["eventAction"] for e in _outcomes(server, ids))
    assert actions == ["email_failed", "email_sent", "email_skipped"]
