"""The lake's SQLite catalog runs in WAL mode, so readers never block the pipeline's commits."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mallard.paths import DataPaths
from orchestration.warehouse import ensure_warehouse


def test_catalog_is_in_wal_mode(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    ensure_warehouse(paths)  # idempotent
    db = sqlite3.connect(paths.lake_catalog)
    try:
        assert db.execute("pragma journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()
