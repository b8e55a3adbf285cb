"""The orchestrator's own DuckDB per process (orchestration.warehouse.lake_connection): its
connections see what other processes commit, and a catalog made again at the same path is not
served from the old one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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
