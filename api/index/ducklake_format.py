"""What the read index knows of DuckLake's files and catalog, pinned to the DuckLake it was
written against (DUCKLAKE_EXTENSION, CATALOG_FORMAT).

The index reads a table's rows from its Parquet files, not through DuckLake's scan. That rests
on facts of the format that no DuckLake API promises, all of them used here and nowhere else:

- `ducklake_list_files` gives a table's data files at a snapshot, each with its delete file
  (NULL when none of its rows is deleted) and the bytes of both. DuckLake never rewrites a file.
- A delete file is Parquet with columns file_path and pos: the position of a deleted row in its
  data file (file_row_number, which deletes leave as it is). A data file's newest delete file
  lists all its deleted positions; once several snapshots deleted from the data file, its rows
  also name the snapshot of each delete (SNAPSHOT_COLUMN), and it stands for the earlier
  snapshots too (the older delete file leaves the catalog).
- A file holding rows of several snapshots (a flush of rows inlined in the catalog, a merge)
  names the snapshot of each row in SNAPSHOT_COLUMN; a file of one snapshot has no such column.
- Rows and deletes inlined in the catalog are in no file: a table's scan names the data file of
  each row it finds (`filename`), which shows rows found elsewhere.
- Snapshot ids grow by one per commit, and `snapshots()` lists each commit's changes by kind,
  naming the tables changed by id (by name for tables_created).

tests/unit/api/test_ducklake_format.py checks each of these on a real lake, and fails when a
DuckLake upgrade changes one. At run time `mismatch` compares the installed extension and the
lake's catalog format with the pinned ones: when either differs, the API answers from SQL.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from typing import Any, Protocol

import duckdb
import numpy as np
import pyarrow.parquet as pq

from api.marts import SCHEMA, at
from mallard.warehouse import LAKE

# The duckdb-extension-ducklake wheel and the `version` its catalogs record in ducklake_metadata.
DUCKLAKE_EXTENSION = "1.5.5"
CATALOG_FORMAT = "1.0"
METADATA = f"__ducklake_metadata_{LAKE}"  # the catalog's own tables, as DuckLake attaches them

# DuckLake gives each row of a file holding rows of several snapshots (a delete file of deletes
# made by several snapshots, a flush of rows inlined in the catalog, a merge of files) the
# snapshot it was written or deleted in, in this column.
SNAPSHOT_COLUMN = "_ducklake_internal_snapshot_id"

# The kinds of DuckLake snapshot changes that name the tables they changed (ids; names for
# tables_created). Any other kind (a schema change, compaction) lists the files again.
TABLE_CHANGES = frozenset(
    {
        "tables_created",
        "tables_dropped",
        "tables_inserted_into",
        "tables_deleted_from",
        "inlined_insert",
        "inlined_delete",
    }
)


class Query(Protocol):
    """A read of the lake's catalog or tables (the API's, with its retries)."""

    def __call__(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]: ...


@dataclass(frozen=True)
class Files:
    """The Parquet files that hold all of a table's rows at one snapshot: each data file, its
    DuckLake delete file (None if no row of it is deleted), and how many of its rows are live
    (DuckLake's own count, which the index must reproduce from the files)."""

    paths: tuple[str, ...]
    deletes: tuple[str | None, ...]
    rows: tuple[int, ...]
    # The snapshot to read the files as of when some of them also hold rows or deletes of
    # later snapshots; None when they hold nothing else, so the key is shared by snapshots.
    upto: int | None = None


def mismatch(query: Query) -> str | None:
    """Why this module's knowledge may not hold for the lake: another DuckLake extension or
    catalog format than the pinned ones (None when both are the pinned ones)."""
    try:
        extension: str | None = importlib.metadata.version("duckdb-extension-ducklake")
    except importlib.metadata.PackageNotFoundError:
        extension = None
    if extension != DUCKLAKE_EXTENSION:
        return f"DuckLake extension {extension}, not {DUCKLAKE_EXTENSION}"
    rows = query(f"select value from {METADATA}.ducklake_metadata where key = 'version'")
    catalog = str(rows[0][0]) if rows else None
    if catalog != CATALOG_FORMAT:
        return f"DuckLake catalog format {catalog}, not {CATALOG_FORMAT}"
    return None


def current_snapshot(query: Query) -> int:
    """The id of the lake's newest committed snapshot (0 before the first)."""
    rows = query(f"select id from {LAKE}.current_snapshot()")
    return int(rows[0][0]) if rows else 0


@functools.lru_cache(maxsize=65536)
def newest_snapshot(path: str) -> int | None:
    """The newest snapshot a row of a data or delete file belongs to, when the file records it
    (None otherwise: all its rows belong to the snapshot that added the file). Read from the
    Parquet footer's statistics, once per file: DuckLake files are never rewritten."""
    meta = pq.read_metadata(path)
    names = meta.schema.names
    if SNAPSHOT_COLUMN not in names:
        return None
    col = names.index(SNAPSHOT_COLUMN)
    newest = 0
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            return 2**63 - 1  # unknown: newer than any snapshot
        newest = max(newest, int(stats.max))
    return newest


def table_files(query: Query, table: str, version: int) -> tuple[Files, int] | str:
    """A mart's files at a version and their bytes, or why the index cannot read its rows
    from them ("" when it has no files: no table yet)."""
    listed = sorted(
        query(
            "select data_file, data_file_size_bytes, delete_file, delete_file_size_bytes"
            f" from ducklake_list_files('{LAKE}', '{table}', schema => '{SCHEMA}',"
            f" snapshot_version => {version})"
        )
    )
    if not listed:
        return ""
    paths = tuple(str(r[0]) for r in listed)
    deletes = tuple(None if r[2] is None else str(r[2]) for r in listed)
    # DuckLake's own scan of the table, per data file: rows it finds anywhere else are
    # inlined in the catalog (small inserts), and a file with fewer live rows than the
    # index will find in it has deletes inlined there (small deletes, which no delete
    # file lists; Index checks this count when it is built).
    live = {
        str(f): int(n)
        for f, n in query(f"select filename, count(*) from {at(table, version)} group by filename")
    }
    if not live.keys() <= set(paths):
        return "has rows outside its data files (inlined in the catalog)"
    if any(d is not None and not d.endswith(".parquet") for d in deletes):
        return "has delete files that are not Parquet"
    try:
        # A file of rows of several snapshots (the delete file of a data file that several
        # snapshots deleted from, a flush of inlined rows) may also hold rows or deletes of
        # snapshots after this one, which the index must not see.
        later = any(
            (newest_snapshot(f) or 0) > version
            for f in paths + tuple(d for d in deletes if d is not None)
        )
    except (OSError, ValueError) as e:
        return f"has a file that cannot be read ({e})"
    size = sum(int(r[1]) + int(r[3] or 0) for r in listed)
    rows = tuple(live.get(p, 0) for p in paths)
    return Files(paths, deletes, rows, version if later else None), size


def unchanged(query: Query, tables: tuple[str, ...], base: int, version: int) -> bool:
    """Whether none of the snapshots after base, up to version, changed these marts (a change
    of another kind than TABLE_CHANGES counts as one). One query of DuckLake's list of snapshot
    changes (~10 ms)."""
    marks = ", ".join("?" * len(tables))
    served = {
        str(r[0])
        for r in query(
            f"select t.table_id from {METADATA}.ducklake_table as t"
            f" join {METADATA}.ducklake_schema as s using (schema_id)"
            f" where s.schema_name = '{SCHEMA}' and t.table_name in ({marks})"
            " and t.begin_snapshot <= ? and (t.end_snapshot is null or t.end_snapshot > ?)",
            [*tables, base, base],
        )
    }
    names = {f"{SCHEMA}.{t}" for t in tables}
    changes = query(
        f"select changes from {LAKE}.snapshots() where snapshot_id > ? and snapshot_id <= ?",
        [base, version],
    )
    if len(served) != len(tables) or len(changes) != version - base:
        return False
    for (change,) in changes:
        for kind, values in (change or {}).items():
            touched = names if kind == "tables_created" else served
            if kind not in TABLE_CHANGES or touched & {str(v) for v in values or []}:
                return False
    return True


def can_update(old: Files, new: Files) -> bool:
    """Whether an index of the old files can be updated to the new ones: every data file kept
    keeps a delete file once it had one, and no file holds rows of later snapshots."""
    if old.upto is not None or new.upto is not None:
        return False
    now = dict(zip(new.paths, new.deletes, strict=True))
    return all(
        now[p] is not None
        for p, d in zip(old.paths, old.deletes, strict=True)
        if p in now and d is not None
    )


def deleted_rows(
    conn: duckdb.DuckDBPyConnection, owners: list[int], deletes: list[str]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The rows that delete files list, as (owner, position in its data file) arrays: owners[i]
    stands for the data file of deletes[i]. Only for files of no later snapshot (can_update)."""
    gone = conn.execute(
        "select (?::bigint[])[file_index::integer + 1] as f, pos"
        " from read_parquet(?, union_by_name = true)",
        [owners, deletes],
    ).fetchnumpy()
    return gone["f"], gone["pos"]


def as_of(paths: list[str], upto: int | None) -> tuple[str, str]:
    """read_parquet options and a condition keeping the rows of the files up to snapshot upto."""
    if upto is None or all(newest_snapshot(p) is None for p in paths):
        return "", "true"
    # Files of one snapshot have no snapshot column: by name, it reads as NULL for them.
    return ", union_by_name = true", f"coalesce({SNAPSHOT_COLUMN}, 0) <= {int(upto)}"


def live_rows(files: Files) -> tuple[str, list[Any]]:
    """A FROM item (SQL and its parameters) for the live rows of the files, each with its
    location: `file`, its data file's place in files.paths, and `row`, its row in that file."""
    paths = list(files.paths)
    opts, cond = as_of(paths, files.upto)
    # file_index is a file's place in the list read_parquet is given (a third of the cost of
    # looking its filename up in that list, per row).
    sql = (
        "(select *, file_index::integer as file, file_row_number as row"
        f" from read_parquet(?, file_row_number = true{opts}) where {cond})"
    )
    params: list[Any] = [paths]
    owners = [i for i, d in enumerate(files.deletes) if d is not None]
    deletes = [d for d in files.deletes if d is not None]
    if deletes:
        # A DuckLake delete file is Parquet with columns file_path (the data file), pos (a
        # deleted row's position in it) and, when it holds deletes of several snapshots,
        # SNAPSHOT_COLUMN. The data file is known from the catalog, not from file_path: that is
        # the data file's path as first written, which a lake moved to another directory would
        # no longer match.
        opts, cond = as_of(deletes, files.upto)
        sql = (
            f"(select * from {sql} as d anti join"
            " (select (?::integer[])[file_index::integer + 1] as file, pos as row"
            f" from read_parquet(?{opts}) where {cond}) as x"
            " on d.file = x.file and d.row = x.row)"
        )
        params += [owners, deletes]
    return sql, params
