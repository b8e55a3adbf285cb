"""A Delete's side stores outside the lake: the sends the dispatcher wrote as files for a channel
with no provider, and the local mailbox's messages, each removed whole when it names the
subject; another customer's stay; and what is left the proof does not find."""

from __future__ import annotations

from pathlib import Path

from mallard.mailbox import store_message
from mallard.paths import DataPaths
from orchestration.delivery.dispatch import write_file_outbox
from orchestration.delivery.outbox import Send
from orchestration.regulations.purge import purge_file_outbox, purge_mailbox
from orchestration.regulations.subjects import Subject
from orchestration.regulations.verify import bytes_found

SUBJECT = Subject(
    "demo",
    ["subj-7f3a"],
    customer_ids=["c0ffee01"],
    emails=["subj-7f3a@example.test"],
    subscription_ids=["5ub5c41b"],
)


def _sms(send_id: str, user_id: str, customer_id: str, to: str) -> Send:
    return Send(
        send_id,
        f"cmd-{send_id}",
        "demo",
        "sms",
        to,
        "reminder",
        "sending",
        None,
        1,
        None,
        {"customerId": customer_id, "userId": user_id, "content": {"text": "Your order"}},
        0.0,
    )


def test_the_sends_written_as_files_that_name_the_subject_are_removed(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    write_file_outbox(paths, _sms("s1", "subj-7f3a", "c0ffee01", "+4700000001"))
    write_file_outbox(paths, _sms("s2", "subj-7f3a1", "c0ffee02", "+4700000002"))
    sms = paths.root / "outbox" / "sms"

    assert bytes_found(paths, SUBJECT.strings()) == {"outbox/sms/s1.json": 2}
    assert purge_file_outbox(paths, SUBJECT) == 1

    assert sorted(p.name for p in sms.iterdir()) == ["s2.json"]
    assert bytes_found(paths, SUBJECT.strings()) == {}
    assert purge_file_outbox(paths, SUBJECT) == 0


def test_the_mailbox_is_left_with_nothing_the_proof_finds(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    head = "From: shop@example.com\r\nSubject: Hi\r\nTo: "
    store_message(paths.mailbox_dir, f"{head}subj-7f3a@example.test\r\n\r\nHi\r\n".encode())
    # The subscription id in a link of a quoted-printable body, split by a soft line break.
    link = b"https://shop.example/cdp/marketing-preferences/5ub5=\r\nc41b"
    qp = "Content-Transfer-Encoding: quoted-printable"
    store_message(paths.mailbox_dir, f"{head}support@example.test\r\n{qp}\r\n\r\n".encode() + link)
    kept = store_message(paths.mailbox_dir, f"{head}other@example.test\r\n\r\nHi\r\n".encode())

    assert purge_mailbox(paths, SUBJECT) == 2

    assert list(paths.mailbox_dir.iterdir()) == [kept]
    assert bytes_found(paths, SUBJECT.strings()) == {}
