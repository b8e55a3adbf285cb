"""A Delete: every place in the data dir that holds the subject, purged, each step idempotent.

A DuckLake `DELETE` only adds a delete file: the rows stay in the old data files, in earlier
snapshots, in rows inlined into the catalog and in the catalog's column min/max, and SQLite keeps
deleted records in free pages and in its write-ahead file. So a Delete here:

1. waits until the collectors' logs hold nothing received before the suppression (every
   segment opened before it has landed and been removed);
2. buries tombstones (keyed hashes of the userIds, anonymousIds and messageIds), so no later load
   of an old copy and no replay brings the subject back (orchestration/load.py);
3. deletes the subject's rows from every base table of the lake in one transaction (the rule in
   subjects.py), and restates the customers who shared an anonymousId with the subject: their
   derived rows are deleted and their messages marked loaded now, so the next pass builds them as
   a build that never saw the subject would;
4. rewrites the landing files that hold the subject (temp file, fsync, rename);
5. rewrites the lake's data files that had deletes, flushes inlined rows, expires every earlier
   snapshot, deletes the files nothing refers to any more, recomputes table min/max that named
   the subject, then VACUUMs the catalog and truncates its write-ahead file;
6. purges the side stores: the preferences journal, tag metrics, earlier Access zips, the
   dispatcher's outbox and the sends it wrote as files, and the local mailbox's messages that
   name the subject.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collector.roller import write_atomic
from collector.wal import fsync_dir
from mallard import landing, mailbox
from mallard.distributed import storage
from mallard.generation import Generation
from mallard.paths import DataPaths
from mallard.regulations import ANONYMOUS, MESSAGE, USER, RegulationStore
from mallard.warehouse import files_connection
from orchestration.column_stats import metadata_sql
from orchestration.locks import lake_writer
from orchestration.regulations.subjects import Subject, count, selection, selections
from orchestration.regulations.verify import token_pattern
from orchestration.warehouse import lake_connection

WAL_SUFFIXES = (".wal", ".sealed")


class LogNotDrained(RuntimeError):
    """A collector's log still holds segments opened before the suppression (no collector runs
    to land them): the Delete waits; run it again once the collector has started."""


def wait_for_logs(paths: DataPaths, before: float, timeout_s: float = 120.0) -> int:
    """Wait until no collector's log holds a segment opened before `before` (epoch seconds;
    segments are named by the millisecond they opened). Returns how many were waited for."""
    cutoff_ms = int(before * 1000)

    def old() -> list[Path]:
        if not paths.wal_dir.exists():
            return []
        return [
            p
            for p in paths.wal_dir.glob("*/*")
            if p.suffix in WAL_SUFFIXES
            and p.name.split(".")[0].isdigit()
            and int(p.name.split(".")[0]) <= cutoff_ms
        ]

    first = old()
    deadline = time.monotonic() + timeout_s
    while (left := old()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        raise LogNotDrained(
            f"{len(left)} log segments received before the suppression are not landed yet "
            "(is the collector running?)"
        )
    return len(first)


def bury(store: RegulationStore, subject: Subject, regulation_id: str, deleted_at: float) -> int:
    """Tombstones of every identifier of the subject; how many are new."""
    h = lambda v: store.hash(subject.account_id, v)  # noqa: E731
    return (
        store.bury(subject.account_id, USER, map(h, subject.user_ids), deleted_at, regulation_id)
        + store.bury(
            subject.account_id, ANONYMOUS, map(h, subject.anonymous_ids), deleted_at, regulation_id
        )
        + store.bury(
            subject.account_id, MESSAGE, map(h, subject.message_ids), deleted_at, regulation_id
        )
    )


# --- the lake's rows -------------------------------------------------------------------------


def neighbours(conn: duckdb.DuckDBPyConnection, subject: Subject) -> list[str]:
    """The other userIds whose messages carry one of the subject's anonymousIds: the models
    attribute those anonymousIds to them once the subject's messages are gone."""
    if not subject.anonymous_ids:
        return []
    rows = conn.execute(
        """
        select distinct user_id from lake.raw.messages
        where account_id = $account and anonymous_id in (select unnest($anon))
            and user_id is not null and user_id not in (select unnest($users))
        """,
        {"account": subject.account_id, "anon": subject.anonymous_ids, "users": subject.user_ids},
    ).fetchall()
    return sorted(r[0] for r in rows)


