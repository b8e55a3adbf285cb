"""The outbox: a command planned once, claims exclusive, an expired lease re-sent with the same
send id."""

from __future__ import annotations

from pathlib import Path

from orchestration.delivery.outbox import PENDING, SENT, Outbox, send_id


def _row(sid: str) -> dict[str, object]:
    return {
        "send_id": sid,
        "account_id": "a1",
        "channel": "email",
        "recipient": "x@example.com",
        "asset_id": "welcome",
        "status": PENDING,
        "payload": {"clientId": "c", "brandId": "b"},
    }


def test_send_id_is_stable_per_command_channel_recipient() -> None:
    assert send_id("e1", "email", "x@example.com") == send_id("e1", "email", "x@example.com")
    assert send_id("e1", "email", "x@example.com") != send_id("e1", "push", "x@example.com")


def test_plan_once_and_claim_once(tmp_path: Path) -> None:
    sid = send_id("e1", "email", "x@example.com")
    one, two = Outbox(tmp_path / "o.sqlite"), Outbox(tmp_path / "o.sqlite")
    assert one.plan("e1", [_row(sid)]) == 1
    assert two.plan("e1", [_row(sid)]) == 0  # planned already
    first = one.claim(now=1000.0)
    assert [s.send_id for s in first] == [sid]
    assert two.claim(now=1001.0) == []  # leased to the first
    one.mark(sid, SENT, answer="250 OK")
    assert two.claim(now=10_000.0) == []


def test_an_expired_lease_is_claimed_again_with_the_same_send_id(tmp_path: Path) -> None:
    sid = send_id("e2", "email", "x@example.com")
    box = Outbox(tmp_path / "o.sqlite", lease_s=60)
    box.plan("e2", [_row(sid)])
    assert [s.send_id for s in box.claim(now=1000.0)] == [sid]
    # The dispatcher died mid-send: the row stays `sending` until its lease ends.
    assert box.claim(now=1059.0) == []
    again = box.claim(now=1061.0)
    assert [(s.send_id, s.attempts) for s in again] == [(sid, 2)]
