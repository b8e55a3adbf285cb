"""Regulations (privacy requests): the store, the collectors' lists and the tombstones.

One SQLite file in the data dir (`regulations.sqlite`, WAL mode, secure_delete on) holds:

- `regulations`: every request filed, its status and, once it ran, its outcome and evidence.
  Subject userIds are kept in plain text only until a Delete of them finishes; after that only
  their hashes remain (`forget`), so the store itself does not keep a deleted user.
- `subject_lists`: what the collectors drop, per account: `suppress` (every message) and
  `no_track` (track, page and screen, and identify from the tag), as keyed hashes of userIds and
  of the anonymousIds the models tie to them. A collector hashes a message's userId and
  anonymousId the same way and looks them up.
- `tombstones`: keyed hashes of the deleted users' userIds, anonymousIds and messageIds, with
  the time of the delete. The loader drops rows they match, so a rebuild from an old copy of the
  landing files, or a replay of the old messages, cannot bring a deleted user back.
- `dropped_events`: the eventIds of the calls the collectors dropped, per account, with the list
  that dropped them (`suppress`, `no_track`) and when: what the status endpoint answers
  `dropped` from (the sender's own answer is that of any accepted call). Each row holds no
  identifier of the user. The rows of the last DROPPED_KEEP_DAYS days are kept, at most
  DROPPED_MAX_ROWS of them.

Every change of the lists increments the counter in `regulations.generation` before the change
is acknowledged; collectors (`AdmissionLists`) map that file and reload the lists when it moves,
before they admit the next message, and admit nothing while the lists cannot be read.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mallard.generation import Generation
from mallard.ids import new_id
from mallard.paths import DataPaths
from mallard.secret import derived_key

# INTERFACE 2.10, in its order.
TYPES = (
    "SUPPRESS_WITH_DELETE",
    "DELETE",
    "UNSUPPRESS",
    "SUPPRESS",
    "NO_TRACK",
    "TRACK",
    "ACCESS",
)
DELETES = ("SUPPRESS_WITH_DELETE", "DELETE")
SUBJECT_TYPES = ("USER_ID",)
MAX_IDS = 5000
MAX_ID_CHARS = 1024
STATUSES = ("pending", "running", "finished", "failed")
SUPPRESS, NO_TRACK = "suppress", "no_track"
# How long, and how many, dropped eventIds the status endpoint can still answer `dropped` for:
# a sender checks an eventId within minutes; 30 days and ~100 bytes a row keep the store small.
DROPPED_KEEP_DAYS = 30
DROPPED_MAX_ROWS = 1_000_000
# Tombstone kinds.
USER, ANONYMOUS, MESSAGE = "user", "anonymous", "message"
HASH_PURPOSE = "mallard regulations v1"

SCHEMA = """
create table if not exists regulations (
    regulation_id text primary key,
    client_id text not null,
    account_id text not null,
    brand_id text not null,
    regulation_type text not null,
    status text not null,
    created_at real not null,
    started_at real,
    finished_at real,
    subject_ids text not null,      -- JSON list; emptied once a Delete of them finished
    subject_hashes text not null,   -- JSON list, in the order of subject_ids
    identifiers text,               -- JSON, plain, only while a regulation runs
    outcome text,                   -- JSON: per subject (hash) its outcome
    evidence text,                  -- JSON
    download_path text,
    download_expires_at real,
    error text,
    attempts integer not null default 0
);
create index if not exists regulations_by_account
    on regulations (client_id, account_id, created_at);
create table if not exists subject_lists (
    account_id text not null,
    list text not null,
    id_hash text not null,
    user_hash text not null,
    regulation_id text not null,
    since real not null,
    primary key (account_id, list, id_hash, user_hash)
);
create table if not exists tombstones (
    account_id text not null,
    kind text not null,
    id_hash text not null,
    deleted_at real not null,
    regulation_id text not null,
    primary key (account_id, kind, id_hash)
);
create table if not exists dropped_events (
    account_id text not null,
    event_id text not null,
    list text not null,             -- suppress or no_track
    dropped_at real not null,
    primary key (account_id, event_id)
);
create index if not exists dropped_events_by_time on dropped_events (dropped_at);
"""


class RegulationError(ValueError):
    """A request that cannot be filed: `field` names the part of the body at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ListsUnavailable(RuntimeError):
    """The collectors' lists cannot be read: nothing is admitted until they can (fail closed)."""


def identifier_hash(key: str, account_id: str, identifier: str) -> str:
    """The keyed hash of an identifier of an account, hex; identifier_hash_sql is its SQL."""
    return hashlib.sha256(f"{key}:{account_id}:{identifier}".encode()).hexdigest()


