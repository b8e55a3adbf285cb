"""The warehouse's own tables: its schemas, the two raw tables only the load asset writes, and the
pass manifest only the orchestrator writes."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb

from mallard.distributed import storage
from mallard.generation import Generation
from mallard.paths import DataPaths
from mallard.secret import ensure_secret
from mallard.warehouse import LAKE, connect, lake_catalog_uri

log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMAS = ("raw", "staging", "intermediate", "marts", "state")
# The schemas whose tables the read API and the `customers` view look up by customer: small row
# groups, LZ4, no inlined rows (below).
LOOKUP_SCHEMAS = ("marts", "state")
# The read API fetches one event record or profile by reading the Parquet row group holding it;
# DuckDB's default (122,880 rows) made that ~40 ms, 4,096 rows ~1 ms (api/index/).
MARTS_ROW_GROUP_ROWS = 4096
# The codec of the marts' files. That read decompresses the whole row group of a JSON column:
# with LZ4 a 4,096-row group of events' `record` took 1.5-2.4 ms and of customers' `metadata`
# 15-27 ms, with DuckLake's default Snappy 3.7-5.1 ms and 24-38 ms (pyarrow, 200k rows of the
# 10M-event lake, two runs). The files are no bigger and DuckDB scans them at least as fast.
MARTS_COMPRESSION = "lz4"

RAW_DDL = """
create table if not exists lake.raw.messages (
    event_id varchar not null,
    message_id varchar not null,
    client_id varchar not null,
    account_id varchar not null,
    brand_id varchar not null,
    type varchar not null,
    event varchar,
    user_id varchar,
    anonymous_id varchar,
    "timestamp" timestamptz not null,
    received_at timestamptz not null,
    sent_at timestamptz,
    channel varchar not null,
    source varchar not null,
    message varchar not null,
    landing_file varchar not null,
    loaded_at timestamptz not null
);
create table if not exists lake.raw.landing_files (
    landing_file varchar not null,
    rows bigint not null,
    loaded_at timestamptz not null
);
create table if not exists lake.state.pass_manifest (
    pass_id bigint not null,
    models_epoch integer not null,
    loaded_after timestamptz,
    loaded_through timestamptz,
    opened_at timestamptz not null
);
-- What the pass builds (orchestration/window.py PassKind): 'full', every model, or 'served', the
-- models the read API serves. Null on rows from before the column: full passes.
alter table lake.state.pass_manifest add column if not exists kind varchar;
"""


def ensure_wal_catalog(paths: DataPaths) -> bool:
    """Put the SQLite catalog in WAL mode (persistent in the file). In the default rollback
    journal mode the API's reads hold shared locks that make the pipeline's commit fail with
    "database is locked" (measured: every rebuild under 2 reading clients failed)."""
    # Switching needs a moment without readers; if busy now, the next load switches it.
    # Only while this process holds no DuckDB connection to the lake (before a load connects):
    # Python's SQLite and the one inside DuckDB's `sqlite` extension do not see each other's
    # locks in one process, and one can truncate the WAL index the other has mapped (SIGBUS).
    # True once the catalog is in WAL mode. A catalog on PostgreSQL has no such mode to set.
    if storage().catalog:
        return True
    with (
        contextlib.suppress(sqlite3.OperationalError),
        contextlib.closing(sqlite3.connect(paths.lake_catalog, timeout=10)) as db,
    ):
        if db.execute("pragma journal_mode").fetchone()[0] != "wal":
            db.execute("pragma journal_mode=wal")
        return bool(db.execute("pragma journal_mode").fetchone()[0] == "wal")
    return False


# The catalogs this process has made ready (schemas, raw tables, options, WAL mode), by file
# identity: a catalog deleted and made again at the same path is made ready again.
_READY: dict[Path | str, tuple[int, int]] = {}
# One DuckDB per process and catalog for the orchestrator's own statements (the load, the
# window, the compaction check): a DuckDB of its own per statement loaded the DuckLake and SQLite
# extensions again each time, ~0.15 s, and ensure_warehouse's statements took 0.2 s, four times
# in every pass (at 10M messages). dbt keeps its own DuckDB (orchestration/dbt_in_process.py).
# It is made again after a Delete purged the lake's files (the purge generation moved): an
# attached DuckLake keeps what it read of the catalog, and a purge flushes inlined rows (their
# tables dropped), expires snapshots and deletes files, so the old instance failed every later
# pass of a long-running process ("Table with name ducklake_inlined_data_8_8 does not exist").
_SHARED: dict[tuple[int, int], tuple[int, duckdb.DuckDBPyConnection]] = {}
_SHARED_LOCK = threading.Lock()


def _catalog_key(paths: DataPaths) -> Path | str:
    return storage().catalog or paths.lake_catalog


def _catalog_identity(paths: DataPaths) -> tuple[int, int] | None:
    if storage().catalog:  # a server's catalog (PostgreSQL): one identity per connection string
        return (0, hash(lake_catalog_uri(paths)))
    try:
        st = paths.lake_catalog.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def lake_connection(paths: DataPaths) -> duckdb.DuckDBPyConnection:
    """A connection of its own (close it after use) to this process's DuckDB with the lake
    attached, read-write, after ensure_warehouse. Until the catalog is confirmed in WAL mode the
    connection is a DuckDB of its own, as ensure_wal_catalog may only switch the mode while this
    process holds no DuckDB connection to the lake."""
    ensure_warehouse(paths)
    identity = _catalog_identity(paths)
    if identity is None or _READY.get(_catalog_key(paths)) != identity:
        return connect(paths)
    purges = Generation(paths.purge_generation).read()
    with _SHARED_LOCK:
        made = _SHARED.get(identity)
        if made is None or made[0] != purges:
            # The old instance is left to the cursors still open on it; it goes with them.
            made = _SHARED[identity] = (purges, connect(paths))
        return made[1].cursor()


# How long a process waits for another's commit to the catalog (its first pass, a load).
LOCKED_CATALOG_WAIT_S = 60.0


def _lookup_options() -> list[tuple[str, object]]:
    """The options of the schemas the read API looks rows up in. Small inserts and deletes of an
    incremental pass would otherwise be kept in the catalog (data inlining), where the read
    API's index cannot see them (it reads the Parquet files)."""
    return [
        ("parquet_row_group_size", MARTS_ROW_GROUP_ROWS),
        ("parquet_compression", MARTS_COMPRESSION),
        ("data_inlining_row_limit", 0),
    ]


