"""Column min/max statistics DuckLake leaves out of its catalog, completed from the files."""

from __future__ import annotations

import itertools

import duckdb


def metadata_sql(sql: str) -> str:
    """A query over DuckLake's catalog tables, which an attached lake shows under this name."""
    return sql.replace("lake.ducklake_", "__ducklake_metadata_lake.ducklake_")


# The columns of the table's live files for which DuckLake recorded no min/max although they hold
# values: DuckLake (1.5.5) records none for a file when one of its row groups is all null in that
# column, then prunes the file from `where col = ...` once another file of the table has stats,
# and rows go missing from answers. Compaction makes such files: rewriting a few big files with
# deletes and many tiny ones (a pass's file of 1-30 customers) into one puts the tiny ones'
# rows in a last row group of their own, and when none of them has, say, an anonymous_id,
# `where anonymous_id = ...` found none of the file's 1.7M customers (10M bench lake, a --watch
# run; the marts' test ducklake_stats_complete failed every pass after).
_INCOMPLETE_STATS = """
    select t.table_id, c.column_id, c.column_name, c.column_type, f.data_file_id, f.path
    from lake.ducklake_data_file as f
    join lake.ducklake_table as t using (table_id)
    join lake.ducklake_schema as s using (schema_id)
    join lake.ducklake_file_column_stats as st on st.data_file_id = f.data_file_id
    join lake.ducklake_column as c on c.table_id = st.table_id and c.column_id = st.column_id
    where f.end_snapshot is null and t.end_snapshot is null and s.end_snapshot is null
        and c.end_snapshot is null and s.schema_name = ? and t.table_name = ?
        and st.min_value is null and st.value_count > 0
    order by c.column_id, f.data_file_id
"""

# How DuckLake writes a min/max of these types into its catalog (as DuckDB casts them to text in
# UTC; booleans as 0/1). Other types' stats are left to the data test to report.
_STATS_TEXT = {
    "varchar": "{}::varchar",
    "json": "{}::varchar",
    "boolean": "{}::integer::varchar",
    "int8": "{}::varchar",
    "int16": "{}::varchar",
    "int32": "{}::varchar",
    "int64": "{}::varchar",
    "timestamptz": "{}::varchar",
    "timestamp": "{}::varchar",
    "date": "{}::varchar",
}


def _min_max(
    conn: duckdb.DuckDBPyConnection, column: str, column_type: str, source: str, params: list
) -> tuple[str, str] | None:
    text = _STATS_TEXT[column_type]
    col = '"' + column.replace('"', '""') + '"'
    row = conn.execute(
        f"select {text.format(f'min({col})')}, {text.format(f'max({col})')} from {source}", params
    ).fetchone()
    return (str(row[0]), str(row[1])) if row and row[0] is not None else None


def complete_stats(conn: duckdb.DuckDBPyConnection, schema: str, table: str) -> int:
    """Record the min/max DuckLake left out for the table's files (see _INCOMPLETE_STATS), read
    from the files themselves, and the table's min/max of those columns, read from the table
    (DuckLake plans from those too: with none it answered `where col = ...` with no rows at all).
    Returns how many (file, column) stats it completed."""
    missing = conn.execute(metadata_sql(_INCOMPLETE_STATS), [schema, table]).fetchall()
    if not missing:
        return 0
    conn.execute("set TimeZone = 'UTC'")
    files = [
        str(f)
        for (f,) in conn.execute(
            "select data_file from ducklake_list_files('lake', ?, schema => ?)", [table, schema]
        ).fetchall()
    ]
    whole = f'lake."{schema}"."{table}"'
    in_files, in_table = [], []
    for (table_id, column_id, column, column_type), rows in itertools.groupby(
        missing, key=lambda r: (r[0], r[1], str(r[2]), str(r[3]))
    ):
        if column_type not in _STATS_TEXT:
            continue
        for *_, file_id, name in rows:
            path = next((f for f in files if f.endswith("/" + str(name))), None)
            try:  # a file written before a rename has the column under its old name: left as is
                found = path and _min_max(conn, column, column_type, "read_parquet(?)", [path])
            except duckdb.BinderException:
                found = None
            if found:
                in_files.append((*found, file_id, column_id))
        found = _min_max(conn, column, column_type, whole, [])
        if found:
            in_table.append((*found, table_id, column_id))
    # Through the catalog DuckLake attached, not Python's sqlite3: a second SQLite library in
    # this process opening the file DuckDB's holds can truncate the WAL index DuckDB has mapped
    # (SIGBUS), since POSIX locks are per process and neither library sees the other's.
    conn.execute("begin")
    if in_files:
        conn.executemany(
            metadata_sql(
                "update lake.ducklake_file_column_stats set min_value = ?, max_value = ?"
                " where data_file_id = ? and column_id = ? and min_value is null"
            ),
            in_files,
        )
    if in_table:
        conn.executemany(
            metadata_sql(
                "update lake.ducklake_table_column_stats set min_value = ?, max_value = ?"
                " where table_id = ? and column_id = ?"
            ),
            in_table,
        )
    conn.execute("commit")
    return len(in_files)