@dataclass(frozen=True)
class LakePurge:
    rows_deleted: dict[str, int]
    restated_customers: int  # customers sharing an anonymousId, rebuilt by the next pass
    restated_messages: int

    def to_json(self) -> dict[str, object]:
        return {
            "rowsDeleted": self.rows_deleted,
            "restatedCustomers": self.restated_customers,
            "restatedMessages": self.restated_messages,
        }


def purge_lake(
    paths: DataPaths, subject: Subject, others: Subject | None, doing: str = "a Delete's purge"
) -> LakePurge:
    """Delete the subject's rows from every base table, and the derived rows of `others` (the
    customers sharing an anonymousId) with their raw messages marked loaded now, in one
    transaction in the lake writer's turn (no pass or load runs meanwhile; `doing` names it in
    the turn's holder record)."""
    with lake_writer(paths, doing):
        conn = lake_connection(paths)
        try:
            conn.execute("begin transaction")
            sels = selections(conn, subject)
            deleted: dict[str, int] = {}
            for sel in sels:
                n = count(conn, sel)
                if n:
                    conn.execute(f"delete from {sel.relation} where {sel.where}", sel.params)
                deleted[sel.name] = n
            restated = 0
            if others is not None and others.user_ids:
                for sel in selections(conn, others):
                    if sel.name != "raw.messages":
                        conn.execute(f"delete from {sel.relation} where {sel.where}", sel.params)
                raw = selection(
                    others, "raw", "messages", {"account_id", "user_id", "anonymous_id"}
                )
                assert raw is not None
                restated = count(conn, raw)
                conn.execute(
                    f"update {raw.relation} set loaded_at = $now where {raw.where}",
                    {**raw.params, "now": datetime.now(UTC)},
                )
            _recount_landing_ledger(conn)
            conn.execute("commit")
            return LakePurge(deleted, len(others.customer_ids) if others else 0, restated)
        except BaseException:
            conn.execute("rollback")
            raise
        finally:
            conn.close()


def _recount_landing_ledger(conn: duckdb.DuckDBPyConnection) -> None:
    """The ledger's row count of each landing file, as the lake holds it now."""
    conn.execute(
        """
        update lake.raw.landing_files as ledger set rows = coalesce(counted.rows, 0)
        from (
            select ledger.landing_file, count(messages.event_id) as rows
            from lake.raw.landing_files as ledger
            left join lake.raw.messages as messages using (landing_file)
            group by ledger.landing_file
        ) as counted
        where ledger.landing_file = counted.landing_file
            and ledger.rows != coalesce(counted.rows, 0)
        """
    )


# --- the landing files -----------------------------------------------------------------------


def _landing_mask(table: pa.Table, subject: Subject) -> pa.ChunkedArray:
    """The subject's rows of a landing table (the raw.messages rule of subjects.py)."""
    account = pc.equal(table["account_id"], subject.account_id)
    user = pc.is_in(table["user_id"], value_set=pa.array(subject.user_ids, pa.string()))
    anon = pc.and_(
        pc.is_null(table["user_id"]),
        pc.is_in(table["anonymous_id"], value_set=pa.array(subject.anonymous_ids, pa.string())),
    )
    return pc.fill_null(pc.and_(account, pc.or_(user, anon)), False)


def purge_landing(
    paths: DataPaths, subject: Subject, doing: str = "a Delete's purge"
) -> tuple[int, int]:
    """Rewrite every landing file that holds the subject's messages without them (temp file,
    fsync, rename: a reader sees the old file or the new, never a part; on S3 one PUT replaces
    the object whole). In the lake writer's turn: no load reads a file while it is replaced.
    (files rewritten, rows removed)"""
    files = _landing_with_subject(paths, subject)
    rewritten = removed = 0
    with lake_writer(paths, doing):
        for name in files:
            table = landing.read(paths, name)
            mask = _landing_mask(table, subject)
            n = pc.sum(mask).as_py() or 0
            if not n:
                continue
            kept = table.filter(pc.invert(mask))
            path = landing.local_path(paths, name)
            if path is None:
                landing.write_remote(kept, name)
            else:
                write_atomic(kept, path, tag=".purge")
            rewritten += 1
            removed += n
    return rewritten, removed


