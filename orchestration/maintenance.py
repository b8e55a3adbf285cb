"""Warehouse maintenance: rewrite the files incremental passes riddled with deletes, merge small
files, expire old snapshots and delete the files nothing refers to any more.

Every incremental pass deletes the changed customers' rows (DuckLake writes delete files) and
inserts their new rows (a new small file per table). Left alone, reads slow down with every pass
and the lake only grows. Two entry points, both under the build lock, so never during a dbt build:

- `compact_fragmented`, after passes: only the tables with `compact_at_files` or more files that
  compaction would rewrite or merge. Passes slow down with fragmentation (at 10M, 35.0 s with
  ~17 files a table against 24.7-27.0 s after compaction), and at a pass a minute a day's passes
  would leave over a thousand files a table, so this follows the files, not the clock.
- `maintain`, nightly: every table, then snapshot expiry and file cleanup.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from datetime import timedelta

import duckdb

from mallard.paths import DataPaths
from mallard.settings import get_settings
from mallard.warehouse import connect
from orchestration.locks import build_lock
from orchestration.warehouse import lake_connection

# Snapshots are kept this long: time travel for analysts, and scrollIds, which pin the snapshot
# of their first page (an older scroll is told to start again).
SNAPSHOT_RETENTION = timedelta(days=1)
# A data file is rewritten once more than this share of its rows is deleted. Low, because a pass's
# delete reads the delete file of every data file it touches and writes it again with the new
# positions, and a pass changes customers in every file: what it pays grows with the deleted rows
# the files carry (docs/warehouse.md: 1.06-1.37 s for one delete with a big file 28% deleted,
# 0.32-0.36 s once that file alone was rewritten). At 10M messages, nine passes after a build
# (each per-customer table with ten files, every one with deletes, 4-42% of their rows), the
# next pass's dbt took 26.6 s; after rewriting every file with deletes of the nine per-customer
# tables (36 s), 20.8 s. At 0.2, five of the ten files of each kept their deletes, so those
# tables never reached the threshold of fragments.
REWRITE_DELETE_THRESHOLD = 0.01
# The schemas dbt rewrites in place; raw only grows by whole landing files.
SCHEMAS = ("intermediate", "marts", "state")
# A delete-free file under this size is merged with its neighbours: half DuckLake's default
# target file size (512 MB), so the big files of a full build never count as fragments.
SMALL_FILE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class MaintenanceResult:
    files_before: int
    files_after: int
    snapshots_expired: int
    files_deleted: int
    stats_completed: int = 0  # (file, column) min/max DuckLake left out (_complete_stats)
    leftovers_dropped: tuple[str, ...] = ()  # dbt's __dbt_tmp/__dbt_backup of interrupted builds

    @property
    def summary(self) -> str:
        dropped = self.leftovers_dropped
        return (
            f"data files {self.files_before} -> {self.files_after}, "
            f"{self.snapshots_expired} snapshots expired, {self.files_deleted} files deleted"
            + _completed(self.stats_completed)
            + (f", dropped {len(dropped)} leftovers ({', '.join(dropped)})" if dropped else "")
        )


def _completed(stats: int) -> str:
    return f", {stats} column stats completed" if stats else ""


_LIVE_FILES = """
    select count(*) from lake.ducklake_data_file as f
    join lake.ducklake_table as t using (table_id)
    join lake.ducklake_schema as s using (schema_id)
    where f.end_snapshot is null and t.end_snapshot is null and s.schema_name in ?
"""


# Per table, the live data files compaction would rewrite (more than this share of rows deleted)
# or merge (no deletes, small).
_COMPACTABLE_FILES = """
    select s.schema_name, t.table_name, count(*) as files
    from lake.ducklake_data_file as f
    join lake.ducklake_table as t using (table_id)
    join lake.ducklake_schema as s using (schema_id)
    left join lake.ducklake_delete_file as d
        on d.data_file_id = f.data_file_id and d.end_snapshot is null
    where f.end_snapshot is null and t.end_snapshot is null and s.end_snapshot is null
        and s.schema_name in ?
        and (d.delete_count > ? * f.record_count
            or (d.data_file_id is null and f.file_size_bytes < ?))
    group by all
    having count(*) >= ?
    order by files desc, s.schema_name, t.table_name
"""


def _metadata(sql: str) -> str:
    """A query over DuckLake's catalog tables, which an attached lake shows under this name."""
    return sql.replace("lake.ducklake_", "__ducklake_metadata_lake.ducklake_")


def _live_files(conn: duckdb.DuckDBPyConnection) -> int:
    row = conn.execute(_metadata(_LIVE_FILES), [list(SCHEMAS)]).fetchone()
    return int(row[0]) if row else 0


