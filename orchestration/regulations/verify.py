"""The proof after a Delete: the subject's identifiers are searched for in every text column of
every table of the lake, in every landing file's values, in every value of the other SQLite
files, in the bytes of every other file of the data dir, and in the decoded text of the local
mailbox's messages. What is found is the evidence's `rowsRemaining` and `bytesFound` (0 when the
Delete holds).

An identifier is found as a whole value: a text value equal to it, or a JSON string of it (in
quotes) inside a text, JSON or nested value, or, in other files' bytes, not next to a letter or
digit. So the Delete of userId `12` is not failed by userId `123` (substrings would be).
"""

from __future__ import annotations

import functools
import json
import mmap
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import duckdb

from mallard import landing, mailbox
from mallard.distributed import storage
from mallard.paths import DataPaths
from mallard.warehouse import files_connection
from orchestration.context import DBT_DIR
from orchestration.regulations.subjects import lake_tables

# Folders of a dbt project that dbt writes (when run there), not the project's source.
_DBT_OUTPUT = {"target", "logs", "dbt_packages"}
# Column types whose values can hold an identifier as text.
_TEXT_TYPES = ("VARCHAR", "JSON")


def _re2_literal(s: str) -> str:
    return "\\Q" + s.replace("\\E", "\\E\\\\E\\Q") + "\\E"


def re2_pattern(strings: Iterable[str]) -> str:
    """An RE2 pattern (DuckDB's regexp) matching any of the strings literally."""
    return "|".join(_re2_literal(s) for s in sorted(set(strings), key=len, reverse=True))


def _texty(dtype: str) -> bool:
    return dtype in _TEXT_TYPES or "STRUCT" in dtype or dtype.endswith("[]") or "MAP" in dtype


def json_token_pattern(strings: Iterable[str]) -> str:
    """An RE2 pattern matching any of the strings as a JSON string (quoted, escaped)."""
    return re2_pattern(json.dumps(s) for s in strings)


def _found_sql(column: str, dtype: str) -> str:
    """A condition: the column's value is one of $s, or holds one as a JSON string ($q)."""
    col = '"' + column.replace('"', '""') + '"'
    if dtype == "VARCHAR":
        return f"({col} in (select unnest($s)) or regexp_matches({col}, $q))"
    if dtype == "JSON":
        return f"regexp_matches(cast({col} as varchar), $q)"
    return f"regexp_matches(cast(to_json({col}) as varchar), $q)"


def rows_remaining(conn: duckdb.DuckDBPyConnection, strings: list[str]) -> dict[str, int]:
    """Per lake table (every base table, every text, JSON or nested column), the rows naming
    any of the strings; only tables with such rows. Read in one transaction, so one snapshot:
    a pass committing meanwhile (dbt makes and drops `__dbt_backup` tables) changes nothing
    of what was listed."""
    if not strings:
        return {}
    params = {"s": strings, "q": json_token_pattern(strings)}
    found: dict[str, int] = {}
    conn.execute("begin transaction")
    try:
        for (schema, table), columns in lake_tables(conn).items():
            text = [_found_sql(c, t) for c, t in columns.items() if _texty(t)]
            if not text:
                continue
            row = conn.execute(
                f'select count(*) from lake."{schema}"."{table}" where {" or ".join(text)}',
                params,
            ).fetchone()
            if row and row[0]:
                found[f"{schema}.{table}"] = int(row[0])
    finally:
        conn.execute("rollback")
    return found


def landing_rows_remaining(paths: DataPaths, strings: list[str]) -> dict[str, int]:
    """Per landing file (local or on S3), the rows any of whose text columns name any of the
    strings."""
    names = {landing.url(paths, f.name): f.name for f in landing.listing(paths)}
    if not names or not strings:
        return {}
    files = list(names)
    conn = files_connection(paths)
    try:
        cols = [
            r[0]
            for r in conn.execute(
                "select name from parquet_schema($f) where type = 'BYTE_ARRAY'", {"f": files[0]}
            ).fetchall()
        ]
        cond = " or ".join(_found_sql(c, "VARCHAR") for c in cols) or "false"
        rows = conn.execute(
            f"select filename, count(*) from read_parquet($files, filename = true,"
            f" union_by_name = true) where {cond} group by filename",
            {"files": files, "s": strings, "q": json_token_pattern(strings)},
        ).fetchall()
    finally:
        conn.close()
    return {_landing_key(paths, names[f]): int(n) for f, n in rows}


def _landing_key(paths: DataPaths, name: str) -> str:
    local = landing.local_path(paths, name)
    return str(local.relative_to(paths.root)) if local else storage().landing_url + name


