"""The local mailbox `make run` starts: an SMTP server on loopback (aiosmtpd) that keeps every
message it is given as a `.eml` file under data/mailbox/, so email works with no mail server.

`mallard mailbox serve` runs it; `mallard mailbox list` and `mallard mailbox show` read the
files. Files are written to a temporary name and renamed, so a reader never sees half a
message; their names sort in arrival order.
"""

from __future__ import annotations

import email
import itertools
import os
import signal
import threading
import time
from email import policy
from email.message import EmailMessage
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


def message_files(paths: DataPaths) -> list[Path]:
    """The stored messages, oldest first."""
    if not paths.mailbox_dir.exists():
        return []
    return sorted(paths.mailbox_dir.glob("[0-9]*.eml"))


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