def _landing_with_subject(paths: DataPaths, subject: Subject) -> list[str]:
    """The names (mallard/landing.py) of the landing files that hold the subject's messages."""
    names = [f.name for f in landing.listing(paths)]
    if not names:
        return []
    sel = selection(subject, "landing", "files", {"account_id", "user_id", "anonymous_id"})
    assert sel is not None
    by_url = {landing.url(paths, n): n for n in names}
    conn = files_connection(paths)
    try:
        rows = conn.execute(
            "select distinct filename from read_parquet($files, filename = true)"
            f" where {sel.where}",
            {**sel.params, "files": list(by_url)},
        ).fetchall()
    finally:
        conn.close()
    return sorted(by_url[r[0]] for r in rows)


# --- the lake's files and catalog ------------------------------------------------------------


@dataclass(frozen=True)
class FilesPurge:
    files_rewritten: int
    snapshots_expired: int
    files_deleted: int
    table_stats_reset: int

    def to_json(self) -> dict[str, int]:
        return {
            "filesRewritten": self.files_rewritten,
            "snapshotsExpired": self.snapshots_expired,
            "filesDeleted": self.files_deleted,
            "tableStatsRecomputed": self.table_stats_reset,
        }


def purge_lake_files(
    paths: DataPaths, subject: Subject, doing: str = "a Delete's purge"
) -> FilesPurge:
    """Rewrite every data file with deletes, flush inlined rows, expire every snapshot but the
    current one, delete the files nothing refers to, recompute table min/max that name the
    subject; then compact the catalog file. In the lake writer's turn."""
    with lake_writer(paths, doing):
        conn = lake_connection(paths)
        try:
            # Flushing inlined rows that had deletes writes files with deletes: flush first.
            conn.execute("call ducklake_flush_inlined_data('lake')")
            # One row per table: (schema, table, files rewritten, files written).
            rewritten = sum(
                int(r[2])
                for r in conn.execute(
                    "call ducklake_rewrite_data_files('lake', delete_threshold => 0)"
                ).fetchall()
            )
            expired = len(
                conn.execute(
                    "call ducklake_expire_snapshots('lake', older_than => now())"
                ).fetchall()
            )
            deleted = len(
                conn.execute(
                    "call ducklake_cleanup_old_files('lake', cleanup_all => true)"
                ).fetchall()
            )
            orphans = len(
                conn.execute(
                    "call ducklake_delete_orphaned_files('lake', cleanup_all => true)"
                ).fetchall()
            )
            stats = _recompute_table_stats(conn, subject)
        finally:
            conn.close()
        if storage().on_postgres:
            vacuum_postgres_catalog()
        else:
            compact_catalog(paths.lake_catalog)
        # Before the writer's turn ends: every long-running process (the watcher, the API, its
        # pages process, the dispatcher) drops what it holds of the catalog and the files before
        # it reads the lake again (orchestration/warehouse.py lake_connection).
        Generation(paths.purge_generation).bump()
    return FilesPurge(rewritten, expired, deleted + orphans, stats)


def _recompute_table_stats(conn: duckdb.DuckDBPyConnection, subject: Subject) -> int:
    """DuckLake keeps a min/max per table column and does not shrink it on delete: one that holds
    a subject's identifier (the whole value, or within it: a JSON column's min/max is a prefix
    of a stored document) is set from the live files' min/max (text columns order as text;
    none left: null)."""
    strings = subject.strings()
    if not strings:
        return 0
    rows = conn.execute(
        metadata_sql(
            """
            select st.table_id, st.column_id from lake.ducklake_table_column_stats as st
            where exists (
                select 1 from unnest($s) as t (s)
                where contains(st.min_value, t.s) or contains(st.max_value, t.s)
            )
            """
        ),
        {"s": strings},
    ).fetchall()
    if not rows:
        return 0
    conn.execute("begin")
    for table_id, column_id in rows:
        conn.execute(
            metadata_sql(
                """
                update lake.ducklake_table_column_stats set
                    min_value = (
                        select min(fs.min_value) from lake.ducklake_file_column_stats as fs
                        join lake.ducklake_data_file as f using (data_file_id)
                        where f.end_snapshot is null and fs.table_id = $t and fs.column_id = $c),
                    max_value = (
                        select max(fs.max_value) from lake.ducklake_file_column_stats as fs
                        join lake.ducklake_data_file as f using (data_file_id)
                        where f.end_snapshot is null and fs.table_id = $t and fs.column_id = $c)
                where table_id = $t and column_id = $c
                """
            ),
            {"t": table_id, "c": column_id},
        )
    conn.execute("commit")
    return len(rows)


