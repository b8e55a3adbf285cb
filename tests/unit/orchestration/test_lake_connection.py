"""The orchestrator's own DuckDB per process (orchestration.warehouse.lake_connection): its
connections see what other processes commit, and a catalog made again at the same path is not
served from the old one."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mallard.paths import DataPaths
from orchestration.warehouse import lake_connection

INSERT_LEDGER_ROW = """
import sys
from pathlib import Path
from mallard.paths import DataPaths
from mallard.warehouse import connect
conn = connect(DataPaths(Path(sys.argv[1])))
conn.execute("insert into lake.raw.landing_files values (?, 1, now())", [sys.argv[2]])
conn.close()
"""


def ledger(paths: DataPaths) -> set[str]:
    conn = lake_connection(paths)
    try:
        return {
            r[0] for r in conn.execute("select landing_file from lake.raw.landing_files").fetchall()
        }
    finally:
        conn.close()


def commit_from_another_process(paths: DataPaths, name: str) -> None:
    subprocess.run(
        [sys.executable, "-c", INSERT_LEDGER_ROW, str(paths.root), name], check=True, timeout=120
    )


def test_connections_see_commits_of_other_processes(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    assert ledger(paths) == set()  # made the warehouse, and this process's DuckDB
    commit_from_another_process(paths, "a.parquet")
    assert ledger(paths) == {"a.parquet"}
    commit_from_another_process(paths, "b.parquet")
    assert ledger(paths) == {"a.parquet", "b.parquet"}


def test_a_catalog_made_again_is_not_read_through_the_old_one(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    assert ledger(paths) == set()
    commit_from_another_process(paths, "old.parquet")
    assert ledger(paths) == {"old.parquet"}
    shutil.rmtree(paths.lake_dir)  # the lake (catalog and files) removed
    assert ledger(paths) == set()  # a new, empty warehouse, not the deleted one


MAKE_READY = """
import sys
from pathlib import Path
from mallard.paths import DataPaths
from orchestration.warehouse import ensure_warehouse
ensure_warehouse(DataPaths(Path(sys.argv[1])))
"""


def make_ready_in_another_process(paths: DataPaths) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", MAKE_READY, str(paths.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_process_starts_while_another_commits(tmp_path: Path) -> None:
    """A pass starting while another process holds the catalog's write lock (a regulation's
    pass committing): a ready catalog needs no write, and one missing an option waits for
    the lock instead of failing with "database is locked"."""
    paths = DataPaths(tmp_path)
    assert ledger(paths) == set()  # made ready by this process
    catalog = sqlite3.connect(paths.lake_catalog, isolation_level=None, check_same_thread=False)
    try:
        catalog.execute("begin immediate")
        out = make_ready_in_another_process(paths)
        assert out.returncode == 0, out.stderr
        catalog.execute("rollback")

        catalog.execute("delete from ducklake_metadata where key = 'data_inlining_row_limit'")
        catalog.execute("begin immediate")
        release = threading.Timer(1.5, lambda: catalog.execute("rollback"))
        release.start()
        out = make_ready_in_another_process(paths)
        release.join()
        assert out.returncode == 0, out.stderr
        keys = [r[0] for r in catalog.execute("select key from ducklake_metadata")]
        assert keys.count("data_inlining_row_limit") >= 1
    finally:
        catalog.close()


def test_retry_if_locked_tries_again_only_while_the_catalog_is_locked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import duckdb

    from orchestration import warehouse

    monkeypatch.setattr(warehouse.time, "sleep", lambda s: None)
    calls: list[int] = []

    def locked_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise duckdb.TransactionException(
                "Failed to commit DuckLake transaction: database is locked"
            )
        return "loaded"

    assert warehouse.retry_if_locked(locked_twice) == "loaded"
    assert len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise duckdb.CatalogException("no such table")

    calls.clear()
    with pytest.raises(duckdb.CatalogException):
        warehouse.retry_if_locked(broken)
    assert len(calls) == 1  # any other error is not tried again
