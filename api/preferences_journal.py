"""The read-your-writes journal of the preferences API: per-key changes this server accepted,
kept until the warehouse snapshot a reader uses has them (why this is consistent with the
model's rule: api/preferences.py)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from api.preferences import Change, parse_time
from collector.messages import iso


class PreferencesJournal:
    """Changes this server accepted, until the warehouse snapshot a reader uses has them."""

    SCHEMA = """
    create table if not exists changes (
        event_id text not null,
        customer_id text not null,
        kind text not null,
        key text not null,
        value integer not null,
        event_time text not null,
        received_at text not null,
        message_id text not null,
        added_at real not null,
        loaded_version integer,  -- first warehouse snapshot that had the message
        primary key (event_id, kind, key)
    );
    create index if not exists changes_customer on changes (customer_id);
    """
    KEEP_LOADED_S = 3600.0  # readers on an older snapshot may still need a loaded change

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._conn().executescript(self.SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("pragma journal_mode=wal")
            self._local.conn = conn
        return conn

    def add(self, customer_id: str, event_id: str, changes: list[Change]) -> None:
        now = time.time()
        with self._conn() as conn:
            conn.executemany(
                "insert or ignore into changes values (?, ?, ?, ?, ?, ?, ?, ?, ?, null)",
                [
                    (
                        event_id,
                        customer_id,
                        c.kind,
                        c.key,
                        int(c.value),
                        iso(c.event_time),
                        iso(c.received_at),
                        c.message_id,
                        now,
                    )
                    for c in changes
                ],
            )

    def pending(self, customer_id: str, version: int) -> dict[str, list[Change]]:
        """Changes of the customer not in snapshot `version`, by eventId."""
        rows = (
            self._conn()
            .execute(
                "select event_id, kind, key, value, event_time, received_at, message_id"
                " from changes where customer_id = ?"
                " and (loaded_version is null or loaded_version > ?)",
                (customer_id, version),
            )
            .fetchall()
        )
        out: dict[str, list[Change]] = {}
        for e, k, key, v, t, r, m in rows:
            out.setdefault(e, []).append(Change(k, key, bool(v), parse_time(t), parse_time(r), m))
        return out

    def mark_loaded(self, event_ids: list[str], version: int) -> None:
        with self._conn() as conn:
            conn.executemany(
                "update changes set loaded_version = ? where event_id = ?"
                " and (loaded_version is null or loaded_version > ?)",
                [(version, e, version) for e in event_ids],
            )
            conn.execute(
                "delete from changes where loaded_version is not null and added_at < ?",
                (time.time() - self.KEEP_LOADED_S,),
            )
