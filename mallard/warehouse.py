"""DuckDB connections to the DuckLake warehouse, with extensions loaded from site-packages only."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
from collections.abc import Iterable
from pathlib import Path

import duckdb

from mallard.distributed import storage
from mallard.offline import DUCKDB_OFFLINE
from mallard.paths import DataPaths

LAKE = "lake"  # the alias every process attaches the warehouse under
# (extension name DuckDB looks for, the wheel that ships it, the file inside that wheel)
_EXTENSIONS = (
    ("ducklake", "duckdb_extension_ducklake", "ducklake"),
    ("sqlite_scanner", "duckdb_extension_sqlite", "sqlite"),
    ("httpfs", "duckdb_extension_httpfs", "httpfs"),
    # A DuckLake catalog on PostgreSQL (`ducklake:postgres:...`, mallard/distributed.py).
    ("postgres_scanner", "duckdb_extension_postgres_scanner", "postgres_scanner"),
)


def _platform_dir() -> str:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[machine]
    system = "osx" if platform.system() == "Darwin" else "linux"
    return f"{system}_{arch}"


def _wheel_file(module: str, filename: str) -> Path:
    """The extension file a duckdb-extension-* wheel ships for this DuckDB."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"missing wheel {module}: run `make install`")
    src = Path(next(iter(spec.submodule_search_locations))) / "extensions"
    return src / f"v{duckdb.__version__}" / f"{filename}.duckdb_extension"


def ensure_extensions(paths: DataPaths) -> Path:
    """Lay out the wheel-shipped extensions as a DuckDB extension directory (symlinks).

    DuckDB then autoloads them by name, and nothing is ever installed from the network.
    """
    version = duckdb.__version__
    target = paths.extensions_dir / f"v{version}" / _platform_dir()
    target.mkdir(parents=True, exist_ok=True)
    for name, module, filename in _EXTENSIONS:
        link = target / f"{name}.duckdb_extension"
        if link.exists():
            continue
        src_file = _wheel_file(module, filename)
        tmp = link.with_suffix(f".tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(src_file)
        os.replace(tmp, link)
    return paths.extensions_dir


def duckdb_config(paths: DataPaths) -> dict[str, str | bool | int | float | list[str]]:
    """Connection settings shared by every process, dbt's profile included."""
    return {
        "extension_directory": str(ensure_extensions(paths)),
        **DUCKDB_OFFLINE,
    }


def lake_catalog_uri(paths: DataPaths) -> str:
    """What follows `ducklake:` in the attach: the data dir's SQLite catalog, or the one
    MALLARD_LAKE_CATALOG names (PostgreSQL, mallard/distributed.py)."""
    return storage().catalog or f"sqlite:{paths.lake_catalog}"


def lake_data_path(paths: DataPaths) -> str:
    """Where the lake's data files go: the data dir's, or MALLARD_LAKE_DATA_URL (S3)."""
    return storage().data_url or f"{paths.lake_data}/"


def lake_attach_sql(paths: DataPaths, read_only: bool = False) -> str:
    opts = [f"DATA_PATH '{lake_data_path(paths)}'"]
    if read_only:
        opts.append("READ_ONLY")
    uri = lake_catalog_uri(paths).replace("'", "''")
    return f"ATTACH IF NOT EXISTS 'ducklake:{uri}' AS {LAKE} ({', '.join(opts)})"


def file_reader() -> duckdb.DuckDBPyConnection:
    """A DuckDB that reads the lake's Parquet files by their paths (the API's read index): a
    plain one, or on an S3 lake one with httpfs loaded from its wheel and the S3 secret."""
    where = storage()
    if not where.data_url:
        return duckdb.connect()
    conn = duckdb.connect(config=dict(DUCKDB_OFFLINE))
    conn.load_extension(str(_wheel_file("duckdb_extension_httpfs", "httpfs")))
    conn.execute(where.s3_secret_sql())
    return conn


def files_connection(paths: DataPaths) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB without the lake, for reading files: landing files on S3 too."""
    conn = duckdb.connect(":memory:", config=duckdb_config(paths))
    if (where := storage()).uses_s3:
        conn.execute(where.s3_secret_sql())
    return conn


def connect(paths: DataPaths, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the warehouse attached as `lake`.

    Many processes may hold one at once: the API and analysts read committed snapshots
    while the pipeline writes.
    """
    where = storage()
    if not where.data_url:
        paths.lake_data.mkdir(parents=True, exist_ok=True)
    conn = duckdb.connect(":memory:", config=duckdb_config(paths))
    if where.uses_s3:
        conn.execute(where.s3_secret_sql())
    conn.execute(lake_attach_sql(paths, read_only=read_only))
    return conn


# A list of strings as one query parameter: `x in (select unnest({STRINGS}))` with
# `strings(values)` bound to it. DuckDB converts a Python list parameter element by element
# (87 ms for 1,000 ids, against 1.5 ms for the same ids as one JSON text).
STRINGS = "from_json(?, '[\"VARCHAR\"]')"


def strings(values: Iterable[str]) -> str:
    return json.dumps(list(values))
