"""The journeys' clock: real time, or a time a test or an operator sets.

`MALLARD_NOW` holds an ISO-8601 time (`2026-12-01T09:00:00Z`) or `file:<path>` naming a file
that holds one, read at every look, so a long-lived process (the pipeline watcher) follows a
clock a test moves. Waits and timeouts are due by this clock; what happened when (events'
receivedAt) stays real time.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

ENV = "MALLARD_NOW"


def parse(text: str) -> float:
    t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def now() -> float:
    """Seconds since the epoch by the journeys' clock."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return time.time()
    if value.startswith("file:"):
        return parse(Path(value[5:]).read_text())
    return parse(value)


def iso(ts: float) -> str:
    # isoformat is C code, several times faster than strftime; the same text.
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")[:-6] + "Z"