def identifier_hash_sql(account_id: str, identifier: str, key: str = "$key") -> str:
    """identifier_hash as a DuckDB expression over SQL expressions (columns, parameters): the
    loader's tombstone filter (orchestration/load.py) and the audiences' regulated members
    (mallard/audiences.py) use it. The key goes in as a query parameter, `$key` by default."""
    return f"sha256({key} || ':' || {account_id} || ':' || {identifier})"


def hash_key(paths: DataPaths) -> str:
    return derived_key(paths, HASH_PURPOSE)


@dataclass
class Regulation:
    regulation_id: str
    client_id: str
    account_id: str
    brand_id: str
    regulation_type: str
    status: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    subject_ids: list[str]
    subject_hashes: list[str]
    identifiers: dict[str, Any] | None
    outcome: dict[str, Any] | None
    evidence: dict[str, Any] | None
    download_path: str | None
    download_expires_at: float | None
    error: str | None
    attempts: int

    @property
    def deletes(self) -> bool:
        return self.regulation_type in DELETES

    @property
    def done(self) -> bool:
        return self.status in ("finished", "failed")


_COLUMNS = (
    "regulation_id, client_id, account_id, brand_id, regulation_type, status, created_at,"
    " started_at, finished_at, subject_ids, subject_hashes, identifiers, outcome, evidence,"
    " download_path, download_expires_at, error, attempts"
)


def _row(r: tuple[Any, ...]) -> Regulation:
    def js(v: str | None) -> Any:
        return None if v is None else json.loads(v)

    return Regulation(
        regulation_id=r[0],
        client_id=r[1],
        account_id=r[2],
        brand_id=r[3],
        regulation_type=r[4],
        status=r[5],
        created_at=r[6],
        started_at=r[7],
        finished_at=r[8],
        subject_ids=json.loads(r[9]),
        subject_hashes=json.loads(r[10]),
        identifiers=js(r[11]),
        outcome=js(r[12]),
        evidence=js(r[13]),
        download_path=r[14],
        download_expires_at=r[15],
        error=r[16],
        attempts=r[17],
    )


def validate(body: Any) -> tuple[str, list[str]]:
    """(regulationType, userIds) of a request body, or RegulationError naming the field."""
    if not isinstance(body, dict):
        raise RegulationError("body", "the body must be a JSON object")
    kind = body.get("regulationType")
    if kind not in TYPES:
        raise RegulationError("regulationType", f"regulationType must be one of {', '.join(TYPES)}")
    subject = body.get("subject")
    if not isinstance(subject, dict):
        raise RegulationError(
            "subject", 'subject must be an object {"type": "USER_ID", "ids": [...]}'
        )
    if subject.get("type") not in SUBJECT_TYPES:
        raise RegulationError("subject.type", "subject.type must be USER_ID")
    ids = subject.get("ids")
    if not isinstance(ids, list) or not ids:
        raise RegulationError("subject.ids", "subject.ids must be a non-empty list of userIds")
    if len(ids) > MAX_IDS:
        raise RegulationError("subject.ids", f"subject.ids takes at most {MAX_IDS} userIds")
    for i, v in enumerate(ids):
        if not isinstance(v, str) or not v.strip() or len(v) > MAX_ID_CHARS:
            raise RegulationError(
                f"subject.ids[{i}]",
                f"each userId must be a non-empty string of at most {MAX_ID_CHARS} characters",
            )
    return kind, list(dict.fromkeys(ids))


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("pragma journal_mode=wal")
    conn.execute("pragma synchronous=full")
    # Deleted content is overwritten, not left in free pages (a deleted user's ids).
    conn.execute("pragma secure_delete=on")
    return conn


