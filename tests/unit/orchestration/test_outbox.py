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


def _wal_frames(outbox: Outbox) -> tuple[int, int]:
    """(frames in the WAL, frames of it checkpointed): a passive checkpoint of nothing new
    reports what is there."""
    conn = outbox._conn  # the outbox's own connection: its pragmas are what is tested
    _, log, done = conn.execute("pragma wal_checkpoint(passive)").fetchone()
    return log, done


def test_deferred_checkpoints_leave_the_wal_to_one_checkpoint_at_the_end(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "o.sqlite")
    big = {"clientId": "c", "brandId": "b", "content": {"html": "x" * 3000}}
    rows = [_row(send_id(f"e{i}", "email", "x")) | {"payload": big} for i in range(3000)]
    conn = outbox._conn
    with outbox.deferred_checkpoints():
        assert conn.execute("pragma wal_autocheckpoint").fetchone()[0] == 0
        for i in range(0, len(rows), 500):  # six commits, past SQLite's 1,000-page checkpoint
            outbox.plan(f"cmd{i}", rows[i : i + 500])
        wal = (tmp_path / "o.sqlite-wal").stat().st_size
        assert wal > 9_000_000, wal  # ~3,000 pages of payloads: nothing copied back meanwhile
    assert conn.execute("pragma wal_autocheckpoint").fetchone()[0] == 1000
    log, done = _wal_frames(outbox)
    assert log == done > 2000  # the one checkpoint at the end copied every frame
    outbox.close()