# The columns of the table's live files for which DuckLake recorded no min/max although they hold
# values: DuckLake (1.5.5) records none for a file when one of its row groups is all null in that
# column, then prunes the file from `where col = ...` once another file of the table has stats,
# and rows go missing from answers. Compaction makes such files: rewriting a few big files with
# deletes and many tiny ones (a pass's file of 1-30 customers) into one puts the tiny ones'
# rows in a last row group of their own, and when none of them has, say, an anonymous_id,
# `where anonymous_id = ...` found none of the file's 1.7M customers (10M bench lake, a --watch
# run; the marts' test ducklake_stats_complete failed every pass after).
_INCOMPLETE_STATS = """
    select t.table_id, c.column_id, c.column_name, c.column_type, f.data_file_id, f.path
    from lake.ducklake_data_file as f
    join lake.ducklake_table as t using (table_id)
    join lake.ducklake_schema as s using (schema_id)
    join lake.ducklake_file_column_stats as st on st.data_file_id = f.data_file_id
    join lake.ducklake_column as c on c.table_id = st.table_id and c.column_id = st.column_id
    where f.end_snapshot is null and t.end_snapshot is null and s.end_snapshot is null
        and c.end_snapshot is null and s.schema_name = ? and t.table_name = ?
        and st.min_value is null and st.value_count > 0
    order by c.column_id, f.data_file_id
"""

# How DuckLake writes a min/max of these types into its catalog (as DuckDB casts them to text in
# UTC; booleans as 0/1). Other types' stats are left to the data test to report.
_STATS_TEXT = {
    "varchar": "{}::varchar",
    "json": "{}::varchar",
    "boolean": "{}::integer::varchar",
    "int8": "{}::varchar",
    "int16": "{}::varchar",
    "int32": "{}::varchar",
    "int64": "{}::varchar",
    "timestamptz": "{}::varchar",
    "timestamp": "{}::varchar",
    "date": "{}::varchar",
}


def _min_max(
    conn: duckdb.DuckDBPyConnection, column: str, column_type: str, source: str, params: list
) -> tuple[str, str] | None:
    text = _STATS_TEXT[column_type]
    col = '"' + column.replace('"', '""') + '"'
    row = conn.execute(
        f"select {text.format(f'min({col})')}, {text.format(f'max({col})')} from {source}", params
    ).fetchone()
    return (str(row[0]), str(row[1])) if row and row[0] is not None else None


def _complete_stats(conn: duckdb.DuckDBPyConnection, schema: str, table: str) -> int:
    """Record the min/max DuckLake left out for the table's files (see _INCOMPLETE_STATS), read
    from the files themselves, and the table's min/max of those columns, read from the table
    (DuckLake plans from those too: with none it answered `where col = ...` with no rows at all).
    Returns how many (file, column) stats it completed."""
    missing = conn.execute(_metadata(_INCOMPLETE_STATS), [schema, table]).fetchall()
    if not missing:
        return 0
    conn.execute("set TimeZone = 'UTC'")
    files = [
        str(f)
        for (f,) in conn.execute(
            "select data_file from ducklake_list_files('lake', ?, schema => ?)", [table, schema]
        ).fetchall()
    ]
    whole = f'lake."{schema}"."{table}"'
    in_files, in_table = [], []
    for (table_id, column_id, column, column_type), rows in itertools.groupby(
        missing, key=lambda r: (r[0], r[1], str(r[2]), str(r[3]))
    ):
        if column_type not in _STATS_TEXT:
            continue
        for *_, file_id, name in rows:
            path = next((f for f in files if f.endswith("/" + str(name))), None)
            try:  # a file written before a rename has the column under its old name: left as is
                found = path and _min_max(conn, column, column_type, "read_parquet(?)", [path])
            except duckdb.BinderException:
                found = None
            if found:
                in_files.append((*found, file_id, column_id))
        found = _min_max(conn, column, column_type, whole, [])
        if found:
            in_table.append((*found, table_id, column_id))
    # Through the catalog DuckLake attached, not Python's sqlite3: a second SQLite library in
    # this process opening the file DuckDB's holds can truncate the WAL index DuckDB has mapped
    # (SIGBUS), since POSIX locks are per process and neither library sees the other's.
    conn.execute("begin")
    if in_files:
        conn.executemany(
            _metadata(
                "update lake.ducklake_file_column_stats set min_value = ?, max_value = ?"
                " where data_file_id = ? and column_id = ? and min_value is null"
            ),
            in_files,
        )
    if in_table:
        conn.executemany(
            _metadata(
                "update lake.ducklake_table_column_stats set min_value = ?, max_value = ?"
                " where table_id = ? and column_id = ?"
            ),
            in_table,
        )
    conn.execute("commit")
    return len(in_files)


