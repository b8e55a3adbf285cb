"""The proof after a Delete: the subject's identifiers are searched for in every text column of
every table of the lake, in every landing file's values, and in the bytes of every other file
of the data dir. What is found is the evidence's `rowsRemaining` and `bytesFound` (0 when the
Delete holds)."""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterable
from pathlib import Path

import duckdb

from mallard.paths import DataPaths
from orchestration.regulations.subjects import lake_tables

# Column types whose values can hold an identifier as text.
_TEXT_TYPES = ("VARCHAR", "JSON")


def _re2_literal(s: str) -> str:
    return "\\Q" + s.replace("\\E", "\\E\\\\E\\Q") + "\\E"


def re2_pattern(strings: Iterable[str]) -> str:
    """An RE2 pattern (DuckDB's regexp) matching any of the strings literally."""
    return "|".join(_re2_literal(s) for s in sorted(set(strings), key=len, reverse=True))


def _texty(dtype: str) -> bool:
    return dtype in _TEXT_TYPES or "STRUCT" in dtype or dtype.endswith("[]") or "MAP" in dtype


def rows_remaining(conn: duckdb.DuckDBPyConnection, strings: list[str]) -> dict[str, int]:
    """Per lake table (every base table, every text, JSON or nested column), the rows naming
    any of the strings; only tables with such rows."""
    if not strings:
        return {}
    pattern = re2_pattern(strings)
    found: dict[str, int] = {}
    for (schema, table), columns in lake_tables(conn).items():
        text = [c for c, t in columns.items() if _texty(t)]
        if not text:
            continue
        cond = " or ".join(
            f"""regexp_matches(cast("{c.replace('"', '""')}" as varchar), $p)""" for c in text
        )
        row = conn.execute(
            f'select count(*) from lake."{schema}"."{table}" where {cond}', {"p": pattern}
        ).fetchone()
        if row and row[0]:
            found[f"{schema}.{table}"] = int(row[0])
    return found


def landing_rows_remaining(paths: DataPaths, strings: list[str]) -> dict[str, int]:
    """Per landing file, the rows any of whose text columns name any of the strings."""
    files = [str(p) for p in paths.landing_dir.glob("date=*/*.parquet")]
    if not files or not strings:
        return {}
    conn = duckdb.connect(":memory:")
    try:
        cols = [
            r[0]
            for r in conn.execute(
                "select name from parquet_schema($f) where type = 'BYTE_ARRAY'", {"f": files[0]}
            ).fetchall()
        ]
        cond = " or ".join(f'regexp_matches("{c}", $p)' for c in cols) or "false"
        rows = conn.execute(
            f"select filename, count(*) from read_parquet($files, filename = true,"
            f" union_by_name = true) where {cond} group by filename",
            {"files": files, "p": re2_pattern(strings)},
        ).fetchall()
    finally:
        conn.close()
    return {str(Path(f).relative_to(paths.root)): int(n) for f, n in rows}


def bytes_found(paths: DataPaths, strings: list[str], skip: Iterable[Path] = ()) -> dict[str, int]:
    """Per file of the data dir (dot files, write-ahead and temp files included; Parquet files
    are searched by their values, see rows_remaining and landing_rows_remaining; the DuckDB
    extensions are binaries of the install), how many times the strings occur in its bytes."""
    if not strings:
        return {}
    pattern = re.compile(
        b"|".join(re.escape(s.encode()) for s in sorted(set(strings), key=len, reverse=True))
    )
    skipped = {p.resolve() for p in skip}
    found: dict[str, int] = {}
    for path in sorted(paths.root.rglob("*")):
        if (
            not path.is_file()
            or path.is_symlink()
            or path.suffix == ".parquet"
            or paths.extensions_dir in path.parents
            or path.resolve() in skipped
        ):
            continue
        n = _count_in_file(path, pattern)
        if n:
            found[str(path.relative_to(paths.root))] = n
    return found


def _count_in_file(path: Path, pattern: re.Pattern[bytes]) -> int:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if not size:
                return 0
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return sum(1 for _ in pattern.finditer(m))
    except (FileNotFoundError, ValueError):  # removed meanwhile, or emptied
        return 0
