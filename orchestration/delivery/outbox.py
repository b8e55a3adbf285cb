"""The outbox: one row per send, keyed by a send id, in SQLite (`data/outbox.sqlite`, WAL,
synchronous full) so that a replayed command, a re-run pass or two dispatchers send once.

A send id is a hash of (the command's eventId, the channel, the recipient address or device
token): planning a send twice inserts nothing the second time. States: `pending` -> `sending`
-> `sent` | `skipped` | `failed`. `claim()` takes due rows under `BEGIN IMMEDIATE` (one writer at
a time across processes) and gives each a lease; a dispatcher killed mid-send leaves its rows
`sending` with a lease that expires, and the next claim takes them again with the same send id
(so the same Message-ID / Idempotency-Key): a crash re-sends at most once.

The database also keeps the dispatcher's cursor (the commands already planned), the addresses
suppressed by hard bounces, and the device tokens providers said are gone.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mallard import jsontext
from orchestration.delivery.journeys import SCHEMA as JOURNEY_SCHEMA

T = TypeVar("T")

PENDING, SENDING, SENT, SKIPPED, FAILED = "pending", "sending", "sent", "skipped", "failed"
FINAL = (SENT, SKIPPED, FAILED)
LEASE_S = 60.0

SCHEMA = """
create table if not exists sends (
    send_id text primary key,
    command_event_id text not null,
    account_id text not null,
    channel text not null,
    recipient text not null,
    asset_id text not null,
    status text not null,
    reason text,
    attempts integer not null default 0,
    next_attempt_at real not null default 0,
    lease_until real not null default 0,
    last_error text,
    provider_answer text,
    payload text not null,
    created_at real not null,
    updated_at real not null,
    recorded integer not null default 0
);
create index if not exists sends_due on sends (status, next_attempt_at);
create index if not exists sends_command on sends (command_event_id);
create table if not exists planned (
    command_event_id text primary key,
    planned_at real not null
);
create table if not exists suppressed_addresses (
    account_id text not null,
    channel text not null,
    address text not null,
    reason text not null,
    since real not null,
    primary key (account_id, channel, address)
);
create table if not exists disabled_tokens (
    account_id text not null,
    token text not null,
    since real not null,
    primary key (account_id, token)
);
"""


def insert_sends(
    conn: sqlite3.Connection, command_event_id: str, sends: list[dict[str, Any]], now: float
) -> int:
    """Insert sends (dicts of the sends columns) of a command; a send id already there stays
    as it is. The rows inserted."""
    return insert_sends_many(conn, [(command_event_id, s) for s in sends], now)


def insert_sends_many(
    conn: sqlite3.Connection, sends: list[tuple[str, dict[str, Any]]], now: float
) -> int:
    """`insert_sends` for the sends of several commands ((command eventId, send) each), in one
    statement."""
    return insert_send_rows(conn, send_rows(sends, now))


def send_rows(sends: list[tuple[str, dict[str, Any]]], now: float) -> list[tuple[Any, ...]]:
    """The sends' rows as `insert_send_rows` takes them: made before a write transaction, so
    that encoding the payloads does not hold the outbox's write lock."""
    return [
        (
            s["send_id"],
            command_event_id,
            s["account_id"],
            s["channel"],
            s["recipient"],
            s["asset_id"],
            s.get("status", PENDING),
            s.get("reason"),
            jsontext.dumps(s.get("payload", {})),
            now,
            now,
        )
        for command_event_id, s in sends
    ]


