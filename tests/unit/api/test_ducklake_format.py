"""The contract between the read index and DuckLake's files: every fact api/index/ducklake_format.py
states of the format, checked on a real lake written by the pinned extension. A DuckLake upgrade
that changes one fails here (bump DUCKLAKE_EXTENSION / CATALOG_FORMAT only once all pass).

Table `t` takes its inserts and deletes as files (no inlining), a data file deleted from by two
snapshots among them; table `mixed` takes small changes inlined in the catalog, then flushed.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest

from api.index.ducklake_format import (
    CATALOG_FORMAT,
    DUCKLAKE_EXTENSION,
    METADATA,
    SNAPSHOT_COLUMN,
    TABLE_CHANGES,
    Files,
    current_snapshot,
    deleted_rows,
    live_rows,
    mismatch,
    newest_snapshot,
    table_files,
    unchanged,
)
from mallard.paths import DataPaths
from mallard.warehouse import connect


@dataclass
class Lake:
    conn: duckdb.DuckDBPyConnection
    v: dict[str, int]  # the snapshot each step of the fixture committed

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params or []).fetchall()

    def files(self, table: str, version: int) -> Files:
        found = table_files(self.query, table, version)
        assert not isinstance(found, str), found
        return found[0]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    conn = connect(DataPaths(Path(tmp_path_factory.mktemp("format"))))
    lake = Lake(conn, {})

    def step(name: str, sql: str) -> None:
        conn.execute(sql)
        lake.v[name] = current_snapshot(lake.query)

    conn.execute("create schema lake.marts")
    step("created", "create table lake.marts.t (i bigint, s varchar)")
    conn.execute(
        "call lake.set_option('data_inlining_row_limit', 0, schema => 'marts', table_name => 't')"
    )
    step("inserted", "insert into lake.marts.t select i, 'r' || i from range(100) t(i)")
    step("deleted", "delete from lake.marts.t where i % 10 = 0")
    step("added", "insert into lake.marts.t select i, 'r' || i from range(100, 150) t(i)")
    step("elsewhere", "create table lake.main.other as select 1 as x")
    step("deleted_again", "delete from lake.marts.t where i % 10 = 5")
    # Small changes of `mixed` stay in the catalog (DuckLake's default inlining).
    step("mixed", "create table lake.marts.mixed as select i from range(100) t(i)")
    step("mixed_deleted", "delete from lake.marts.mixed where i = 5")
    step("mixed_inserted", "insert into lake.marts.mixed values (1000), (1001)")
    yield lake
    conn.close()


def scan(lake: Lake, table: str, version: int) -> list[tuple[Any, ...]]:
    return sorted(lake.query(f"select * from lake.marts.{table} AT (VERSION => {version})"))


def read_live(lake: Lake, files: Files, columns: str = "*") -> list[tuple[Any, ...]]:
    sql, params = live_rows(files)
    return sorted(lake.conn.execute(f"select {columns} from {sql}", params).fetchall())


def test_the_pinned_versions_are_the_installed_ones(lake: Lake) -> None:
    assert importlib.metadata.version("duckdb-extension-ducklake") == DUCKLAKE_EXTENSION
    catalog = lake.query(f"select value from {METADATA}.ducklake_metadata where key = 'version'")
    assert catalog == [(CATALOG_FORMAT,)]
    assert mismatch(lake.query) is None


def test_snapshot_ids_grow_by_one_per_commit(lake: Lake) -> None:
    ids = [r[0] for r in lake.query("select snapshot_id from lake.snapshots() order by 1")]
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    assert current_snapshot(lake.query) == ids[-1]
    v = lake.v
    assert [v["inserted"] + k for k in range(1, 5)] == [
        v[s] for s in ("deleted", "added", "elsewhere", "deleted_again")
    ]


def test_snapshot_changes_name_the_tables_they_changed(lake: Lake) -> None:
    v = lake.v
    (table_id,) = lake.query(
        f"select table_id from {METADATA}.ducklake_table where table_name = 't'"
        " and end_snapshot is null"
    )[0]
    changes = dict(lake.query("select snapshot_id, changes from lake.snapshots()"))
    assert changes[v["created"]] == {"tables_created": ["marts.t"]}
    assert changes[v["inserted"]] == {"tables_inserted_into": [str(table_id)]}
    assert changes[v["deleted"]] == {"tables_deleted_from": [str(table_id)]}
    assert set(changes[v["mixed_deleted"]]) == {"inlined_delete"}
    assert set(changes[v["mixed_inserted"]]) == {"inlined_insert"}
    assert all(set(changes[s]) <= TABLE_CHANGES for s in v.values())
    assert unchanged(lake.query, ("t",), v["added"], v["elsewhere"])
    assert not unchanged(lake.query, ("t",), v["added"], v["deleted_again"])
    assert not unchanged(lake.query, ("t",), v["deleted"], v["elsewhere"])
    assert not unchanged(lake.query, ("t", "nope"), v["added"], v["elsewhere"])


def test_listed_files_are_the_tables_files_with_their_sizes(lake: Lake) -> None:
    v = lake.v
    for version in (v["inserted"], v["deleted"], v["added"], v["deleted_again"]):
        found = table_files(lake.query, "t", version)
        assert not isinstance(found, str)
        files, size = found
        on_disk = files.paths + tuple(d for d in files.deletes if d is not None)
        assert all(p.endswith(".parquet") for p in on_disk)
        assert size == sum(os.path.getsize(p) for p in on_disk)
        # The scan names each row's data file: its counts are the files' live rows.
        counts = dict(
            lake.query(
                f"select filename, count(*) from lake.marts.t AT (VERSION => {version})"
                " group by filename"
            )
        )
        assert files.rows == tuple(counts.get(p, 0) for p in files.paths)
    first, last = lake.files("t", v["inserted"]), lake.files("t", v["deleted_again"])
    assert first.deletes == (None,) and set(first.paths) < set(last.paths)  # never rewritten
    assert newest_snapshot(first.paths[0]) is None  # a file of one snapshot


def test_delete_files_list_positions_and_their_snapshots(lake: Lake) -> None:
    v = lake.v
    files = lake.files("t", v["deleted_again"])
    (old,) = lake.files("t", v["inserted"]).paths
    new = next(p for p in files.paths if p != old)
    old_delete, new_delete = (files.deletes[files.paths.index(p)] for p in (old, new))
    assert old_delete is not None and new_delete is not None

    def positions(data_file: str, condition: str) -> set[int]:
        return {
            int(r[0])
            for r in lake.query(
                f"select file_row_number from read_parquet(?, file_row_number = true)"
                f" where {condition}",
                [data_file],
            )
        }

    # Deleted by two snapshots: the newest delete file lists both, each with its snapshot.
    listed = lake.query(
        f"select file_path, pos, {SNAPSHOT_COLUMN} from read_parquet(?)", [old_delete]
    )
    assert {r[0] for r in listed} == {old}
    assert {(int(r[1]), int(r[2])) for r in listed} == {
        (p, v["deleted"]) for p in positions(old, "i % 10 = 0")
    } | {(p, v["deleted_again"]) for p in positions(old, "i % 10 = 5")}
    assert newest_snapshot(old_delete) == v["deleted_again"]
    # It stands for the earlier snapshot too: listed there, to be read as of it.
    earlier = lake.files("t", v["deleted"])
    assert earlier.deletes == (old_delete,) and earlier.upto == v["deleted"]
    assert files.upto is None
    # Deleted by one snapshot: positions only, no snapshot column.
    columns = [r[0] for r in lake.query("select name from parquet_schema(?)", [new_delete])]
    assert SNAPSHOT_COLUMN not in columns and {"file_path", "pos"} <= set(columns)
    assert newest_snapshot(new_delete) is None
    owner, pos = deleted_rows(lake.conn, [7], [new_delete])
    assert set(owner.tolist()) == {7}
    assert set(pos.tolist()) == positions(new, "i % 10 = 5")


def test_live_rows_of_the_files_are_ducklakes_rows_at_every_snapshot(lake: Lake) -> None:
    for name in ("inserted", "deleted", "added", "elsewhere", "deleted_again"):
        version = lake.v[name]
        files = lake.files("t", version)
        assert read_live(lake, files, "i, s") == scan(lake, "t", version), name


def test_inlined_changes_are_in_no_file_until_flushed(lake: Lake) -> None:
    v = lake.v
    # An inlined delete: the scan's count of the file is below the rows its files hold.
    files = lake.files("mixed", v["mixed_deleted"])
    assert files.rows == (99,) and files.deletes == (None,)
    assert len(read_live(lake, files)) == 100
    found = table_files(lake.query, "mixed", v["mixed_inserted"])
    assert found == "has rows outside its data files (inlined in the catalog)"
    lake.conn.execute("call ducklake_flush_inlined_data('lake')")
    flushed = current_snapshot(lake.query)
    changes = lake.query("select changes from lake.snapshots() where snapshot_id = ?", [flushed])
    assert not set(changes[0][0]) <= TABLE_CHANGES  # a flush lists the files again
    # The flush wrote files of rows (and deletes) of several snapshots, each row's in a column.
    files = lake.files("mixed", v["mixed_inserted"])
    written = [p for p in files.paths + files.deletes if p is not None and newest_snapshot(p)]
    assert {newest_snapshot(p) for p in written} == {v["mixed_deleted"], v["mixed_inserted"]}
    for name in ("mixed", "mixed_deleted", "mixed_inserted"):
        version = v[name]
        assert read_live(lake, lake.files("mixed", version), "i") == scan(lake, "mixed", version), (
            name
        )
    assert lake.files("mixed", v["mixed_deleted"]).deletes != (None,)