class RegulationStore:
    """The regulations of a data dir. Thread-safe: one connection per thread."""

    def __init__(self, paths: DataPaths) -> None:
        self.paths = paths
        self.key = hash_key(paths)
        self.generation = Generation(paths.regulations_generation)
        # Opening makes the file: a store lost after lists were written (the counter moved) must
        # not come back empty, or the collectors would let regulated users in again.
        if not paths.regulations_db.exists() and self.generation.read() > 1:
            raise ListsUnavailable(
                f"the regulations store {paths.regulations_db} is missing though lists were"
                f" written (counter {self.generation.read()} in {paths.regulations_generation}):"
                " restore it"
            )
        self._local = threading.local()
        self._conn().executescript(SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _connect(self.paths.regulations_db)
        return conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("begin immediate")
        try:
            yield conn
        except BaseException:
            conn.execute("rollback")
            raise
        conn.execute("commit")

    def hash(self, account_id: str, identifier: str) -> str:
        return identifier_hash(self.key, account_id, identifier)

    # --- filing -------------------------------------------------------------------------------

    def file(
        self,
        client_id: str,
        account_id: str,
        brand_id: str,
        kind: str,
        user_ids: builtins.list[str],
        anonymous_ids: dict[str, list[str]] | None = None,
    ) -> Regulation:
        """File a regulation; its effect on the collectors' lists holds when this returns.
        `anonymous_ids`: per userId, the anonymousIds the models tie to it now (more are added
        by the regulation's run as the models find them). DELETE needs every userId under an
        active suppression (RegulationError otherwise)."""
        hashes = [self.hash(account_id, u) for u in user_ids]
        now = time.time()
        reg_id = new_id()
        with self._tx() as conn:
            if kind == "DELETE":
                missing = [
                    u
                    for u, h in zip(user_ids, hashes, strict=True)
                    if conn.execute(
                        "select 1 from subject_lists where account_id = ? and list = ?"
                        " and user_hash = ? and id_hash = user_hash",
                        (account_id, SUPPRESS, h),
                    ).fetchone()
                    is None
                ]
                if missing:
                    shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
                    raise RegulationError(
                        "subject.ids",
                        f"DELETE needs an active suppression of every userId (file SUPPRESS or "
                        f"SUPPRESS_WITH_DELETE first); not suppressed: {shown}",
                    )
            conn.execute(
                f"insert into regulations ({_COLUMNS}) values"
                " (?, ?, ?, ?, ?, 'pending', ?, null, null, ?, ?, null, null, null, null, null,"
                " null, 0)",
                (
                    reg_id,
                    client_id,
                    account_id,
                    brand_id,
                    kind,
                    now,
                    json.dumps(user_ids),
                    json.dumps(hashes),
                ),
            )
            lists = {"SUPPRESS": SUPPRESS, "SUPPRESS_WITH_DELETE": SUPPRESS, "NO_TRACK": NO_TRACK}
            ends = {"UNSUPPRESS": SUPPRESS, "TRACK": NO_TRACK}
            if kind in lists:
                for u, h in zip(user_ids, hashes, strict=True):
                    ids = [h] + [self.hash(account_id, a) for a in (anonymous_ids or {}).get(u, [])]
                    self._add(conn, account_id, lists[kind], h, ids, reg_id, now)
            elif kind in ends:
                conn.executemany(
                    "delete from subject_lists where account_id = ? and list = ? and user_hash = ?",
                    [(account_id, ends[kind], h) for h in hashes],
                )
        if kind in ("SUPPRESS", "SUPPRESS_WITH_DELETE", "NO_TRACK", "UNSUPPRESS", "TRACK"):
            self.generation.bump()
        reg = self.get(reg_id)
        assert reg is not None
        return reg

    @staticmethod
    def _add(
        conn: sqlite3.Connection,
        account_id: str,
        list_name: str,
        user_hash: str,
        id_hashes: Iterable[str],
        reg_id: str,
        now: float,
    ) -> None:
        conn.executemany(
            "insert or ignore into subject_lists values (?, ?, ?, ?, ?, ?)",
            [(account_id, list_name, h, user_hash, reg_id, now) for h in id_hashes],
        )

    def tie(self, account_id: str, user_id: str, anonymous_ids: Iterable[str], reg_id: str) -> int:
        """Add anonymousIds found tied to a userId to every list that holds the userId; the
        number of list entries added. Collectors see them when this returns."""
        user_hash = self.hash(account_id, user_id)
        anon = [self.hash(account_id, a) for a in anonymous_ids]
        added = 0
        with self._tx() as conn:
            for (list_name,) in conn.execute(
                "select distinct list from subject_lists where account_id = ? and user_hash = ?",
                (account_id, user_hash),
            ).fetchall():
                before = conn.total_changes
                self._add(conn, account_id, list_name, user_hash, anon, reg_id, time.time())
                added += conn.total_changes - before
        if added:
            self.generation.bump()
        return added

    # --- reading ------------------------------------------------------------------------------

    def get(self, regulation_id: str) -> Regulation | None:
        row = (
            self._conn()
            .execute(
                f"select {_COLUMNS} from regulations where regulation_id = ?", (regulation_id,)
            )
            .fetchone()
        )
        return _row(row) if row else None

    def list(self, client_id: str, account_id: str, limit: int = 100) -> builtins.list[Regulation]:
        rows = (
            self._conn()
            .execute(
                f"select {_COLUMNS} from regulations where client_id = ? and account_id = ?"
                " order by created_at desc, regulation_id desc limit ?",
                (client_id, account_id, limit),
            )
            .fetchall()
        )
        return [_row(r) for r in rows]

    def list_account(self, account_id: str) -> builtins.list[Regulation]:
        """Every regulation of an account, oldest first."""
        rows = (
            self._conn()
            .execute(
                f"select {_COLUMNS} from regulations where account_id = ? order by created_at",
                (account_id,),
            )
            .fetchall()
        )
        return [_row(r) for r in rows]

    def unfinished(self) -> builtins.list[Regulation]:
        rows = (
            self._conn()
            .execute(
                f"select {_COLUMNS} from regulations where status in ('pending', 'running')"
                " order by created_at"
            )
            .fetchall()
        )
        return [_row(r) for r in rows]

    def lists(self) -> dict[str, dict[str, frozenset[str]]]:
        """Per account, per list name, the hashes it holds."""
        out: dict[str, dict[str, set[str]]] = {}
        for account, name, h in self._conn().execute(
            "select account_id, list, id_hash from subject_lists"
        ):
            out.setdefault(account, {}).setdefault(name, set()).add(h)
        return {a: {n: frozenset(s) for n, s in d.items()} for a, d in out.items()}

    def suppressed(self, account_id: str, user_id: str) -> bool:
        h = self.hash(account_id, user_id)
        return (
            self._conn()
            .execute(
                "select 1 from subject_lists where account_id = ? and list = ? and id_hash = ?",
                (account_id, SUPPRESS, h),
            )
            .fetchone()
            is not None
        )

    def tombstones(
        self, account_id: str | None = None
    ) -> builtins.list[tuple[str, str, str, float]]:
        """(account_id, kind, id_hash, deleted_at) of every tombstone (of one account)."""
        sql = "select account_id, kind, id_hash, deleted_at from tombstones"
        if account_id is None:
            return self._conn().execute(sql).fetchall()
        return self._conn().execute(sql + " where account_id = ?", (account_id,)).fetchall()

    # --- dropped calls --------------------------------------------------------------------------

    def record_dropped(self, rows: Iterable[tuple[str, str, str, float]]) -> int:
        """Keep (account_id, eventId, list, dropped_at) of dropped calls (a row kept twice is
        one), and forget those past DROPPED_KEEP_DAYS or beyond the last DROPPED_MAX_ROWS; the
        number of rows added."""
        with self._tx() as conn:
            before = conn.total_changes
            conn.executemany("insert or ignore into dropped_events values (?, ?, ?, ?)", rows)
            added = conn.total_changes - before
            if added:
                cutoff = time.time() - DROPPED_KEEP_DAYS * 86400
                conn.execute("delete from dropped_events where dropped_at < ?", (cutoff,))
                # Rowids grow with each insert: the oldest rows beyond the cap go by range.
                conn.execute(
                    "delete from dropped_events"
                    " where rowid <= (select max(rowid) from dropped_events) - ?",
                    (DROPPED_MAX_ROWS,),
                )
            return added

    def dropped(self, account_id: str, event_id: str) -> str | None:
        """The list (`suppress`, `no_track`) that dropped this call of the account, or None."""
        row = (
            self._conn()
            .execute(
                "select list from dropped_events where account_id = ? and event_id = ?",
                (account_id, event_id),
            )
            .fetchone()
        )
        return None if row is None else str(row[0])

    # --- a regulation's run -------------------------------------------------------------------

    def start(self, regulation_id: str) -> Regulation:
        with self._tx() as conn:
            conn.execute(
                "update regulations set status = 'running', attempts = attempts + 1,"
                " started_at = coalesce(started_at, ?), error = null"
                " where regulation_id = ? and status != 'finished'",
                (time.time(), regulation_id),
            )
        reg = self.get(regulation_id)
        if reg is None:
            raise KeyError(regulation_id)
        return reg

    def save(self, regulation_id: str, **values: Any) -> None:
        """Set columns of a regulation (JSON columns given as Python values)."""
        allowed = {
            "identifiers",
            "outcome",
            "evidence",
            "download_path",
            "download_expires_at",
            "error",
            "status",
            "finished_at",
        }
        assert set(values) <= allowed, set(values) - allowed
        encoded = {
            k: json.dumps(v) if k in ("identifiers", "outcome", "evidence") and v is not None else v
            for k, v in values.items()
        }
        sets = ", ".join(f"{k} = ?" for k in encoded)
        with self._tx() as conn:
            conn.execute(
                f"update regulations set {sets} where regulation_id = ?",
                (*encoded.values(), regulation_id),
            )

    def finish(self, regulation_id: str, **values: Any) -> None:
        self.save(
            regulation_id, status="finished", finished_at=time.time(), identifiers=None, **values
        )

    def fail(self, regulation_id: str, error: str) -> None:
        self.save(regulation_id, status="failed", finished_at=time.time(), error=error)

    def bury(
        self, account_id: str, kind: str, id_hashes: Iterable[str], deleted_at: float, reg_id: str
    ) -> int:
        """Keep tombstones of deleted identifiers (a later delete keeps the earlier time)."""
        with self._tx() as conn:
            before = conn.total_changes
            conn.executemany(
                "insert or ignore into tombstones values (?, ?, ?, ?, ?)",
                [(account_id, kind, h, deleted_at, reg_id) for h in id_hashes],
            )
            return conn.total_changes - before

    def forget(self, account_id: str, user_ids: Iterable[str]) -> int:
        """Drop the plain userIds from every regulation of the account that names them (their
        hashes stay), then compact the file so no free page keeps them. The regulations
        changed."""
        wanted = set(user_ids)
        changed = 0
        with self._tx() as conn:
            rows = conn.execute(
                "select regulation_id, subject_ids from regulations where account_id = ?",
                (account_id,),
            ).fetchall()
            for reg_id, ids_json in rows:
                ids = json.loads(ids_json)
                kept = [u for u in ids if u not in wanted]
                if len(kept) != len(ids):
                    conn.execute(
                        "update regulations set subject_ids = ? where regulation_id = ?",
                        (json.dumps(kept), reg_id),
                    )
                    changed += 1
        self.compact()
        return changed

    def compact(self) -> None:
        """VACUUM and truncate the write-ahead file: no earlier page image survives."""
        conn = self._conn()
        conn.execute("vacuum")
        for _ in range(100):
            busy = conn.execute("pragma wal_checkpoint(truncate)").fetchone()[0]
            if not busy:
                return
            time.sleep(0.05)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def existing_store(paths: DataPaths) -> RegulationStore | None:
    """The regulations store, or None when none was ever made (no regulation filed: nothing to
    exclude). A store missing though lists were written raises ListsUnavailable, as
    RegulationStore does: the pipeline must not take a lost store for an empty one and load,
    plan for or count suppressed and deleted users again."""
    if paths.regulations_db.exists() or Generation(paths.regulations_generation).read() > 1:
        return RegulationStore(paths)
    return None


@dataclass
class _Lists:
    generation: int
    suppress: dict[str, frozenset[str]] = field(default_factory=dict)
    no_track: dict[str, frozenset[str]] = field(default_factory=dict)


class AdmissionLists:
    """A collector's view of the lists: reloaded before the next admission whenever the
    generation counter moved. `current()` raises ListsUnavailable while they cannot be read."""

    def __init__(self, paths: DataPaths, retry_s: float = 5.0) -> None:
        self.paths = paths
        self.retry_s = retry_s
        self._store: RegulationStore | None = None
        self._generation = Generation(paths.regulations_generation)
        self._lists: _Lists | None = None
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        return self._open().key

    def _open(self) -> RegulationStore:
        if self._store is None:
            # A counter that moved means lists were written: their store gone is a lost store,
            # not an empty one.
            if not self.paths.regulations_db.exists() and self._generation.read() > 1:
                raise ListsUnavailable("the regulations store is missing")
            self._store = RegulationStore(self.paths)
        return self._store

    def current(self) -> _Lists:
        gen = self._generation.read()
        lists = self._lists
        if lists is not None and lists.generation == gen:
            return lists
        with self._lock:
            if self._lists is not None and self._lists.generation == gen:
                return self._lists
            deadline = time.monotonic() + self.retry_s
            while True:
                try:
                    # Read the counter before the lists: a change committed after this read
                    # moves the counter again and is loaded at the next admission.
                    gen = self._generation.read()
                    by_account = self._open().lists()
                    break
                except (sqlite3.Error, OSError, ListsUnavailable) as e:
                    # A connection that read a broken file keeps failing after the file is
                    # restored: the next attempt opens the store anew.
                    store, self._store = self._store, None
                    if store is not None:
                        store.close()
                    if time.monotonic() >= deadline:
                        raise ListsUnavailable(f"regulation lists unreadable: {e}") from e
                    time.sleep(0.05)
            loaded = _Lists(
                gen,
                {a: d.get(SUPPRESS, frozenset()) for a, d in by_account.items()},
                {a: d.get(NO_TRACK, frozenset()) for a, d in by_account.items()},
            )
            self._lists = loaded
            return loaded

    def hash(self, account_id: str, identifier: str) -> str:
        return identifier_hash(self.key, account_id, identifier)