def _like_literal(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def catalog_rows_remaining(strings: list[str]) -> dict[str, int]:
    """With the lake's catalog on PostgreSQL: per catalog table, the rows any of whose text
    values is one of the strings or holds one as a JSON string (column stats, inlined rows)."""
    if not strings or not storage().on_postgres:
        return {}
    tokens = [json.dumps(s) for s in strings]
    conn = storage().catalog_connect()
    found: dict[str, int] = {}
    try:
        with conn.cursor() as cur:
            cur.execute(
                "select table_schema, table_name, column_name from information_schema.columns"
                " where table_name like 'ducklake%'"
                " and data_type in ('text', 'character varying', 'json', 'jsonb')"
            )
            columns: dict[tuple[str, str], list[str]] = {}
            for schema, table, column in cur.fetchall():
                columns.setdefault((schema, table), []).append(column)
            for (schema, table), cols in columns.items():
                cond = " or ".join(
                    f'("{c}"::text = any(%(s)s) or "{c}"::text like any(%(q)s))' for c in cols
                )
                cur.execute(
                    f'select count(*) from "{schema}"."{table}" where {cond}',
                    {"s": strings, "q": [f"%{_like_literal(t)}%" for t in tokens]},
                )
                n = cur.fetchone()[0]
                if n:
                    found[f"catalog.{table}"] = int(n)
    finally:
        conn.close()
    return found


def bytes_found(
    paths: DataPaths,
    strings: list[str],
    skip: Iterable[Path] = (),
    only: Iterable[Path] | None = None,
) -> dict[str, int]:
    """Per file of the data dir (dot files, write-ahead and temp files included; Parquet files
    are searched by their values, see rows_remaining and landing_rows_remaining; a mailbox
    message's also decoded; the DuckDB extensions are binaries of the install), how many times
    the strings occur in its bytes; `only`: just these files."""
    if not strings:
        return {}
    pattern = token_pattern(strings)
    # What dbt writes from the project (target, docs site, logs) holds the project's own text,
    # its unit tests' fixture rows among it: an identifier the project's source holds (a user
    # `u1` of a fixture) is not searched there, every other one is.
    dbt_dir = paths.dbt_target.parent
    not_in_project = [s for s in strings if not _in_project(s)]
    dbt_pattern = token_pattern(not_in_project) if not_in_project else None
    skipped = {p.resolve() for p in skip}
    found: dict[str, int] = {}
    for path in sorted(paths.root.rglob("*") if only is None else only):
        if (
            not path.is_file()
            or path.is_symlink()
            or path.suffix == ".parquet"
            or paths.extensions_dir in path.parents
            or path.resolve() in skipped
        ):
            continue
        if dbt_dir in path.parents:
            n = _count_in_file(path, dbt_pattern) if dbt_pattern else 0
        else:
            # A SQLite file's values are read (adjacent values run together in its pages), and
            # its bytes searched too (free pages).
            n = (_sqlite_values(path, strings) or 0) if _is_sqlite(path) else 0
            n += _count_in_message(path, pattern) if _is_message(path) else 0
            n += _count_in_file(path, pattern)
        if n:
            found[str(path.relative_to(paths.root))] = n
    return found


def token_pattern(strings: Iterable[str]) -> re.Pattern[bytes]:
    """Any of the strings, not next to a letter or digit (the Delete's purges of the mailbox and
    of the outbox's files match by it too: they remove what this search would find)."""
    alternatives = b"|".join(
        re.escape(s.encode()) for s in sorted(set(strings), key=len, reverse=True)
    )
    return re.compile(b"(?<![A-Za-z0-9])(?:" + alternatives + b")(?![A-Za-z0-9])")


@functools.cache
def _in_project(string: str) -> bool:
    """Whether a source file of the dbt project (models, tests, macros, seeds, its YAML) holds
    the string as a token (asked once a process: a Delete searches twice)."""
    pattern = token_pattern([string])
    return any(
        _count_in_file(f, pattern)
        for f in DBT_DIR.rglob("*")
        if f.is_file() and not _DBT_OUTPUT & set(f.relative_to(DBT_DIR).parts)
    )


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


_SQLITE_SCAN = """
import json, re, sqlite3, sys
strings = set(json.loads(sys.stdin.read()))
tokens = re.compile("|".join(re.escape(json.dumps(s)) for s in strings))
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=60)
found = 0
tables = [r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")]
for t in tables:
    for row in conn.execute(f'select * from "{t}"'):
        for v in row:
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            if isinstance(v, str) and (v in strings or tokens.search(v)):
                found += 1
print(found)
"""


def _is_message(path: Path) -> bool:
    """A mailbox message: stored (`.eml`) or being written (`.<name>.eml.tmp`)."""
    return path.name.endswith((".eml", ".eml.tmp"))


def _count_in_message(path: Path, pattern: re.Pattern[bytes]) -> int:
    """How many times the strings occur in a message decoded (mallard.mailbox.readable): a
    base64 or quoted-printable body hides them from a search of its bytes."""
    try:
        return sum(1 for _ in pattern.finditer(mailbox.readable(path.read_bytes())))
    except FileNotFoundError:  # removed meanwhile
        return 0


def _sqlite_values(path: Path, strings: list[str]) -> int | None:
    """How many values of a SQLite file's tables are, or hold as JSON strings, the strings;
    None when it cannot be read as a database. In a process of its own: see
    purge.compact_catalog."""
    out = subprocess.run(
        [sys.executable, "-c", _SQLITE_SCAN, str(path)],
        input=json.dumps(strings),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode:
        return None
    return int(out.stdout.strip() or 0)


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
