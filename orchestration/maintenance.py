"""Warehouse maintenance: rewrite the files incremental passes riddled with deletes, merge small
files, expire old snapshots and delete the files nothing refers to any more.

Every incremental pass deletes the changed customers' rows (DuckLake writes delete files) and
inserts their new rows (a new small file per table). Left alone, reads slow down with every pass
and the lake only grows. Runs under the build lock, so never during a dbt build.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.locks import build_lock

# Snapshots are kept this long: time travel for analysts, and scrollIds, which pin the snapshot
# of their first page (an older scroll is told to start again).
SNAPSHOT_RETENTION = timedelta(days=1)
# A data file is rewritten once this share of its rows is deleted.
REWRITE_DELETE_THRESHOLD = 0.2
# The schemas dbt rewrites in place; raw only grows by whole landing files.
SCHEMAS = ("intermediate", "marts")


@dataclass(frozen=True)
class MaintenanceResult:
    files_before: int
    files_after: int
    snapshots_expired: int
    files_deleted: int

    @property
    def summary(self) -> str:
        return (
            f"data files {self.files_before} -> {self.files_after}, "
            f"{self.snapshots_expired} snapshots expired, {self.files_deleted} files deleted"
        )


_LIVE_FILES = """
    select count(*) from lake.ducklake_data_file as f
    join lake.ducklake_table as t using (table_id)
    join lake.ducklake_schema as s using (schema_id)
    where f.end_snapshot is null and t.end_snapshot is null and s.schema_name in ?
"""


def maintain(paths: DataPaths, retention: timedelta = SNAPSHOT_RETENTION) -> MaintenanceResult:
    with build_lock(paths):
        conn = connect(paths)
        try:
            meta = "__ducklake_metadata_lake"

            def live_files() -> int:
                row = conn.execute(
                    _LIVE_FILES.replace("lake.ducklake_", f"{meta}.ducklake_"), [list(SCHEMAS)]
                ).fetchone()
                return int(row[0]) if row else 0

            before = live_files()
            tables = conn.execute(
                "select schema_name, table_name from duckdb_tables()"
                " where database_name = 'lake' and schema_name in ?",
                [list(SCHEMAS)],
            ).fetchall()
            for schema, table in tables:
                conn.execute(
                    "call ducklake_rewrite_data_files('lake', ?, schema => ?,"
                    " delete_threshold => ?)",
                    [table, schema, REWRITE_DELETE_THRESHOLD],
                )
                conn.execute(
                    "call ducklake_merge_adjacent_files('lake', ?, schema => ?)", [table, schema]
                )
            after = live_files()
            cutoff = f"now() - interval '{int(retention.total_seconds())} seconds'"
            expired = conn.execute(
                f"call ducklake_expire_snapshots('lake', older_than => {cutoff})"
            ).fetchall()
            deleted = conn.execute(
                f"call ducklake_cleanup_old_files('lake', older_than => {cutoff})"
            ).fetchall()
            return MaintenanceResult(before, after, len(expired), len(deleted))
        finally:
            conn.close()
