"""Keys as the index stores them: DuckDB's hash and lower(), computed at lookup time."""

from __future__ import annotations

import threading

import duckdb


class Hasher:
    """DuckDB's own hash and lower(), so build-time (vectorized) and lookup-time keys agree."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = duckdb.connect()
        return cur

    def many(self, account_id: str, values: list[str]) -> list[int]:
        """One query for many keys: a query costs ~0.4 ms, most of it outside DuckDB."""
        rows = (
            self._cursor()
            .execute(
                "select hash(?, v) from unnest(?::varchar[]) with ordinality as t(v, i) order by i",
                [account_id, values],
            )
            .fetchall()
        )
        return [int(r[0]) for r in rows]

    def lower(self, value: str) -> str:
        row = self._cursor().execute("select lower(?)", [value]).fetchone()
        return str(row[0]) if row else value


hasher = Hasher()
