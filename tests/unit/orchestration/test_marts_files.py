"""The marts' Parquet files are written the way the read API reads them fast: small row groups
and a codec that decompresses quickly (orchestration/warehouse.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.warehouse import MARTS_ROW_GROUP_ROWS, ensure_warehouse


def _files(paths: DataPaths, schema: str, table: str) -> list[str]:
    conn = connect(paths)
    try:
        rows = conn.execute(
            "select data_file from ducklake_list_files('lake', ?, schema => ?)", [table, schema]
        ).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]


def test_marts_files_use_small_lz4_row_groups_and_other_schemas_the_defaults(
    tmp_path: Path,
) -> None:
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    conn = connect(paths)
    try:
        for schema in ("marts", "intermediate"):
            conn.execute(
                f"create table lake.{schema}.t as"
                " select i, repeat('x', 50) || i::varchar as s from range(10000) r(i)"
            )
    finally:
        conn.close()

    (marts,) = _files(paths, "marts", "t")
    meta = pq.ParquetFile(marts).metadata
    assert meta.num_row_groups == -(-10000 // MARTS_ROW_GROUP_ROWS)
    assert {meta.row_group(0).column(c).compression for c in range(2)} == {"LZ4"}

    (other,) = _files(paths, "intermediate", "t")
    meta = pq.ParquetFile(other).metadata
    assert meta.num_row_groups == 1
    assert meta.row_group(0).column(1).compression == "SNAPPY"