def _make_ready(paths: DataPaths) -> None:
    """The schemas, the raw tables and the lookup schemas' options, each written only when
    missing or different: a catalog already made ready takes no write."""
    conn = connect(paths)
    try:
        for schema in SCHEMAS:
            conn.execute(f"create schema if not exists lake.{schema}")
        conn.execute(RAW_DDL)
        have = {
            (name, scope_entry): value
            for name, _, value, scope, scope_entry in conn.execute(
                "select * from ducklake_options(?)", [LAKE]
            ).fetchall()
            if scope == "SCHEMA"
        }
        for schema in LOOKUP_SCHEMAS:
            for name, value in _lookup_options():
                if have.get((name, schema)) != str(value):
                    conn.execute("call lake.set_option(?, ?, schema => ?)", [name, value, schema])
    finally:
        conn.close()


def retry_if_locked(attempt: Callable[[], T]) -> T:
    """`attempt()`, again after a growing pause (0.1 s to 2 s, for up to LOCKED_CATALOG_WAIT_S)
    while it fails with SQLite's "database is locked": another process commits to the SQLite
    catalog (a regulation's pass, the API making its lookup schema ready), and a transaction
    that read before that commit cannot write after it. `attempt` must roll back what it began."""
    deadline = time.monotonic() + LOCKED_CATALOG_WAIT_S
    wait = 0.1
    while True:
        try:
            return attempt()
        except duckdb.Error as e:
            if "database is locked" not in str(e) or time.monotonic() + wait > deadline:
                raise
            log.warning("the lake's catalog is locked by another writer: again in %.1f s", wait)
            time.sleep(wait)
            wait = min(wait * 2, 2.0)


def ensure_warehouse(paths: DataPaths) -> None:
    """Create the lake's schemas and raw tables if missing (idempotent; once per process and
    catalog file)."""
    identity = _catalog_identity(paths)
    if identity is not None and _READY.get(_catalog_key(paths)) == identity:
        return
    ensure_secret(paths)
    retry_if_locked(lambda: _make_ready(paths))
    if ensure_wal_catalog(paths) and (identity := _catalog_identity(paths)) is not None:
        _READY[_catalog_key(paths)] = identity
