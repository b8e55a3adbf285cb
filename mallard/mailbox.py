"""The local mailbox `make run` starts: an SMTP server on loopback (aiosmtpd) that keeps every
message it is given as a `.eml` file under data/mailbox/, so email works with no mail server.

`mallard mailbox serve` runs it; `mallard mailbox list` and `mallard mailbox show` read the
files; a Delete removes the messages that name its subject (`purge_subject`). Files are written
to a temporary name and renamed, so a reader (and a purge) never sees half a message; their
names sort in arrival order.
"""

from __future__ import annotations

import email
import itertools
import os
import re
import signal
import threading
import time
from email import policy
from email.message import EmailMessage, Message
from pathlib import Path
from typing import Any

from mallard.paths import DataPaths

_seq = itertools.count()


def store_message(directory: Path, raw: bytes) -> Path:
    """Keep one message: written under a temporary name, then renamed into place."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_seq):06d}.eml"
    tmp = directory / f".{name}.tmp"
    tmp.write_bytes(raw)
    tmp.rename(directory / name)
    return directory / name


class MailboxHandler:
    """aiosmtpd handler: every message accepted is stored as it arrived."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        raw = envelope.original_content or envelope.content
        if isinstance(raw, str):
            raw = raw.encode()
        path = store_message(self.directory, raw)
        return f"250 OK queued as {path.stem}"


def serve(paths: DataPaths, host: str = "127.0.0.1", port: int = 1025) -> int:
    """Run the mailbox until SIGINT or SIGTERM."""
    from aiosmtpd.controller import Controller

    controller = Controller(
        MailboxHandler(paths.mailbox_dir), hostname=host, port=port, enable_SMTPUTF8=True
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    controller.start()
    print(f"mailbox: smtp://{host}:{port}, messages in {paths.mailbox_dir}", flush=True)
    try:
        stop.wait()
    finally:
        controller.stop()
    return 0


def stored(directory: Path) -> list[Path]:
    """The messages stored in a directory, oldest first; not those being written (dot-temp)."""
    if not directory.exists():
        return []
    return sorted(directory.glob("[0-9]*.eml"))


def message_files(paths: DataPaths) -> list[Path]:
    """The stored messages, oldest first."""
    return stored(paths.mailbox_dir)


def readable(raw: bytes) -> bytes:
    """A message as its reader sees it, as UTF-8: every header of every part decoded (RFC 2047
    words, RFC 2231 file names) and every body decoded from its transfer encoding (base64,
    quoted-printable) and its charset. What the stored bytes hide: an address in a base64 body
    is not in them."""
    message = email.message_from_bytes(raw, policy=policy.default)
    out: list[str] = []
    for part in message.walk():
        out += [_decoded_headers(part), _decoded_body(part)]
    # surrogatepass: headers of 8-bit bytes decode with surrogates; those bytes are in `raw`.
    return "\n".join(out).encode("utf-8", "surrogatepass")


# A malformed header or body (anyone may send the mailbox anything) must not stop a Delete: what
# cannot be decoded is searched in the stored bytes only.


def _decoded_headers(part: Message) -> str:
    try:
        lines = [f"{name}: {value}" for name, value in part.items()]
        return "\n".join([*lines, part.get_filename() or ""])
    except Exception:
        return ""


def _decoded_body(part: Message) -> str:
    if part.is_multipart():
        return ""
    try:
        body = part.get_payload(decode=True)
        if not isinstance(body, bytes):
            return ""
        return body.decode(part.get_content_charset() or "utf-8", "replace")
    except Exception:
        return ""


def mentions(raw: bytes, pattern: re.Pattern[bytes]) -> bool:
    """Whether a stored message holds what `pattern` matches, in its bytes or decoded."""
    return bool(pattern.search(raw) or pattern.search(readable(raw)))


def purge_subject(directory: Path, pattern: re.Pattern[bytes]) -> int:
    """Remove every stored message that names the subject (`pattern`: their identifiers, as
    orchestration/regulations/verify.py matches them), the whole file; how many. A message
    being written is a dot-temp file until it is renamed into place whole, so none is read
    half written; one renamed in after the listing is what the Delete's proof then finds."""
    removed = 0
    for path in stored(directory):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:  # removed meanwhile (a purge run again)
            continue
        if mentions(raw, pattern):
            path.unlink(missing_ok=True)
            removed += 1
    if removed:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return removed


def parse(path: Path) -> EmailMessage:
    message = email.message_from_bytes(path.read_bytes(), policy=policy.default)
    assert isinstance(message, EmailMessage)
    return message


def summary(n: int, path: Path) -> dict[str, Any]:
    m = parse(path)
    return {
        "n": n,
        "date": str(m.get("Date", "")),
        "from": str(m.get("From", "")),
        "to": str(m.get("To", "")),
        "subject": str(m.get("Subject", "")),
        "messageId": str(m.get("Message-ID", "")),
        "file": str(path),
    }


def list_messages(paths: DataPaths) -> list[dict[str, Any]]:
    """One summary per message, numbered from 1 in arrival order."""
    return [summary(n, p) for n, p in enumerate(message_files(paths), start=1)]


def find(paths: DataPaths, key: str) -> Path | None:
    """A message by its number in `list` or its Message-ID (with or without the <>)."""
    files = message_files(paths)
    if key.isdigit():
        n = int(key)
        return files[n - 1] if 1 <= n <= len(files) else None
    wanted = key.strip().strip("<>")
    for path in reversed(files):
        if str(parse(path).get("Message-ID", "")).strip().strip("<>") == wanted:
            return path
    return None