_COMPACT = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
conn.execute("pragma secure_delete=on")
conn.execute("vacuum")
for _ in range(600):
    if not conn.execute("pragma wal_checkpoint(truncate)").fetchone()[0]:
        break
    time.sleep(0.1)
else:
    sys.exit("the write-ahead file stayed busy")
"""


def compact_catalog(path: Path) -> None:
    """VACUUM a SQLite file and truncate its write-ahead file, so no freed page and no earlier
    page image survives. In a process of its own: a second SQLite library in a process whose
    DuckDB has the file open can truncate the WAL index DuckDB has mapped."""
    if path.exists():
        subprocess.run([sys.executable, "-c", _COMPACT, str(path)], check=True, timeout=900)


def vacuum_postgres_catalog() -> None:
    """VACUUM FULL the DuckLake tables of a PostgreSQL catalog: each is rewritten, so no page
    keeps a deleted row's values (a plain VACUUM only marks their space free)."""
    conn = storage().catalog_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "select quote_ident(schemaname) || '.' || quote_ident(tablename) from pg_tables"
                " where tablename like 'ducklake%'"
            )
            for (table,) in cur.fetchall():
                cur.execute(f"vacuum full {table}")
    finally:
        conn.close()


# --- the side stores -------------------------------------------------------------------------