def insert_send_rows(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
    """Inserts `send_rows`; a send id already there stays as it is. The rows inserted."""
    before = conn.total_changes
    conn.executemany(
        "insert or ignore into sends (send_id, command_event_id, account_id, channel,"
        " recipient, asset_id, status, reason, payload, created_at, updated_at)"
        " values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    return conn.total_changes - before


def send_id(command_event_id: str, channel: str, recipient: str) -> str:
    """The send's key: the same command, channel and recipient always give the same id."""
    return hashlib.sha256(f"{command_event_id}\x1f{channel}\x1f{recipient}".encode()).hexdigest()[
        :32
    ]


@dataclass(frozen=True)
class Send:
    send_id: str
    command_event_id: str
    account_id: str
    channel: str
    recipient: str
    asset_id: str
    status: str
    reason: str | None
    attempts: int
    last_error: str | None
    payload: dict[str, Any]
    updated_at: float


_COLUMNS = (
    "send_id, command_event_id, account_id, channel, recipient, asset_id, status, reason,"
    " attempts, last_error, payload, updated_at"
)


def _send(row: tuple[Any, ...]) -> Send:
    return Send(*row[:10], jsontext.loads(row[10]), row[11])  # type: ignore[arg-type, call-arg]


class Outbox:
    def __init__(self, path: Path, lease_s: float = LEASE_S) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lease_s = lease_s
        self._suppressed: dict[tuple[str, str], set[str]] = {}  # see is_suppressed
        self._conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        self._conn.execute("pragma journal_mode=wal")
        self._conn.execute("pragma synchronous=full")
        # A move of 10,000 journey instances writes ~25 MiB of pages (the outbox grows by 254 MB
        # for 100,000); the cache holds them to the commit instead of SQLite's default 2 MiB.
        self._conn.execute("pragma cache_size=-65536")
        self._conn.executescript(SCHEMA + JOURNEY_SCHEMA)
        os.chmod(path, 0o600)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("begin immediate")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("rollback")
            raise
        self._conn.execute("commit")

    # --- planning -----------------------------------------------------------------------------

    def is_planned(self, command_event_id: str) -> bool:
        row = self._conn.execute(
            "select 1 from planned where command_event_id = ?", (command_event_id,)
        ).fetchone()
        return row is not None

    def planned_among(self, command_event_ids: list[str]) -> set[str]:
        out: set[str] = set()
        for i in range(0, len(command_event_ids), 500):
            chunk = command_event_ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            out.update(
                r[0]
                for r in self._conn.execute(
                    f"select command_event_id from planned where command_event_id in ({marks})",
                    chunk,
                )
            )
        return out

    def plan(self, command_event_id: str, sends: list[dict[str, Any]]) -> int:
        """Insert a command's sends (each a dict of the sends columns) and mark the command
        planned, in one transaction; a send already there stays as it is. Returns the rows
        inserted."""
        return self.plan_many([(command_event_id, sends)])

    def plan_many(
        self,
        commands: list[tuple[str, list[dict[str, Any]]]],
        also: Callable[[sqlite3.Connection], object] | None = None,
    ) -> int:
        """`plan` for several commands in one transaction: each command's sends go in with
        its mark, a command already planned (by another dispatcher) is left as it is. `also`
        runs in the same transaction (the journeys' entries), with the ids newly planned."""
        now = time.time()
        inserted = 0
        with self._tx() as conn:
            for command_event_id, sends in commands:
                if conn.execute(
                    "select 1 from planned where command_event_id = ?", (command_event_id,)
                ).fetchone():
                    continue
                inserted += insert_sends(conn, command_event_id, sends, now)
                conn.execute(
                    "insert into planned (command_event_id, planned_at) values (?, ?)",
                    (command_event_id, now),
                )
            if also is not None:
                also(conn)
        return inserted

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """`query` on the outbox's connection outside a write transaction."""
        return query(self._conn)

    def next_attempt_at(self) -> float | None:
        """When the earliest pending send is due (a retry's backoff), None with none."""
        row = self._conn.execute(
            "select min(next_attempt_at) from sends where status = 'pending'"
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE) on the outbox's database, for the state
        kept beside it (journeys), so a step's move and its sends commit together."""
        return self._tx()

    # --- sending ------------------------------------------------------------------------------

    def claim(self, limit: int = 100, now: float | None = None) -> list[Send]:
        """Due sends, taken atomically: pending ones whose next attempt is due, and `sending`
        ones whose lease expired (a dispatcher died mid-send). Each gets a lease and one more
        attempt."""
        now = time.time() if now is None else now
        with self._tx() as conn:
            rows = conn.execute(
                f"select {_COLUMNS} from sends"
                " where (status = ? and next_attempt_at <= ?) or (status = ? and lease_until < ?)"
                " order by created_at limit ?",
                (PENDING, now, SENDING, now, limit),
            ).fetchall()
            for r in rows:
                conn.execute(
                    "update sends set status = ?, lease_until = ?, attempts = attempts + 1,"
                    " updated_at = ? where send_id = ?",
                    (SENDING, now + self.lease_s, now, r[0]),
                )
        return [
            Send(*r[:6], SENDING, r[7], r[8] + 1, r[9], jsontext.loads(r[10]), now)  # type: ignore[arg-type, call-arg]
            for r in rows
        ]

    def mark(
        self,
        send_id_: str,
        status: str,
        *,
        reason: str | None = None,
        answer: str | None = None,
        error: str | None = None,
    ) -> None:
        """A final state (sent, skipped, failed)."""
        with self._tx() as conn:
            conn.execute(
                "update sends set status = ?, reason = ?, provider_answer = ?,"
                " last_error = coalesce(?, last_error), lease_until = 0, updated_at = ?"
                " where send_id = ?",
                (status, reason, answer, error, time.time(), send_id_),
            )

    def retry_later(self, send_id_: str, error: str, delay_s: float) -> None:
        with self._tx() as conn:
            now = time.time()
            conn.execute(
                "update sends set status = ?, last_error = ?, next_attempt_at = ?,"
                " lease_until = 0, updated_at = ? where send_id = ?",
                (PENDING, error, now + delay_s, now, send_id_),
            )

    # --- outcome events -----------------------------------------------------------------------

    def unrecorded(self) -> list[Send]:
        """Final sends whose outcome event is not yet written."""
        rows = self._conn.execute(
            f"select {_COLUMNS} from sends where recorded = 0 and status in (?, ?, ?)", FINAL
        ).fetchall()
        return [_send(r) for r in rows]

    def mark_recorded(self, send_ids: list[str]) -> None:
        with self._tx() as conn:
            conn.executemany(
                "update sends set recorded = 1 where send_id = ?", [(s,) for s in send_ids]
            )

    # --- reads --------------------------------------------------------------------------------

    def get(self, send_id_: str) -> Send | None:
        row = self._conn.execute(
            f"select {_COLUMNS} from sends where send_id = ?", (send_id_,)
        ).fetchone()
        return None if row is None else _send(row)

    def sends_of(self, command_event_id: str) -> list[Send]:
        rows = self._conn.execute(
            f"select {_COLUMNS} from sends where command_event_id = ? order by send_id",
            (command_event_id,),
        ).fetchall()
        return [_send(r) for r in rows]

    # --- suppression --------------------------------------------------------------------------

    def suppress(self, account_id: str, channel: str, address: str, reason: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "insert or ignore into suppressed_addresses values (?, ?, ?, ?, ?)",
                (account_id, channel, address.lower(), reason, time.time()),
            )
        if (account_id, channel) in self._suppressed:
            self._suppressed[(account_id, channel)].add(address.lower())

    def is_suppressed(self, account_id: str, channel: str, address: str) -> bool:
        """Whether a bounce suppressed the address: the account's suppressed addresses of the
        channel are read once per Outbox (planning asks for every send) and follow this
        Outbox's own suppressions."""
        key = (account_id, channel)
        if key not in self._suppressed:
            self._suppressed[key] = {
                r[0]
                for r in self._conn.execute(
                    "select address from suppressed_addresses where account_id = ? and channel = ?",
                    key,
                )
            }
        return address.lower() in self._suppressed[key]

    def disable_token(self, account_id: str, token: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "insert or ignore into disabled_tokens values (?, ?, ?)",
                (account_id, token, time.time()),
            )

    def disabled_tokens(self, account_id: str) -> set[str]:
        return {
            r[0]
            for r in self._conn.execute(
                "select token from disabled_tokens where account_id = ?", (account_id,)
            )
        }

    def mark_many(self, marks: list[tuple[str, str, str | None, str | None, str | None]]) -> None:
        """Final states of several sends in one transaction: (send_id, status, reason,
        answer, error) each, as `mark` sets one."""
        now = time.time()
        with self._tx() as conn:
            conn.executemany(
                "update sends set status = ?, reason = ?, provider_answer = ?,"
                " last_error = coalesce(?, last_error), lease_until = 0, updated_at = ?"
                " where send_id = ?",
                [
                    (status, reason, answer, error, now, sid)
                    for sid, status, reason, answer, error in marks
                ],
            )
