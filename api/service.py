"""Reads for the API from the warehouse's marts, each request on one committed snapshot.

Every request first reads the DuckLake snapshot id, then runs all its queries `AT (VERSION =>
v)`: an answer never mixes two builds, and a scrollId pins the snapshot its first page saw.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb

from api.params import EventQuery
from mallard.errors import InvalidRequest, Unavailable
from mallard.paths import DataPaths
from mallard.warehouse import connect

FRESHNESS_HEADERS = ("x-mallard-data-through", "x-mallard-built-at", "x-mallard-snapshot")


@dataclass(frozen=True)
class Snapshot:
    version: int
    built_at: datetime | None
    data_through: datetime | None


def iso(t: datetime | None) -> str:
    return t.isoformat().replace("+00:00", "Z") if t else ""


def freshness_headers(snap: Snapshot) -> dict[str, str]:
    """How fresh an answer is: the newest receipt its data reflects, when it was built, and the
    warehouse snapshot it was read from (empty times before the first pipeline run)."""
    through, built, version = FRESHNESS_HEADERS
    return {through: iso(snap.data_through), built: iso(snap.built_at), version: str(snap.version)}


def _missing_table(e: duckdb.Error) -> bool:
    # Before the first pipeline run the marts do not exist yet: that is "no data", not a failure.
    return isinstance(e, duckdb.CatalogException) and "does not exist" in str(e)


class Warehouse:
    def __init__(self, paths: DataPaths) -> None:
        self.paths = paths
        self._conn: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._fresh: dict[int, Snapshot] = {}
        self.latest: Snapshot | None = None  # the newest snapshot a request has read

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        # DuckDB connections are not thread-safe: one cursor per worker thread.
        cur = getattr(self._local, "cur", None)
        if cur is None:
            with self._lock:
                if self._conn is None:
                    self._conn = connect(self.paths, read_only=True)
                cur = self._conn.cursor()
            self._local.cur = cur
        return cur

    def _query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
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
        raise Unavailable("the warehouse is busy; retry")

    def snapshot(self, version: int | None = None) -> Snapshot:
        """The current committed snapshot, or a given one (a scroll's), with its freshness."""
        if version is None:
            rows = self._query("select id from lake.current_snapshot()")
            version = int(rows[0][0]) if rows else 0
            latest = True
        else:
            latest = False
        snap = self._fresh.get(version)
        if snap is None:
            fresh = self._query(
                f"select built_at, data_through from lake.marts.freshness AT (VERSION => {version})"
            )
            snap = Snapshot(version, *(fresh[0] if fresh else (None, None)))
            if len(self._fresh) > 1000:
                self._fresh.clear()
            self._fresh[version] = snap
        if latest:
            self.latest = snap
        return snap

    # --- events ----------------------------------------------------------------------------

    def events(
        self,
        snap: Snapshot,
        account_id: str,
        brand_id: str,
        q: EventQuery,
        customer_ids: list[str] | None = None,
    ) -> list[str]:
        where = ["account_id = ?", "brand_id = ?"]
        params: list[Any] = [account_id, brand_id]
        if customer_ids is not None:
            if not customer_ids:
                return []
            where.append("customer_id in (select unnest(?))")
            params.append(customer_ids)
        if q.include:
            where.append("event_action = ?")
            params.append(q.include)
        if q.exclude:
            where.append("event_action not in (select unnest(?))")
            params.append(list(q.exclude))
        if q.start:
            where.append("event_time > ?")
            params.append(q.start)
        if q.end:
            where.append("event_time < ?")
            params.append(q.end)
        order = "desc" if q.sort == "desc" else "asc"
        rows = self._query(
            f"select record from lake.marts.events AT (VERSION => {snap.version})"
            f" where {' and '.join(where)}"
            f" order by event_time {order}, event_id {order} limit ? offset ?",
            [*params, q.size, q.offset],
        )
        return [r[0] for r in rows]

    # --- customers -------------------------------------------------------------------------

    def customers_by(
        self, snap: Snapshot, account_id: str, id_type: str, value: str, column: str
    ) -> list[tuple[str, str]]:
        """(customer_id, traits|metadata JSON) of the customers an idType:id names."""
        key = {"userId": "user_id = ?", "id": "customer_id = ?", "email": "email_lower = lower(?)"}[
            id_type
        ]
        col = {"traits": "traits", "metadata": "metadata", "id": "null"}[column]
        rows = self._query(
            f"select customer_id, {col} from lake.marts.customers AT (VERSION => {snap.version})"
            f" where account_id = ? and {key} order by customer_id",
            [account_id, value],
        )
        return [(r[0], r[1]) for r in rows]

    def customer_page(
        self, snap: Snapshot, account_id: str, after: str | None, offset: int, size: int
    ) -> list[tuple[str, str]]:
        rows = self._query(
            f"select customer_id, traits from lake.marts.customers AT (VERSION => {snap.version})"
            " where account_id = ? and customer_id > ? order by customer_id limit ? offset ?",
            [account_id, after or "", size, offset],
        )
        return [(r[0], r[1]) for r in rows]

    def identifiers(self, snap: Snapshot, customer_ids: list[str]) -> list[tuple[Any, ...]]:
        return self._query(
            "select customer_id, id_type, id_value, first_seen, last_seen"
            f" from lake.marts.customer_identifiers AT (VERSION => {snap.version})"
            " where customer_id in (select unnest(?)) order by id_type, first_seen, id_value",
            [customer_ids],
        )