def purge_preferences_journal(paths: DataPaths, subject: Subject) -> int:
    """The journal's changes of the subject's customers; rows removed."""
    path = paths.preferences_journal
    if not path.exists() or not subject.customer_ids:
        return 0
    script = """
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
conn.execute("pragma secure_delete=on")
ids = json.loads(sys.argv[2])
cur = conn.executemany("delete from changes where customer_id = ?", [(i,) for i in ids])
print(cur.rowcount)
"""
    out = subprocess.run(
        [sys.executable, "-c", script, str(path), json.dumps(subject.customer_ids)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    compact_catalog(path)
    return int(out.stdout.strip() or 0)


def purge_outbox(paths: DataPaths, subject: Subject) -> dict[str, int]:
    """The dispatcher's state about the subject's customers: their sends (rendered content,
    addresses) and the links stored for them, their journey instances and journey events, and
    their addresses suppressed by bounces. Rows removed by table. The commands' planned marks
    stay: they hold eventIds only, and keep a deleted command from being planned again."""
    path = paths.outbox_db
    if not path.exists() or not (subject.customer_ids or subject.emails):
        return {}
    ids, emails = subject.customer_ids, [e.lower() for e in subject.emails]
    removed: dict[str, int] = {}
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("pragma secure_delete=on")
        conn.execute("begin immediate")
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        conn.execute("create temp table subject_customers (id text primary key)")
        conn.executemany("insert or ignore into subject_customers values (?)", [(i,) for i in ids])
        conn.execute("create temp table subject_emails (address text primary key)")
        conn.executemany("insert or ignore into subject_emails values (?)", [(e,) for e in emails])
        if "sends" in tables:
            conn.execute(
                "create temp table subject_sends as select send_id from sends"
                " where account_id = ? and (json_extract(payload, '$.customerId') in"
                " (select id from subject_customers) or lower(recipient) in"
                " (select address from subject_emails))",
                (subject.account_id,),
            )
            if "email_links" in tables:
                removed["email_links"] = conn.execute(
                    "delete from email_links where send_id in (select send_id from subject_sends)"
                ).rowcount
            removed["sends"] = conn.execute(
                "delete from sends where send_id in (select send_id from subject_sends)"
            ).rowcount
        if "journey_instances" in tables:
            removed["journey_events"] = conn.execute(
                "delete from journey_events where instance_id in (select instance_id from"
                " journey_instances where account_id = ? and customer_id in"
                " (select id from subject_customers))",
                (subject.account_id,),
            ).rowcount
            removed["journey_instances"] = conn.execute(
                "delete from journey_instances where account_id = ? and customer_id in"
                " (select id from subject_customers)",
                (subject.account_id,),
            ).rowcount
        if "suppressed_addresses" in tables:
            removed["suppressed_addresses"] = conn.execute(
                "delete from suppressed_addresses where account_id = ? and address in"
                " (select address from subject_emails)",
                (subject.account_id,),
            ).rowcount
        conn.execute("commit")
    finally:
        conn.close()
    compact_catalog(path)
    return removed


def purge_file_outbox(paths: DataPaths, subject: Subject) -> int:
    """The sends the dispatcher wrote as files for a channel with no provider
    (`outbox/<channel>/<sendId>.json`, delivery/dispatch.py `write_file_outbox`) that name the
    subject, removed whole; how many. Each is written to a dot-temp file and renamed into place,
    so none is read half written; one renamed in after the listing is what the proof finds."""
    folder = paths.root / "outbox"
    strings = subject.strings()
    if not strings or not folder.is_dir():
        return 0
    pattern = token_pattern(strings)
    removed = 0
    for channel in sorted(p for p in folder.iterdir() if p.is_dir()):
        named = [f for f in sorted(channel.glob("[!.]*.json")) if pattern.search(f.read_bytes())]
        for f in named:
            f.unlink(missing_ok=True)
        if named:
            fsync_dir(channel)
        removed += len(named)
    return removed


def _pattern(strings: Iterable[str]) -> re.Pattern[bytes]:
    return re.compile(b"|".join(re.escape(s.encode()) for s in sorted(set(strings), key=len)[::-1]))


def purge_text_lines(files: Iterable[Path], strings: list[str]) -> tuple[int, int]:
    """Rewrite JSON-lines files without the lines that name any of the strings (temp file,
    fsync, rename). (files rewritten, lines removed)"""
    if not strings:
        return 0, 0
    pattern = _pattern(strings)
    rewritten = removed = 0
    for path in files:
        data = path.read_bytes()
        if not pattern.search(data):
            continue
        lines = data.splitlines(keepends=True)
        kept = [line for line in lines if not pattern.search(line)]
        tmp = path.with_name(f".{path.name}.purge.tmp")
        with open(tmp, "wb") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        fsync_dir(path.parent)
        rewritten += 1
        removed += len(lines) - len(kept)
    return rewritten, removed


def purge_metrics(paths: DataPaths, subject: Subject) -> tuple[int, int]:
    if not paths.metrics_dir.exists():
        return 0, 0
    return purge_text_lines(sorted(paths.metrics_dir.glob("*.jsonl")), subject.strings())


def purge_access_zips(store: RegulationStore, subject: Subject, regulation_id: str) -> int:
    """Remove the Access zips of earlier ACCESS regulations of the subject; how many. Each such
    regulation keeps when its zip was removed and by which regulation (`downloadRemoved` in its
    evidence): its download then answers 410 with that reason, not 404 as one never made."""
    wanted = {store.hash(subject.account_id, u) for u in subject.user_ids}
    removed = 0
    for reg in store.list_account(subject.account_id):
        if reg.regulation_type != "ACCESS" or not wanted & set(reg.subject_hashes):
            continue
        if reg.download_path and Path(reg.download_path).exists():
            Path(reg.download_path).unlink()
            removed += 1
        if reg.download_path:
            at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            gone = {"at": at, "by": regulation_id}
            evidence = {**(reg.evidence or {}), "downloadRemoved": gone}
            store.save(reg.regulation_id, download_path=None, evidence=evidence)
    return removed


def purge_mailbox(paths: DataPaths, subject: Subject) -> int:
    """Remove the local mailbox's messages to or about the subject: every one whose bytes or
    decoded text hold one of their identifiers as the proof searches for them; how many. Mail
    `MALLARD_SMTP_URL` sent to another server is out of the data dir's reach."""
    strings = subject.strings()
    if not strings:
        return 0
    return mailbox.purge_subject(paths.mailbox_dir, token_pattern(strings))
