"""What the whole-system test did and what the product answered: the oracle the invariants are
checked against (tests/system/invariants.py). Every role records here, from its own thread.

A message is keyed by its messageId, unique in the run: each try of it (a client retry sends the
same messageId again) is an Attempt with the answer it got. Acknowledged means an answer of 200
with an eventId; a regulation's drop is answered the same way (collector/admission.py), and only
the product's record of dropped eventIds (facts.read_dropped) tells it apart; a try with no
answer (the server was killed, a transport error) may or may not have been stored.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Attempt:
    t0: float  # wall time the request was sent
    t1: float  # wall time the answer (or the error) came
    status: int | None  # HTTP status; None: no answer
    event_id: str | None = None


@dataclass
class Sent:
    """One message (a call, or one item of a batch) and every try of it."""

    message_id: str
    user_id: str  # the persona it is about (also for anonymous-only tag calls)
    kind: str  # identify, track, page, screen, send_email, start_journey
    route: str  # api, batch, tag, mobile, segment
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def event_ids(self) -> list[str]:
        """The eventIds of the tries answered 200 with an eventId."""
        return [a.event_id for a in self.attempts if a.status == 200 and a.event_id]

    def kept_ids(self, dropped: set[str]) -> list[str]:
        """The eventIds of the tries acknowledged and not dropped by a regulation."""
        return [e for e in self.event_ids if e not in dropped]

    @property
    def unanswered(self) -> bool:
        """A try with no answer, or a 5xx: it may have been stored without an ack."""
        return any(a.status is None or a.status >= 500 for a in self.attempts)


@dataclass
class Filing:
    regulation_type: str
    user_ids: list[str]
    t0: float
    t1: float
    status: int | None
    regulation_id: str | None = None
    answer: str = ""


@dataclass
class Kill:
    victim: str  # server, pipeline-watch, dagster-daemon, regulation-run
    pid: int | None
    at: float
    restarted_at: float | None = None
    detail: str = ""


@dataclass
class Run:
    """A command the schedule ran (`mallard import customers`, a compaction, a pass by hand)."""

    role: str
    what: str
    t0: float
    t1: float
    returncode: int | None
    output: str = ""
    rows: list[tuple[str, str]] = field(default_factory=list)  # import: (userId, marker)


@dataclass
class Snapshot:
    """marts.events as a reader saw it at one moment of the run."""

    at: float
    rows: int
    extra_event_ids: int  # rows beyond one per eventId
    extra_message_ids: int  # rows beyond one per (account, messageId)
    error: str = ""


@dataclass
class Preference:
    user_id: str
    body: dict[str, Any]
    t0: float
    t1: float
    status: int | None


class Oracle:
    """Thread-safe record of the run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.lock = threading.Lock()
        self.sent: dict[str, Sent] = {}
        self.filings: list[Filing] = []
        self.kills: list[Kill] = []
        self.runs: list[Run] = []
        self.preferences: list[Preference] = []
        self.snapshots: list[Snapshot] = []
        self.anomalies: list[str] = []  # answers no role expected: shown, not failures
        self.problems: list[str] = []  # a role that crashed or never ended: a failure
        self.started = time.time()
        self.ended: float | None = None

    def message(self, message_id: str, user_id: str, kind: str, route: str) -> Sent:
        with self.lock:
            sent = self.sent.get(message_id)
            if sent is None:
                sent = self.sent[message_id] = Sent(message_id, user_id, kind, route)
            return sent

    def attempt(self, sent: Sent, attempt: Attempt) -> None:
        with self.lock:
            sent.attempts.append(attempt)

    def filing(self, filing: Filing) -> None:
        with self.lock:
            self.filings.append(filing)

    def kill(self, kill: Kill) -> None:
        with self.lock:
            self.kills.append(kill)

    def run(self, run: Run) -> None:
        with self.lock:
            self.runs.append(run)

    def preference(self, pref: Preference) -> None:
        with self.lock:
            self.preferences.append(pref)

    def snapshot(self, snap: Snapshot) -> None:
        with self.lock:
            self.snapshots.append(snap)

    def anomaly(self, what: str) -> None:
        with self.lock:
            self.anomalies.append(f"{time.time() - self.started:7.1f}s {what}")

    def problem(self, what: str) -> None:
        with self.lock:
            self.problems.append(f"{time.time() - self.started:7.1f}s {what}")

    # --- what the checks ask ------------------------------------------------------------------

    def acked_event_ids(self) -> list[str]:
        with self.lock:
            return [e for s in self.sent.values() for e in s.event_ids]

    def deleted_users(self) -> set[str]:
        """The personas a SUPPRESS_WITH_DELETE was filed for (answered or not: a filing whose
        answer was lost may have been stored)."""
        return {
            u
            for f in self.filings
            if f.regulation_type == "SUPPRESS_WITH_DELETE" and f.status in (200, None)
            for u in f.user_ids
        }

    def regulated_users(self) -> set[str]:
        """The personas any regulation but ACCESS was filed for."""
        return {u for f in self.filings if f.regulation_type != "ACCESS" for u in f.user_ids}

    def last_recovery(self) -> float:
        """When the last killed process was back (the start of the run when none was)."""
        times = [k.restarted_at or k.at for k in self.kills]
        return max(times, default=self.started)

    def dump(self, path: Path) -> None:
        """The whole record as JSON, for a failure's post-mortem."""
        with self.lock:
            doc = {
                "seed": self.seed,
                "started": self.started,
                "ended": self.ended,
                "sent": [asdict(s) for s in self.sent.values()],
                "filings": [asdict(f) for f in self.filings],
                "kills": [asdict(k) for k in self.kills],
                "runs": [asdict(r) for r in self.runs],
                "preferences": [asdict(p) for p in self.preferences],
                "snapshots": [asdict(s) for s in self.snapshots],
                "anomalies": self.anomalies,
                "problems": self.problems,
            }
        path.write_text(json.dumps(doc, indent=1))