@dataclass(frozen=True)
class Fold:
    """A table that passes append rows to, and the rule (a DuckDB table macro in its schema,
    defined once in dbt_project/macros/folds.sql) that combines its rows per `key`. With
    `candidate` (the column telling a key's rows apart), the rule picks one row per key:
    compaction deletes the others. Without, the rule merges a key's rows into one: compaction
    replaces them with it. `unread`: columns the rule does not read, left out of the rows it
    is given."""

    rule: str
    key: tuple[str, ...]
    candidate: str | None = None
    unread: tuple[str, ...] = ()


def declared_folds(paths: DataPaths) -> dict[tuple[str, str], Fold]:
    """The folds the dbt project declares (`meta.fold` of a model), by (schema, table), read from
    the manifest dbt wrote; none before dbt has parsed the project."""
    try:
        manifest = json.loads((paths.dbt_target / "manifest.json").read_text())
    except FileNotFoundError:
        return {}
    folds = {}
    for node in manifest.get("nodes", {}).values():
        fold = ((node.get("config") or {}).get("meta") or {}).get("fold")
        if node.get("resource_type") == "model" and fold:
            folds[(node["schema"], node["alias"])] = Fold(
                fold["rule"],
                tuple(fold["key"]),
                fold.get("candidate"),
                tuple(fold.get("unread", ())),
            )
    return folds


def _delete_matching(source: str, match: str) -> str:
    return f"delete from {source} as t where exists (select 1 from fold_out as o where {match})"


def fold_candidates(conn: duckdb.DuckDBPyConnection, schema: str, table: str, fold: Fold) -> int:
    """Fold the table by its rule; how many rows it deleted. Only the keys with more than one row
    are combined (found by a hash of the key: a collision only combines a key more), by the rule
    over their rows alone: a filter on the view does not reach below its window or grouping.
    None before the rule exists (a lake of an earlier version, before the pass that builds the
    views). At 10M messages, ranking every event object key took 9.5 s; finding the keys with
    more than one and ranking theirs, ~3 s after a +100k pass."""
    found = conn.execute(
        "select 1 from duckdb_functions() where database_name = 'lake'"
        " and schema_name = ? and function_name = ? and function_type = 'table_macro'",
        [schema, fold.rule],
    ).fetchone()
    if not found:
        return 0
    source = f"lake.{schema}.{table}"
    combined = f"select * from lake.{schema}.{fold.rule}('fold_rows')"
    key_hash = f"hash({', '.join(fold.key)})"
    conn.execute(
        f"create or replace temp table fold_keys as select {key_hash} as key_hash"
        f" from {source} group by key_hash having count(*) > 1"
    )
    try:
        keys = conn.execute("select count(*) from fold_keys").fetchone()
        if not keys or not keys[0]:
            return 0
        unread = f" exclude ({', '.join(fold.unread)})" if fold.unread else ""
        conn.execute(
            f"create or replace temp table fold_rows as select *{unread} from {source}"
            f" where {key_hash} in (select key_hash from fold_keys)"
        )
        if fold.candidate is not None:
            cols = ", ".join((*fold.key, fold.candidate))
            conn.execute(
                f"create or replace temp table fold_out as select {cols} from fold_rows"
                f" except select {cols} from ({combined})"
            )
            match = " and ".join(f"o.{c} = t.{c}" for c in (*fold.key, fold.candidate))
            row = conn.execute(_delete_matching(source, match)).fetchone()
            return int(row[0]) if row else 0
        conn.execute(f"create or replace temp table fold_out as {combined}")
        match = " and ".join(f"o.{c} = t.{c}" for c in fold.key)
        conn.execute("begin")
        try:
            row = conn.execute(_delete_matching(source, match)).fetchone()
            conn.execute(f"insert into {source} by name select * from fold_out")
            conn.execute("commit")
        except BaseException:
            conn.execute("rollback")
            raise
        deleted = int(row[0]) if row else 0
        inserted = conn.execute("select count(*) from fold_out").fetchone()
        return deleted - (int(inserted[0]) if inserted else 0)
    finally:
        for temp in ("fold_keys", "fold_rows", "fold_out"):
            conn.execute(f"drop table if exists {temp}")


def _compact_table(
    conn: duckdb.DuckDBPyConnection, schema: str, table: str, fold: Fold | None
) -> int:
    """Fold a table passes append to (its declared Fold), rewrite the table's files with deletes
    into new files, merge small ones, then complete the column stats DuckLake left out; returns
    how many (file, column) stats it completed."""
    if fold is not None:
        fold_candidates(conn, schema, table, fold)
    conn.execute(
        "call ducklake_rewrite_data_files('lake', ?, schema => ?, delete_threshold => ?)",
        [table, schema, REWRITE_DELETE_THRESHOLD],
    )
    conn.execute("call ducklake_merge_adjacent_files('lake', ?, schema => ?)", [table, schema])
    return _complete_stats(conn, schema, table)


