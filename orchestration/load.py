"""Loading landing files into lake.raw.messages, each exactly once.

The rows and the ledger entry of every file are written in one DuckLake transaction, so a crash
mid-load leaves neither; a rerun loads the file then. A load runs in the lake writer's turn
(orchestration/locks.py): two concurrent appends of the same file would both commit.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime

import duckdb
import pyarrow as pa

from mallard import landing
from mallard.distributed import storage
from mallard.paths import DataPaths
from mallard.regulations import existing_store, identifier_hash_sql
from orchestration.locks import lake_writer
from orchestration.warehouse import lake_connection, retry_if_locked

# Bounds the memory and the length of one transaction; the rest waits for the next pass.
MAX_FILES_PER_TRANSACTION = 2000


@dataclass(frozen=True)
class LoadResult:
    files: int
    rows: int
    pending: int  # files left for a later pass (over the per-transaction cap)

    @property
    def summary(self) -> str:
        more = f", {self.pending} more pending" if self.pending else ""
        return f"{self.files} new landing files, {self.rows} rows{more}"


def landing_files(paths: DataPaths) -> list[str]:
    """Every complete landing file, relative to its root (mallard/landing.py): the landing dir's,
    and with MALLARD_LANDING_URL the collectors' S3 prefix."""
    return sorted(f.name for f in landing.listing(paths))


def landing_mark(paths: DataPaths) -> str:
    """When the last landing file appeared, as a cursor that orders as a string: the largest
    inode-change time (ns, zero-padded) of the complete landing files; "" with none. A file
    lands by rename (collector/roller.py), which sets its ctime, so a file that appears after a
    mark was read has a larger one whatever its name. Names do not say which file is newer: the
    files of several collectors (`b-...05` lands, then `a-...09`) and a segment of an earlier
    day rolled late (after a crash) sort before files that landed first. With landing files on
    S3, whose times have a coarser grain (a second on some servers), the count of files follows
    the time, so a file landing in the same second as the newest still moves the mark."""
    files = landing.listing(paths)
    newest = max((f.mtime_ns for f in files), default=0)
    if not newest:
        return ""
    return f"{newest:020d}{len(files):010d}" if storage().landing_url else f"{newest:020d}"


def landed_since(mark: str, cursor: str | None) -> bool:
    """Whether files landed after `cursor` (an earlier landing_mark; anything else, such as a
    file name an earlier version kept, counts as none)."""
    return bool(mark) and (not (cursor or "").isdigit() or mark > (cursor or ""))


# The rows of deleted subjects (orchestration/regulations/purge.py): by messageId whenever it
# arrives (a replay), by userId or by the anonymousId of an anonymous message when received
# before the delete (an old copy of a landing file).
_BURIED = f"""
    anti join mallard_tombstones as t1
        on t1.kind = 'message' and t1.account_id = m.account_id
        and t1.id_hash = {identifier_hash_sql("m.account_id", "m.message_id")}
    anti join mallard_tombstones as t2
        on t2.kind = 'user' and t2.account_id = m.account_id and m.received_at <= t2.deleted_at
        and t2.id_hash = {identifier_hash_sql("m.account_id", "m.user_id")}
    anti join mallard_tombstones as t3
        on t3.kind = 'anonymous' and t3.account_id = m.account_id and m.user_id is null
        and m.received_at <= t3.deleted_at
        and t3.id_hash = {identifier_hash_sql("m.account_id", "m.anonymous_id")}
"""


def _tombstones(conn: duckdb.DuckDBPyConnection, paths: DataPaths) -> dict[str, str]:
    """The tombstones of deleted subjects as the temp table `mallard_tombstones`; the key its
    hashes take (as a query parameter), or nothing when there are none."""
    store = existing_store(paths)
    if store is None:
        return {}
    try:
        rows = store.tombstones()
    finally:
        store.close()
    if not rows:
        return {}
    conn.register(
        "mallard_tombstones_rows",
        pa.table(
            {
                "account_id": [r[0] for r in rows],
                "kind": [r[1] for r in rows],
                "id_hash": [r[2] for r in rows],
                "deleted_at": [datetime.fromtimestamp(r[3], UTC) for r in rows],
            }
        ),
    )
    conn.execute("create or replace temp table mallard_tombstones as from mallard_tombstones_rows")
    conn.unregister("mallard_tombstones_rows")
    return {"key": store.key}


def _unloaded(conn: duckdb.DuckDBPyConnection, paths: DataPaths) -> list[str]:
    loaded = {
        r[0] for r in conn.execute("select landing_file from lake.raw.landing_files").fetchall()
    }
    return [f for f in landing_files(paths) if f not in loaded]


def unloaded_files(paths: DataPaths) -> list[str]:
    """The complete landing files not loaded yet (relative to the landing dir)."""
    conn = lake_connection(paths)
    try:
        return _unloaded(conn, paths)
    finally:
        conn.close()


def load_new_files(paths: DataPaths, *, fail_before_commit: bool = False) -> LoadResult:
    """Load every landing file not in the ledger. `fail_before_commit` is for crash tests."""
    with lake_writer(paths, "load"):
        conn = lake_connection(paths)
        try:
            new = _unloaded(conn, paths)
            batch, pending = new[:MAX_FILES_PER_TRANSACTION], len(new) - MAX_FILES_PER_TRANSACTION
            if not batch:
                return LoadResult(0, 0, 0)
            # A commit refused because another process committed to the SQLite catalog since
            # this transaction read it is tried again (the same files, the same insert).
            loaded = retry_if_locked(lambda: _load(conn, paths, batch, fail_before_commit))
            return LoadResult(len(batch), loaded, max(pending, 0))
        finally:
            conn.close()


def _load(
    conn: duckdb.DuckDBPyConnection, paths: DataPaths, batch: list[str], fail_before_commit: bool
) -> int:
    """One transaction: the files' messages into raw.messages and their names into the ledger;
    the rows loaded. Rolled back on any failure."""
    local_root, *remote_root = landing.roots(paths)
    params = {
        "files": [landing.url(paths, f) for f in batch],
        "root": local_root,
        "remote_root": remote_root[0] if remote_root else local_root,
        "now": datetime.now(UTC),
        "names": batch,
    }
    try:
        buried = _tombstones(conn, paths)
        conn.execute("begin transaction")
        conn.execute(
            f"""
            insert into lake.raw.messages
            select
                event_id, message_id, client_id, account_id, brand_id, type, event, user_id,
                anonymous_id, "timestamp", received_at, sent_at, channel, source, message,
                replace(replace(filename, $root, ''), $remote_root, '') as landing_file,
                $now as loaded_at
            from read_parquet($files, filename = true, hive_partitioning = false) as m
            {_BURIED if buried else ""}
            """,
            {k: params[k] for k in ("files", "root", "remote_root", "now")} | buried,
        )
        conn.execute(
            """
            insert into lake.raw.landing_files
            select names.landing_file, count(messages.event_id), $now
            from (select unnest($names) as landing_file) as names
            left join lake.raw.messages as messages
                on messages.landing_file = names.landing_file and messages.loaded_at = $now
            group by names.landing_file
            """,
            {k: params[k] for k in ("names", "now")},
        )
        row = conn.execute(
            "select coalesce(sum(rows), 0) from lake.raw.landing_files where loaded_at = $now",
            {"now": params["now"]},
        ).fetchone()
        if fail_before_commit:
            raise RuntimeError("injected failure before commit")
        conn.execute("commit")
        return int(row[0]) if row else 0
    except BaseException:
        with suppress(duckdb.Error):
            conn.execute("rollback")
        raise
