"""The local mailbox's part of a Delete: a message that names the subject, in its headers or in a
body whatever its transfer encoding, is removed whole; the others and a message being written
stay."""

from __future__ import annotations

import base64
from pathlib import Path

from mallard.mailbox import purge_subject, readable, store_message
from orchestration.regulations.verify import token_pattern

EMAIL = "subj-7f3a@example.test"
USER = "subj-7f3a"


def _message(to: str, body: bytes, encoding: str = "7bit") -> bytes:
    return (
        f"From: Shop <shop@example.com>\r\nTo: {to}\r\nSubject: Hello\r\n"
        f"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    ).encode() + body


PLAIN = _message(EMAIL, b"Hi there\r\n")
# About the subject, to someone else: the address only in an encoded body.
BASE64 = _message(
    "support@example.test",
    base64.encodebytes(f"Zoë asked us to forget {EMAIL}.\n".encode()),
    "base64",
)
# A soft line break (`=` at the end of a line) splits the address in the stored bytes.
QUOTED = _message(
    "support@example.test",
    b"Zo=C3=AB wrote from subj-7f3a@exa=\r\nmple.test today\r\n",
    "quoted-printable",
)
# Another customer, whose userId starts like the subject's: not theirs.
OTHER = _message(
    "subj-7f3a1@example.test", base64.encodebytes(b"Hi subj-7f3a1, welcome\n"), "base64"
)


def test_a_body_encoding_hides_the_address_from_the_bytes_not_from_the_decoded_text() -> None:
    for raw in (BASE64, QUOTED):
        assert EMAIL.encode() not in raw
        assert EMAIL.encode() in readable(raw)
    assert "Zoë".encode() in readable(QUOTED)


def test_a_purge_removes_every_message_naming_the_subject_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    box = tmp_path / "mailbox"
    named = [store_message(box, raw) for raw in (PLAIN, BASE64, QUOTED)]
    kept = store_message(box, OTHER)
    # A message being written: renamed into place whole later, so a purge leaves it alone.
    writing = box / f".{kept.name[:-4]}9.eml.tmp"
    writing.write_bytes(PLAIN)

    assert purge_subject(box, token_pattern([USER, EMAIL])) == 3

    assert not any(p.exists() for p in named)
    assert kept.read_bytes() == OTHER
    assert writing.exists()
    assert purge_subject(box, token_pattern([USER, EMAIL])) == 0


def test_a_purge_of_a_mailbox_never_started_removes_nothing(tmp_path: Path) -> None:
    assert purge_subject(tmp_path / "mailbox", token_pattern([EMAIL])) == 0


def test_an_undecodable_message_is_searched_in_its_bytes(tmp_path: Path) -> None:
    box = tmp_path / "mailbox"
    broken = _message(EMAIL, b"\xff\xfe not base64 at all ===", "base64").replace(
        b"charset=utf-8", b"charset=no-such-charset"
    )
    store_message(box, broken)
    assert purge_subject(box, token_pattern([EMAIL])) == 1