def fragmented_tables(conn: duckdb.DuckDBPyConnection, at: int) -> list[tuple[str, str, int]]:
    """(schema, table, files) of each table with `at` or more files that compaction would
    rewrite or merge, most fragmented first."""
    rows = conn.execute(
        _metadata(_COMPACTABLE_FILES),
        [list(SCHEMAS), REWRITE_DELETE_THRESHOLD, SMALL_FILE_BYTES, max(at, 1)],
    ).fetchall()
    return [(str(schema), str(table), int(files)) for schema, table, files in rows]


def needs_compaction(paths: DataPaths, at: int | None = None) -> list[tuple[str, str, int]]:
    """The fragmented tables, read from the catalog without the build lock (for a sensor);
    none when compaction after passes is off (`compact_at_files` 0)."""
    at = get_settings().compact_at_files if at is None else at
    if at <= 0:
        return []
    conn = lake_connection(paths)
    try:
        return fragmented_tables(conn, at)
    finally:
        conn.close()


@dataclass(frozen=True)
class CompactionResult:
    tables: list[tuple[str, str, int]]  # (schema, table, compactable files before)
    files_before: int
    files_after: int
    seconds: float
    stats_completed: int = 0  # (file, column) min/max DuckLake left out (_complete_stats)

    @property
    def summary(self) -> str:
        if not self.tables:
            return "no table fragmented"
        names = ", ".join(f"{s}.{t} ({n})" for s, t, n in self.tables)
        return (
            f"compacted {names}: data files {self.files_before} -> {self.files_after}"
            + _completed(self.stats_completed)
            + f" in {self.seconds:.1f} s"
        )


def compact_fragmented(paths: DataPaths, at: int | None = None) -> CompactionResult:
    """Compact each table with `at` (default: settings' `compact_at_files`) or more compactable
    files. Checked again under the build lock: a compaction that ran meanwhile leaves nothing."""
    at = get_settings().compact_at_files if at is None else at
    started = time.perf_counter()
    if at <= 0:
        return CompactionResult([], 0, 0, 0.0)
    with build_lock(paths):
        conn = connect(paths)
        try:
            tables = fragmented_tables(conn, at)
            if not tables:
                return CompactionResult([], 0, 0, time.perf_counter() - started)
            before = _live_files(conn)
            folds = declared_folds(paths)
            completed = sum(_compact_table(conn, s, t, folds.get((s, t))) for s, t, _ in tables)
            after = _live_files(conn)
            seconds = time.perf_counter() - started
            return CompactionResult(tables, before, after, seconds, completed)
        finally:
            conn.close()


# The relations dbt renames through while it replaces a table; an interrupted build leaves them.
_LEFTOVER_SUFFIXES = ("__dbt_tmp", "__dbt_backup")


def _drop_leftovers(conn: duckdb.DuckDBPyConnection, tables: list[tuple[str, str]]) -> list[str]:
    """Drop what an interrupted dbt build left (`x__dbt_backup`, `x__dbt_tmp`): under the build
    lock no build is using them, and the next build would not drop them unless it replaced the
    table whole. Returns their names."""
    dropped = []
    for schema, table in tables:
        if table.endswith(_LEFTOVER_SUFFIXES):
            conn.execute(f'drop table lake."{schema}"."{table}"')
            dropped.append(f"{schema}.{table}")
    return dropped


def maintain(paths: DataPaths, retention: timedelta = SNAPSHOT_RETENTION) -> MaintenanceResult:
    with build_lock(paths):
        conn = connect(paths)
        try:
            before = _live_files(conn)
            tables = conn.execute(
                "select schema_name, table_name from duckdb_tables()"
                " where database_name = 'lake' and schema_name in ?",
                [list(SCHEMAS)],
            ).fetchall()
            dropped = _drop_leftovers(conn, tables)
            tables = [t for t in tables if f"{t[0]}.{t[1]}" not in dropped]
            folds = declared_folds(paths)
            completed = sum(
                _compact_table(conn, schema, table, folds.get((schema, table)))
                for schema, table in tables
            )
            after = _live_files(conn)
            cutoff = f"now() - interval '{int(retention.total_seconds())} seconds'"
            expired = conn.execute(
                f"call ducklake_expire_snapshots('lake', older_than => {cutoff})"
            ).fetchall()
            deleted = conn.execute(
                f"call ducklake_cleanup_old_files('lake', older_than => {cutoff})"
            ).fetchall()
            return MaintenanceResult(
                before, after, len(expired), len(deleted), completed, tuple(dropped)
            )
        finally:
            conn.close()
