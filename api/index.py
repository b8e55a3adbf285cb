"""In-memory indexes over one build of the customers and events marts, for fast reads.

A DuckLake read costs catalog round trips, Parquet footers and the decoding of whole row
groups: ~50 ms for a point lookup and seconds for a newest-first page over 10M events
(measured; DESIGN.md 8). An index holds, per row, a key hash and a position (a few bytes), the
traits of each customer, and the location of each event record in the lake's Parquet data
files; an answer is then a binary search plus the read of one small row group.

DuckLake never rewrites a file: an incremental run inserts rows in new data files and deletes
rows by writing, per data file, a new delete file listing the positions of all its deleted
rows. Once several snapshots deleted from a data file, its delete file also names the snapshot
of each delete, and stands for the earlier snapshots too (the older delete file leaves the
catalog). An index holds the rows of the data files that their delete files leave, as of one
snapshot, and is keyed by those files, not by snapshot: a pipeline commits many snapshots, and
the index stays valid for every snapshot whose data and delete files are the same.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from api.params import EventQuery

_KEY = {"userId": "user_id", "id": "customer_id", "email": "email_lower"}


@dataclass(frozen=True)
class Files:
    """The Parquet files that hold all of a table's rows at one snapshot: each data file, its
    DuckLake delete file (None if no row of it is deleted), and how many of its rows are live
    (DuckLake's own count, which the index must reproduce from the files)."""

    paths: tuple[str, ...]
    deletes: tuple[str | None, ...]
    rows: tuple[int, ...]
    # The snapshot to read the files as of when some of them also hold rows or deletes of
    # later snapshots; None when they hold nothing else, so the key is shared by snapshots.
    upto: int | None = None


# DuckLake gives each row of a file holding rows of several snapshots (a delete file of deletes
# made by several snapshots, a flush of rows inlined in the catalog, a merge of files) the
# snapshot it was written or deleted in, in this column.
_SNAPSHOT_COLUMN = "_ducklake_internal_snapshot_id"


@functools.lru_cache(maxsize=65536)
def newest_snapshot(path: str) -> int | None:
    """The newest snapshot a row of a data or delete file belongs to, when the file records it
    (None otherwise: all its rows belong to the snapshot that added the file). Read from the
    Parquet footer's statistics, once per file: DuckLake files are never rewritten."""
    meta = pq.read_metadata(path)
    names = meta.schema.names
    if _SNAPSHOT_COLUMN not in names:
        return None
    col = names.index(_SNAPSHOT_COLUMN)
    newest = 0
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            return 2**63 - 1  # unknown: newer than any snapshot
        newest = max(newest, int(stats.max))
    return newest


def _us(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


class _Hasher:
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


_hash = _Hasher()


class _HashIndex:
    """Rows by a 64-bit hash of their key: sorted hashes plus the row of each."""

    def __init__(self, hashes: np.ndarray[Any, Any]) -> None:
        # Not a stable sort (twice as fast): the rows of one hash are sorted where they are used.
        order = np.argsort(hashes)
        self.hashes = hashes[order]
        self.rows = order.astype(np.int64)

    def rows_of(self, h: int) -> np.ndarray[Any, Any]:
        key = self.hashes.dtype.type(h)
        lo = int(np.searchsorted(self.hashes, key, "left"))
        hi = int(np.searchsorted(self.hashes, key, "right"))
        return self.rows[lo:hi]


class _KeyIndex:
    """Rows by (account, key): the non-null keys sorted by Arrow's C++ kernels, which release
    the GIL (a Python loop over a million keys held it for seconds, stalling the requests the
    server answers while it builds). A lookup is a binary search over ~20 keys.

    Arrow and Python order strings alike: Arrow by their UTF-8 bytes, Python by code points."""

    def __init__(self, account: pa.Array, values: pa.Array) -> None:
        valid = np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
        keys = pa.table({"a": account.take(valid), "v": values.take(valid)})
        order = pc.sort_indices(keys, sort_keys=[("a", "ascending"), ("v", "ascending")])
        self.rows = valid[order.to_numpy()]
        self.values = values.take(self.rows)
        codes = account.take(self.rows).dictionary_encode()
        runs = codes.indices.to_numpy(zero_copy_only=False)
        bounds = [0, *(np.flatnonzero(np.diff(runs)) + 1).tolist(), len(runs)]
        self.accounts = {
            str(codes.dictionary[int(runs[lo])].as_py()): (lo, hi)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)
            if hi > lo
        }

    def rows_of(self, account_id: str, value: str) -> list[int]:
        lo, hi = self.accounts.get(account_id, (0, 0))
        values = self.values
        k = bisect.bisect_left(range(lo, hi), value, key=lambda i: values[i].as_py()) + lo
        out = []
        while k < hi and values[k].as_py() == value:
            out.append(int(self.rows[k]))
            k += 1
        return out


class _Rows:
    """Reads single rows of immutable Parquet files by (file, row): one small row group each.

    A row is its physical position in the data file, which a delete file leaves as it is."""

    def __init__(self, files: Files) -> None:
        self.files = files.paths
        self.meta = [pq.ParquetFile(p).metadata for p in files.paths]
        # Row-group start offsets per file, to turn a file row into (row group, row in group).
        self.rg_starts = [
            np.cumsum([0] + [m.row_group(i).num_rows for i in range(m.num_row_groups)])
            for m in self.meta
        ]

    def read(self, column: str, locations: list[tuple[int, int]]) -> list[str]:
        where: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for k, (f, r) in enumerate(locations):
            rg = int(np.searchsorted(self.rg_starts[f], r, "right")) - 1
            where.setdefault((f, rg), []).append((k, r - int(self.rg_starts[f][rg])))
        out: list[str] = [""] * len(locations)
        for (f, rg), items in where.items():
            # A ParquetFile per read: opened on cached metadata it is cheap, and never shared
            # between threads.
            col = pq.ParquetFile(self.files[f], metadata=self.meta[f]).read_row_group(
                rg, columns=[column]
            )[column]
            for k, i in items:
                out[k] = str(col[i].as_py())
        return out


def _as_of(paths: list[str], upto: int | None) -> tuple[str, str]:
    """read_parquet options and a condition keeping the rows of the files up to snapshot upto."""
    if upto is None or all(newest_snapshot(p) is None for p in paths):
        return "", "true"
    # Files of one snapshot have no snapshot column: by name, it reads as NULL for them.
    return ", union_by_name = true", f"coalesce({_SNAPSHOT_COLUMN}, 0) <= {int(upto)}"


def _live(files: Files) -> tuple[str, list[Any]]:
    """A FROM item (SQL and its parameters) for the live rows of the files, each with its
    location: `file`, its data file's place in files.paths, and `row`, its row in that file."""
    paths = list(files.paths)
    opts, cond = _as_of(paths, files.upto)
    # file_index is a file's place in the list read_parquet is given (a third of the cost of
    # looking its filename up in that list, per row).
    sql = (
        "(select *, file_index::integer as file, file_row_number as row"
        f" from read_parquet(?, file_row_number = true{opts}) where {cond})"
    )
    params: list[Any] = [paths]
    owners = [i for i, d in enumerate(files.deletes) if d is not None]
    deletes = [d for d in files.deletes if d is not None]
    if deletes:
        # A DuckLake delete file is Parquet with columns file_path (the data file), pos (a
        # deleted row's position in it) and, when it holds deletes of several snapshots,
        # _ducklake_internal_snapshot_id. The data file is known from the catalog, not from
        # file_path: that is the data file's path as first written, which a lake moved to
        # another directory would no longer match.
        opts, cond = _as_of(deletes, files.upto)
        sql = (
            f"(select * from {sql} as d anti join"
            " (select (?::integer[])[file_index::integer + 1] as file, pos as row"
            f" from read_parquet(?{opts}) where {cond}) as x"
            " on d.file = x.file and d.row = x.row)"
        )
        params += [owners, deletes]
    return sql, params


def _file_rows(file: np.ndarray[Any, Any], files: Files) -> tuple[int, ...]:
    return tuple(int(n) for n in np.bincount(file, minlength=len(files.paths)))


def _groups(
    conn: duckdb.DuckDBPyConnection, keys: str, files: Files
) -> dict[tuple[str, ...], tuple[int, int]]:
    """(lo, hi) of each run of equal keys in rows sorted by those keys first."""
    live, params = _live(files)
    rows = conn.execute(
        f"select {keys}, count(*) from {live} group by all order by all", params
    ).fetchall()
    out, lo = {}, 0
    for *key, n in rows:
        out[tuple(str(k) for k in key)] = (lo, lo + int(n))
        lo += int(n)
    return out


class CustomerIndex:
    """Customers ordered by account and customer id (the profile list's order)."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, files: Files) -> None:
        live, params = _live(files)
        # One ORDER BY over the rows of all the files: the list's order across files.
        t = conn.execute(
            "select account_id, user_id, customer_id, email_lower, traits, file, row"
            f" from {live} order by account_id, customer_id",
            params,
        ).to_arrow_table()
        self.file = t["file"].to_numpy()
        self.row = t["row"].to_numpy()
        self.file_rows = _file_rows(self.file, files)
        self.reader = _Rows(files)
        self.cols = {c: t[c].combine_chunks() for c in _KEY.values()}
        self.account = t["account_id"].combine_chunks()
        self.traits = t["traits"].combine_chunks()
        self.by = {
            id_type: _KeyIndex(self.account, self.cols[col]) for id_type, col in _KEY.items()
        }
        self.rows = t.num_rows
        self.accounts = {k[0]: v for k, v in _groups(conn, "account_id", files).items()}

    def page(
        self, account_id: str, after: str | None, offset: int, size: int
    ) -> list[tuple[str, str]]:
        """(customer_id, traits) in customer_id order: after a key, then skip offset."""
        lo, hi = self.accounts.get(account_id, (0, 0))
        ids = self.cols["customer_id"]
        if after:
            lo = bisect.bisect_right(range(lo, hi), after, key=lambda i: ids[i].as_py()) + lo
        start = lo + offset
        return [
            (str(ids[i].as_py()), str(self.traits[i].as_py()))
            for i in range(start, min(hi, start + size))
        ]

    def lookup(
        self, account_id: str, id_type: str, value: str, column: str = "traits"
    ) -> list[tuple[str, str]]:
        """(customer_id, traits or metadata) of the customers an idType:id names, by id."""
        if id_type == "email":
            value = _hash.lower(value)
        ids = self.cols["customer_id"]
        rows = sorted((str(ids[i].as_py()), i) for i in self.by[id_type].rows_of(account_id, value))
        if column == "metadata":
            docs = self.reader.read(
                "metadata", [(int(self.file[i]), int(self.row[i])) for _, i in rows]
            )
        else:
            docs = [str(self.traits[i].as_py()) for _, i in rows]
        return [(cid, doc) for (cid, _), doc in zip(rows, docs, strict=True)]


class EventIndex:
    """Events ordered as the API lists them: by account, brand, event time, event id."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, files: Files) -> None:
        self.reader = _Rows(files)
        live, params = _live(files)
        self.action_names = [
            str(r[0])
            for r in conn.execute(
                f"select distinct event_action from {live}"
                " where event_action is not null order by 1",
                params,
            ).fetchall()
        ]
        # Only numbers come back (~32 bytes an event); the strings stay inside DuckDB's sort,
        # one ORDER BY over the rows of all the files.
        t = conn.execute(
            "select epoch_us(event_time) as t,"
            " coalesce(list_position(?, event_action), 0)::integer - 1 as action,"
            " hash(account_id, customer_id) as h_customer, file, row"
            f" from {live} order by account_id, brand_id, event_time, event_id",
            [self.action_names, *params],
        ).to_arrow_table()
        self.n = t.num_rows
        self.t = t["t"].to_numpy()
        self.file = t["file"].to_numpy()
        self.row = t["row"].to_numpy()
        self.file_rows = _file_rows(self.file, files)
        self.action = t["action"].to_numpy()
        self.by_customer = _HashIndex(t["h_customer"].to_numpy())
        del t
        # Contiguous (lo, hi) of each account and brand, and the positions of each action in it.
        self.groups: dict[tuple[str, str], tuple[int, int]] = {}
        self.by_action: dict[tuple[str, str, int], np.ndarray[Any, Any]] = {}
        for (a, b), (lo, hi) in _groups(conn, "account_id, brand_id", files).items():
            self.groups[(a, b)] = (lo, hi)
            codes = self.action[lo:hi]
            for code in np.unique(codes):
                self.by_action[(a, b, int(code))] = np.nonzero(codes == code)[0] + lo

    # --- pages -------------------------------------------------------------------------------

    def page(
        self, account_id: str, brand_id: str, q: EventQuery, customer_hashes: list[int] | None
    ) -> list[int]:
        """Positions of the page q asks for, in answer order."""
        lo, hi = self.groups.get((account_id, brand_id), (0, 0))
        if hi <= lo:
            return []
        if customer_hashes is not None:
            return self._customer_page(lo, hi, q, customer_hashes)
        if q.include is not None:
            code = self._code(q.include)
            if code is None:
                return []
            cand: Any = self.by_action.get((account_id, brand_id, code), np.empty(0, np.int64))
        else:
            cand = range(lo, hi)
        a, b = self._window(cand, q)
        return self._take(cand, a, b, q)

    def _customer_page(self, lo: int, hi: int, q: EventQuery, hashes: list[int]) -> list[int]:
        pos = np.concatenate([self.by_customer.rows_of(h) for h in hashes] or [np.empty(0)])
        pos = np.sort(pos[(pos >= lo) & (pos < hi)].astype(np.int64))
        keep = np.ones(len(pos), bool)
        if q.include is not None:
            code = self._code(q.include)
            keep &= self.action[pos] == (-1 if code is None else code)
        if q.start is not None:
            keep &= self.t[pos] > _us(q.start)
        if q.end is not None:
            keep &= self.t[pos] < _us(q.end)
        pos = pos[keep]
        return self._take(pos, 0, len(pos), q)

    def _code(self, action: str) -> int | None:
        try:
            return self.action_names.index(action)
        except ValueError:
            return None

    def _window(self, cand: Any, q: EventQuery) -> tuple[int, int]:
        """The [a, b) of cand inside start < t < end (cand is in time order)."""
        a, b = 0, len(cand)
        t = self.t
        if q.start is not None:
            a = bisect.bisect_right(cand, _us(q.start), key=lambda p: t[p])
        if q.end is not None:
            b = bisect.bisect_left(cand, _us(q.end), key=lambda p: t[p])
        return a, max(a, b)

    def _take(self, cand: Any, a: int, b: int, q: EventQuery) -> list[int]:
        skip, want = q.offset, q.size
        excluded = {c for c in (self._code(x) for x in q.exclude) if c is not None}
        if not excluded:
            if q.sort == "desc":
                hi = b - skip
                return [int(p) for p in reversed(cand[max(a, hi - want) : hi])] if hi > a else []
            lo = a + skip
            return [int(p) for p in cand[lo : min(b, lo + want)]] if lo < b else []
        # With exclusions, walk in chunks until skip + want rows survive.
        out: list[int] = []
        need = skip + want
        step = max(256, need * 2)
        ex = np.fromiter(excluded, np.int32)
        cur = b if q.sort == "desc" else a
        while len(out) < need and (cur > a if q.sort == "desc" else cur < b):
            if q.sort == "desc":
                chunk = np.asarray(cand[max(a, cur - step) : cur])[::-1]
                cur = max(a, cur - step)
            else:
                chunk = np.asarray(cand[cur : min(b, cur + step)])
                cur = min(b, cur + step)
            out += [int(p) for p in chunk[~np.isin(self.action[chunk], ex)]]
        return out[skip:need]

    # --- records -----------------------------------------------------------------------------

    def records(self, positions: Iterable[int]) -> list[str]:
        """The JSON records at these positions, read from their Parquet row groups."""
        return self.reader.read(
            "record", [(int(self.file[p]), int(self.row[p])) for p in positions]
        )


class Index:
    """Customers and events of one build."""

    def __init__(self, customers: Files, events: Files) -> None:
        conn = duckdb.connect()
        try:
            self.customers = CustomerIndex(conn, customers)
            self.events = EventIndex(conn, events)
        finally:
            conn.close()
        self.key = (customers, events)

    def customer_hashes(self, account_id: str, customer_ids: list[str]) -> list[int]:
        return _hash.many(account_id, customer_ids) if customer_ids else []
