"""The API's connection to the lake: a read-only cursor per thread, retries while the catalog is
busy, and memory_only(), inside which any I/O raises WouldBlock instead."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import duckdb

from mallard.errors import InvalidRequest, Unavailable
from mallard.paths import DataPaths
from mallard.warehouse import connect


class WouldBlock(Exception):
    """Raised, inside Warehouse.memory_only(), where an answer would need I/O."""


def _missing_table(e: duckdb.Error) -> bool:
    # Before the first pipeline run the marts do not exist yet: that is "no data", not a failure.
    return isinstance(e, duckdb.CatalogException) and "does not exist" in str(e)


class Lake:
    """Reads of the lake for one Warehouse, from any of its threads."""

    def __init__(self, paths: DataPaths) -> None:
        self.paths = paths
        self._conn: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._epoch = 0  # counts close(): a thread's cursor is of one connection

    def close(self) -> None:
        with self._lock:
            self._epoch += 1
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        # DuckDB connections are not thread-safe: one cursor per worker thread.
        cur = getattr(self._local, "cur", None)
        if cur is None or self._local.epoch != self._epoch:
            with self._lock:
                if self._conn is None:
                    self._conn = connect(self.paths, read_only=True)
                cur = self._conn.cursor()
                self._local.epoch = self._epoch
            self._local.cur = cur
        return cur

    @contextlib.contextmanager
    def memory_only(self) -> Iterator[None]:
        """Within: raise WouldBlock instead of querying the lake or building an index, so a
        handler can answer on the event loop when everything it needs is in memory (a traits
        lookup: ~60 us), and go to a worker thread only when not."""
        self._local.memory_only = True
        try:
            yield
        finally:
            self._local.memory_only = False

    def _unless_memory_only(self) -> None:
        """Called before any I/O: inside memory_only(), raises WouldBlock instead."""
        if getattr(self._local, "memory_only", False):
            raise WouldBlock

    def _query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        self._unless_memory_only()
        # The SQLite catalog may be briefly busy while the pipeline commits: retry, then 503.
        for attempt in range(5):
            try:
                return self._cursor().execute(sql, params or []).fetchall()
            except duckdb.Error as e:
                msg = str(e)
                if _missing_table(e):
                    return []
                if "No snapshot found" in msg:
                    raise InvalidRequest(
                        "scrollId refers to data that has since been cleaned up; start again"
                    ) from None
                if "locked" in msg or "busy" in msg:
                    time.sleep(0.01 * 2**attempt)
                    continue
                raise
        # Retry-After 1, as the collector's 503s: a client is told when to ask again.
        raise Unavailable("the warehouse is busy; retry", headers={"Retry-After": "1"})
