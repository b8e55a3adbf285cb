"""Warehouse maintenance: rewrite the files incremental passes riddled with deletes, merge small
files, expire old snapshots and delete the files nothing refers to any more.

Every incremental pass deletes the changed customers' rows (DuckLake writes delete files) and
inserts their new rows (a new small file per table). Left alone, reads slow down with every pass
and the lake only grows. Two entry points, both in the lake writer's turn, so never during a
dbt build:

- `compact_fragmented`, after passes: only the tables with `compact_at_files` or more files that
  compaction would rewrite or merge. Passes slow down with fragmentation (at 10M messages, ~17
  files a table made a pass ~40% slower than after compaction), and at a pass a minute a day's
  passes would leave over a thousand files a table, so this follows the files, not the clock.
  It compacts in slices (`compact_slice_s`): most fragmented table first, no new table once the
  slice has run out, the rest left to the next pass. The served marts wait while the one writer
  compacts, and served passes fragment their tables together: all of them at once took 117 s
  at 10M on a slow host, which a served pass and every read waiting on it sat behind.
- `maintain`, nightly: every table, then snapshot expiry and file cleanup.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

import duckdb

from mallard.paths import DataPaths
from mallard.settings import get_settings
from mallard.warehouse import connect
from orchestration.column_stats import complete_stats, metadata_sql
from orchestration.folds import Fold, declared_folds, fold_candidates
from orchestration.locks import lake_writer
from orchestration.warehouse import lake_connection

# Snapshots are kept this long: time travel for analysts, and scrollIds, which pin the snapshot
# of their first page (an older scroll is told to start again).
SNAPSHOT_RETENTION = timedelta(days=1)
# A data file is rewritten once more than this share of its rows is deleted. Low, because a pass's
# delete reads the delete file of every data file it touches and writes it again with the new
# positions, and a pass changes customers in every file: what it pays grows with the deleted rows
# the files carry (at 10M messages, one delete took ~1.2 s with a big file 28% deleted, ~0.3 s
# once that file was rewritten). A higher threshold (0.2) left half the files of each
# per-customer table with their deletes, and passes slower by a quarter.
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


def _live_files(conn: duckdb.DuckDBPyConnection) -> int:
    row = conn.execute(metadata_sql(_LIVE_FILES), [list(SCHEMAS)]).fetchone()
    return int(row[0]) if row else 0


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
    return complete_stats(conn, schema, table)


def fragmented_tables(conn: duckdb.DuckDBPyConnection, at: int) -> list[tuple[str, str, int]]:
    """(schema, table, files) of each table with `at` or more files that compaction would
    rewrite or merge, most fragmented first."""
    rows = conn.execute(
        metadata_sql(_COMPACTABLE_FILES),
        [list(SCHEMAS), REWRITE_DELETE_THRESHOLD, SMALL_FILE_BYTES, max(at, 1)],
    ).fetchall()
    return [(str(schema), str(table), int(files)) for schema, table, files in rows]


def needs_compaction(paths: DataPaths, at: int | None = None) -> list[tuple[str, str, int]]:
    """The fragmented tables, read from the catalog without the writer's turn (for a sensor);
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
    left: list[tuple[str, str, int]] = field(default_factory=list)  # for the next slice

    @property
    def summary(self) -> str:
        if not self.tables:
            return "no table fragmented"
        names = ", ".join(f"{s}.{t} ({n})" for s, t, n in self.tables)
        return (
            f"compacted {names}: data files {self.files_before} -> {self.files_after}"
            + _completed(self.stats_completed)
            + f" in {self.seconds:.1f} s"
            + (f"; {len(self.left)} left for the next pass" if self.left else "")
        )


def compact_fragmented(
    paths: DataPaths, at: int | None = None, slice_s: float | None = None
) -> CompactionResult:
    """Compact the tables with `at` (default: settings' `compact_at_files`) or more compactable
    files, most fragmented first, starting no table once `slice_s` (default: settings'
    `compact_slice_s`; 0: no limit) has passed: at least one table a call, the others left
    for the next. Checked again in the writer's turn: a compaction that ran meanwhile leaves
    nothing."""
    settings = get_settings()
    at = settings.compact_at_files if at is None else at
    slice_s = settings.compact_slice_s if slice_s is None else slice_s
    started = time.perf_counter()
    if at <= 0:
        return CompactionResult([], 0, 0, 0.0)
    with lake_writer(paths, "compaction"):
        conn = connect(paths)
        try:
            tables = fragmented_tables(conn, at)
            if not tables:
                return CompactionResult([], 0, 0, time.perf_counter() - started)
            before = _live_files(conn)
            folds = declared_folds(paths)
            done: list[tuple[str, str, int]] = []
            completed = 0
            for schema, table, files in tables:
                if done and slice_s > 0 and time.perf_counter() - started >= slice_s:
                    break
                completed += _compact_table(conn, schema, table, folds.get((schema, table)))
                done.append((schema, table, files))
            after = _live_files(conn)
            seconds = time.perf_counter() - started
            return CompactionResult(done, before, after, seconds, completed, tables[len(done) :])
        finally:
            conn.close()


# The relations dbt renames through while it replaces a table; an interrupted build leaves them.
_LEFTOVER_SUFFIXES = ("__dbt_tmp", "__dbt_backup")


def _drop_leftovers(conn: duckdb.DuckDBPyConnection, tables: list[tuple[str, str]]) -> list[str]:
    """Drop what an interrupted dbt build left (`x__dbt_backup`, `x__dbt_tmp`): in the writer's
    turn no build is using them, and the next build would not drop them unless it replaced the
    table whole. Returns their names."""
    dropped = []
    for schema, table in tables:
        if table.endswith(_LEFTOVER_SUFFIXES):
            conn.execute(f'drop table lake."{schema}"."{table}"')
            dropped.append(f"{schema}.{table}")
    return dropped


def maintain(paths: DataPaths, retention: timedelta = SNAPSHOT_RETENTION) -> MaintenanceResult:
    with lake_writer(paths, "maintenance"):
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
