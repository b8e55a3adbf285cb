"""In-memory indexes over one build of the customers and events marts, for fast reads.

A DuckLake read costs catalog round trips, Parquet footers and the decoding of whole row
groups: ~50 ms for a point lookup and seconds for a newest-first page over 10M events
(measured; DESIGN.md 8). An index holds, per row, a key hash and a position (a few bytes), the
traits of each customer, and the location of each event record in the lake's Parquet data
files; an answer is then a binary search plus the read of one small row group, decoded once
while it stays in a cache of recently read row groups (_GroupCache).

DuckLake never rewrites a file: an incremental run inserts rows in new data files and deletes
rows by writing, per data file, a new delete file listing the positions of all its deleted
rows. Once several snapshots deleted from a data file, its delete file also names the snapshot
of each delete, and stands for the earlier snapshots too (the older delete file leaves the
catalog). An index holds the rows of the data files that their delete files leave, as of one
snapshot, and is keyed by those files, not by snapshot: a pipeline commits many snapshots, and
the index stays valid for every snapshot whose data and delete files are the same.

A pass changes a small part of the marts: the index of its snapshot is the previous index with
the rows its new delete files list dropped and the rows of its new data files merged in, in
order (~1-3 s at 10M events against 6-10 s for a build from the files).
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from api.params import EventQuery

if TYPE_CHECKING:
    from api.pages import PagesProcess

_KEY = {"userId": "user_id", "id": "customer_id", "email": "email_lower"}
_CUSTOMER_COLUMNS = "account_id, user_id, customer_id, email_lower, traits"


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

    @classmethod
    def of_sorted(cls, hashes: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> _HashIndex:
        index = cls.__new__(cls)
        index.hashes, index.rows = hashes, rows
        return index

    def moved(
        self, to: np.ndarray[Any, Any], hashes: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
    ) -> _HashIndex:
        """This index after its rows moved (row r to to[r]; -1: gone) and rows were added."""
        where = to[self.rows]
        kept = where >= 0
        old_hashes, old_rows = self.hashes[kept], where[kept]
        order = np.argsort(hashes)
        at = np.searchsorted(old_hashes, hashes[order])
        return _HashIndex.of_sorted(
            np.insert(old_hashes, at, hashes[order]), np.insert(old_rows, at, rows[order])
        )

    def rows_of(self, h: int) -> np.ndarray[Any, Any]:
        key = self.hashes.dtype.type(h)
        lo = int(np.searchsorted(self.hashes, key, "left"))
        hi = int(np.searchsorted(self.hashes, key, "right"))
        return self.rows[lo:hi]


def _can_update(old: Files, new: Files) -> bool:
    """Whether an index of the old files can be updated to the new ones: every data file kept
    keeps a delete file once it had one, and no file holds rows of later snapshots."""
    if old.upto is not None or new.upto is not None:
        return False
    now = dict(zip(new.paths, new.deletes, strict=True))
    return all(
        now[p] is not None
        for p, d in zip(old.paths, old.deletes, strict=True)
        if p in now and d is not None
    )


class _Change:
    """What changed between the files of an index and newer files of its table: which of its
    rows are still live (`keep`), its data files' places among the new ones (`remap`, -1 when
    gone) and the new data files (`added`, places in the new files)."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        old: Files,
        file: np.ndarray[Any, Any],
        row: np.ndarray[Any, Any],
        files: Files,
    ) -> None:
        where = {p: i for i, p in enumerate(files.paths)}
        self.remap = np.array([where.get(p, -1) for p in old.paths], file.dtype)
        self.keep = self.remap[file] >= 0
        # Rows deleted since: a data file's new delete file lists all its deleted positions.
        changed = [
            i
            for i, (p, d) in enumerate(zip(old.paths, old.deletes, strict=True))
            if p in where and files.deletes[where[p]] != d
        ]
        if changed:
            gone = conn.execute(
                "select (?::bigint[])[file_index::integer + 1] as f, pos"
                " from read_parquet(?, union_by_name = true)",
                [changed, [files.deletes[where[old.paths[i]]] for i in changed]],
            ).fetchnumpy()
            at = np.flatnonzero(np.isin(file, changed))
            keys = (file[at].astype(np.int64) << 32) | row[at].astype(np.int64)
            dropped = (gone["f"].astype(np.int64) << 32) | gone["pos"].astype(np.int64)
            self.keep[at[np.isin(keys, dropped)]] = False
        known = set(old.paths)
        self.added = [j for j, p in enumerate(files.paths) if p not in known]


def _runs(*columns: pa.Array) -> dict[Any, tuple[int, int]]:
    """(lo, hi) of each run of equal values in rows sorted by these string columns first; keyed
    by the value (one column) or the tuple of values. Python touches each run, not each row: a
    list of a pass's 100k values held the GIL for up to 20 ms, and every request waited."""
    n = len(columns[0])
    if not n:
        return {}
    codes = np.zeros(n, np.int64)
    for col in columns:
        enc = pc.dictionary_encode(col)
        enc = enc.combine_chunks() if isinstance(enc, pa.ChunkedArray) else enc
        codes = codes * len(enc.dictionary) + enc.indices.to_numpy(zero_copy_only=False)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(codes)) + 1])
    ends = np.concatenate([starts[1:], [n]])
    out: dict[Any, tuple[int, int]] = {}
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        key = tuple(str(col[lo].as_py()) for col in columns)  # as _groups keys them
        out[key[0] if len(columns) == 1 else key] = (lo, hi)
    return out


def _merge(
    ranges: dict[Any, tuple[int, int]],
    kept: np.ndarray[Any, Any],
    new_groups: dict[Any, tuple[int, int]],
    search: Callable[[int, int, int, int], np.ndarray[Any, Any]],
) -> tuple[np.ndarray[Any, Any], dict[Any, tuple[int, int]]]:
    """Where new rows go among sorted old ones, of which only the kept stay.

    Rows come in groups (an account, an account and brand), each old group's rows at [lo, hi)
    of ranges, the new rows' at [a, b) of new_groups (see _runs). search(lo, hi, a, b) gives,
    for new rows a to b of one group, the old row each goes before (or hi). Returns the place
    among the kept rows each new row goes before, and each group's range once they are in."""
    stay = np.flatnonzero(kept)

    def before(p: Any) -> Any:  # kept rows before old row p (not a cumsum over every row:
        return np.searchsorted(stay, p)  # numpy holds the GIL through one, ~0.2 s at 10M)

    ins = np.empty(sum(b - a for a, b in new_groups.values()), np.int64)
    out: dict[Any, tuple[int, int]] = {}
    shift = end = 0
    for g in sorted(ranges.keys() | new_groups.keys()):
        lo, hi = ranges.get(g, (end, end))
        a, b = new_groups.get(g, (0, 0))
        if b > a:
            ins[a:b] = before(search(lo, hi, a, b))
        first = int(before(lo))
        size = int(before(hi)) - first + b - a
        if size:
            out[g] = (first + shift, first + shift + size)
        shift += b - a
        end = hi
    return ins, out


def _search_strings(
    values: pa.Array, new_values: pa.Array
) -> Callable[[int, int, int, int], np.ndarray[Any, Any]]:
    """_merge's search over sorted strings: Arrow's binary search (no GIL held, no copy)."""

    def search(lo: int, hi: int, a: int, b: int) -> np.ndarray[Any, Any]:
        found = pc.search_sorted(values.slice(lo, hi - lo), new_values.slice(a, b - a))
        return lo + found.to_numpy().astype(np.int64)

    return search


def _inserted(
    n: int, ins: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """For n kept items and new ones inserted before positions ins (np.insert's meaning): the
    new position of each kept item, and of each new one."""
    kept = np.arange(n)
    return kept + np.searchsorted(ins, kept, "right"), ins + np.arange(len(ins))


def _take_merged(
    old: pa.Array, stay: np.ndarray[Any, Any], new: pa.Array, ins: np.ndarray[Any, Any]
) -> pa.Array:
    """The old values at positions stay, with the new ones inserted before positions ins (of
    stay). A pass changes few rows: the runs of old rows it left are copied whole (a take of a
    million strings costs ~10x more); one take when the runs are many and short."""
    n = len(old)
    new = new.cast(old.type)
    order = np.insert(stay, ins, n + np.arange(len(new)))
    if not len(order):
        return old.slice(0, 0)
    cut = np.flatnonzero((np.diff(order) != 1) | (order[1:] == n)) + 1
    if len(cut) > 20_000:
        return pa.chunked_array([old, new]).take(order).combine_chunks()
    starts = [0, *cut.tolist()]
    ends = [*cut.tolist(), len(order)]
    return pa.concat_arrays(
        [
            old.slice(p, e - s) if p < n else new.slice(p - n, e - s)
            for s, e, p in zip(starts, ends, order[starts].tolist(), strict=True)
        ]
    )


class _KeyIndex:
    """Rows by (account, key): the non-null keys sorted by Arrow's C++ kernels, which release
    the GIL (a Python loop over a million keys held it for seconds, stalling the requests the
    server answers while it builds). A lookup is a binary search over ~20 keys.

    Arrow and Python order strings alike: Arrow by their UTF-8 bytes, Python by code points."""

    def __init__(
        self, rows: np.ndarray[Any, Any], values: pa.Array, accounts: dict[str, tuple[int, int]]
    ) -> None:
        self.rows, self.values, self.accounts = rows, values, accounts

    @classmethod
    def build(cls, account: pa.Array, values: pa.Array) -> _KeyIndex:
        valid = np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
        keys = pa.table({"a": account.take(valid), "v": values.take(valid)})
        order = pc.sort_indices(keys, sort_keys=[("a", "ascending"), ("v", "ascending")])
        rows = valid[order.to_numpy()]
        codes = account.take(rows).dictionary_encode()
        runs = codes.indices.to_numpy(zero_copy_only=False)
        bounds = [0, *(np.flatnonzero(np.diff(runs)) + 1).tolist(), len(runs)]
        accounts = {
            str(codes.dictionary[int(runs[lo])].as_py()): (lo, hi)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)
            if hi > lo
        }
        return cls(rows, values.take(rows), accounts)

    def updated(
        self,
        moved: np.ndarray[Any, Any],
        accounts: pa.Array,
        values: pa.Array,
        rows: np.ndarray[Any, Any],
    ) -> _KeyIndex:
        """This index after its rows moved (row r to moved[r]; -1: gone) and rows were added
        (their accounts, keys and rows)."""
        where = moved[self.rows]
        kept = where >= 0
        valid = np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
        new = pa.table({"a": accounts.cast(pa.string()).take(valid), "v": values.take(valid)})
        order = pc.sort_indices(new, sort_keys=[("a", "ascending"), ("v", "ascending")])
        new = new.take(order)
        new_values = new["v"].combine_chunks()
        stay = np.flatnonzero(kept)
        ins, out = _merge(
            self.accounts,
            kept,
            _runs(new["a"].combine_chunks()),
            _search_strings(self.values, new_values),
        )
        new_rows = rows[valid[order.to_numpy()]]
        return _KeyIndex(
            np.insert(where[stay], ins, new_rows),
            _take_merged(self.values, stay, new_values, ins),
            out,
        )

    def rows_of(self, account_id: str, value: str) -> list[int]:
        lo, hi = self.accounts.get(account_id, (0, 0))
        values = self.values
        k = bisect.bisect_left(range(lo, hi), value, key=lambda i: values[i].as_py()) + lo
        out = []
        while k < hi and values[k].as_py() == value:
            out.append(int(self.rows[k]))
            k += 1
        return out


ROW_GROUP_CACHE_BYTES = 256 * 1024 * 1024


class _GroupCache:
    """Decoded column chunks of Parquet row groups: the most recently read kept, up to a budget
    of bytes. DuckLake never rewrites a file, so a chunk (file, row group, column) never goes
    stale, and the indexes of successive snapshots share the cache.

    The pages asked for most (the newest events, of an account or of one action) read the same
    few row groups again and again; decoding one is most of a page's work (an events `record`
    row group: 1.5-2.4 ms with LZ4, a page reads one to a few), and on a busy machine it is CPU
    taken from every other request (traits by userId among them)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.bytes = 0
        self._chunks: OrderedDict[tuple[str, int, str], pa.ChunkedArray] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self, key: tuple[str, int, str], read: Callable[[], pa.ChunkedArray]
    ) -> pa.ChunkedArray:
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is not None:
                self._chunks.move_to_end(key)
                return chunk
        # Decoded outside the lock: two threads may decode one chunk, neither waits for the other.
        chunk = read()
        with self._lock:
            if key not in self._chunks and chunk.nbytes <= self.budget:
                self._chunks[key] = chunk
                self.bytes += chunk.nbytes
                while self.bytes > self.budget:
                    _, old = self._chunks.popitem(last=False)
                    self.bytes -= old.nbytes
        return chunk


_row_groups = _GroupCache(ROW_GROUP_CACHE_BYTES)


class _Rows:
    """Reads single rows of immutable Parquet files by (file, row): one small row group each,
    decoded once while it stays in the row-group cache.

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
            col = _row_groups.get(
                (self.files[f], rg, column), functools.partial(self._decode, f, rg, column)
            )
            for k, i in items:
                out[k] = str(col[i].as_py())
        return out

    def _decode(self, f: int, rg: int, column: str) -> pa.ChunkedArray:
        # A ParquetFile per read: opened on cached metadata it is cheap, and never shared
        # between threads.
        return pq.ParquetFile(self.files[f], metadata=self.meta[f]).read_row_group(
            rg, columns=[column]
        )[column]


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
    # Arrow's count, which lets go of the GIL (numpy's bincount held it ~10 ms at 10M rows).
    counts = pc.value_counts(pa.array(file, from_pandas=False)).flatten()
    out = [0] * len(files.paths)
    for f, n in zip(counts[0].to_pylist(), counts[1].to_pylist(), strict=True):
        out[f] = n
    return tuple(out)


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


def _rows_of(
    conn: duckdb.DuckDBPyConnection, files: Files, which: list[int], columns: str, order: str
) -> pa.Table:
    """Columns of the live rows of some of the files, with `file` (a place in files.paths) and
    `row`, in an order (an empty table, with the columns' types, when which is empty)."""
    part = Files(
        tuple(files.paths[j] for j in which),
        tuple(files.deletes[j] for j in which),
        tuple(files.rows[j] for j in which),
        files.upto,
    )
    if not which:
        part = Files(files.paths[:1], files.deletes[:1], files.rows[:1], files.upto)
    live, params = _live(part)
    return conn.execute(
        f"select {columns}, (?::bigint[])[file + 1] as file, row from {live}"
        f" where {'true' if which else 'false'} order by {order}",
        [which or [0], *params],
    ).to_arrow_table()


class _TableIndex:
    """An index of a table's live rows, from its files at one snapshot: built from all the files,
    or updated from the index of an earlier snapshot of the table. A pipeline pass deletes some
    rows (new delete files) and adds rows in new files, a small part of a big table: the update
    drops the deleted rows and merges the new ones in, in order, without sorting or reading the
    rows it keeps."""

    file: np.ndarray[Any, Any]  # the data file of each row (its place in files.paths)

    def __init__(
        self, conn: duckdb.DuckDBPyConnection, files: Files, previous: Self | None = None
    ) -> None:
        self.files = files
        self.reader = _Rows(files)
        self.updated = previous is not None and _can_update(previous.files, files)
        if previous is not None and self.updated:
            self._update(conn, previous)
        else:
            self._build(conn)
        self.file_rows = _file_rows(self.file, files)

    def _build(self, conn: duckdb.DuckDBPyConnection) -> None:
        raise NotImplementedError

    def _update(self, conn: duckdb.DuckDBPyConnection, old: Self) -> None:
        raise NotImplementedError


class CustomerIndex(_TableIndex):
    """Customers ordered by account and customer id (the profile list's order). An update
    finds the place of each new row by Arrow's binary search and copies the runs of kept rows."""

    def __init__(
        self, conn: duckdb.DuckDBPyConnection, files: Files, previous: Self | None = None
    ) -> None:
        super().__init__(conn, files, previous)
        self.rows = len(self.file)

    def _build(self, conn: duckdb.DuckDBPyConnection) -> None:
        live, params = _live(self.files)
        # One ORDER BY over the rows of all the files: the list's order across files.
        t = conn.execute(
            f"select {_CUSTOMER_COLUMNS}, file, row from {live} order by account_id, customer_id",
            params,
        ).to_arrow_table()
        self.file = t["file"].to_numpy()
        self.row = t["row"].to_numpy()
        self.cols = {c: t[c].combine_chunks() for c in _KEY.values()}
        self.account = t["account_id"].combine_chunks()
        self.traits = t["traits"].combine_chunks()
        self.accounts = {k[0]: v for k, v in _groups(conn, "account_id", self.files).items()}
        self.by = {
            "userId": _KeyIndex.build(self.account, self.cols["user_id"]),
            "email": _KeyIndex.build(self.account, self.cols["email_lower"]),
            # The list's own order.
            "id": _KeyIndex(np.arange(t.num_rows), self.cols["customer_id"], self.accounts),
        }

    def _update(self, conn: duckdb.DuckDBPyConnection, old: Self) -> None:
        change = _Change(conn, old.files, old.file, old.row, self.files)
        new = _rows_of(conn, self.files, change.added, _CUSTOMER_COLUMNS, "account_id, customer_id")
        stay = np.flatnonzero(change.keep)
        accounts = new["account_id"].combine_chunks()
        ins, self.accounts = _merge(
            old.accounts,
            change.keep,
            _runs(accounts),
            _search_strings(old.cols["customer_id"], new["customer_id"].combine_chunks()),
        )
        old_at, new_at = _inserted(len(stay), ins)
        moved = np.full(len(old.file), -1, np.int64)
        moved[stay] = old_at

        def merged(values: pa.Array, column: str) -> pa.Array:
            return _take_merged(values, stay, new[column].combine_chunks(), ins)

        self.file = np.insert(
            change.remap[old.file][stay], ins, new["file"].to_numpy().astype(old.file.dtype)
        )
        self.row = np.insert(old.row[stay], ins, new["row"].to_numpy().astype(old.row.dtype))
        self.cols = {c: merged(old.cols[c], c) for c in _KEY.values()}
        self.account = merged(old.account, "account_id")
        self.traits = merged(old.traits, "traits")
        self.by = {
            "userId": old.by["userId"].updated(
                moved, accounts, new["user_id"].combine_chunks(), new_at
            ),
            "email": old.by["email"].updated(
                moved, accounts, new["email_lower"].combine_chunks(), new_at
            ),
            "id": _KeyIndex(np.arange(len(self.file)), self.cols["customer_id"], self.accounts),
        }

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

    def lookup(self, account_id: str, id_type: str, value: str) -> list[tuple[str, str]]:
        """(customer_id, traits) of the customers an idType:id names, by id."""
        if id_type == "email":
            value = _hash.lower(value)
        ids = self.cols["customer_id"]
        rows = sorted((str(ids[i].as_py()), i) for i in self.by[id_type].rows_of(account_id, value))
        return [(cid, str(self.traits[i].as_py())) for cid, i in rows]


class EventIndex(_TableIndex):
    """Events ordered as the API lists them: by account, brand, event time, event id. An update
    works in numpy, reading event ids only for new events at the time of kept ones: at 10M events
    ~1.5-2.6 s against ~6.4 s for a build (a small pass)."""

    def __init__(
        self, conn: duckdb.DuckDBPyConnection, files: Files, previous: Self | None = None
    ) -> None:
        super().__init__(conn, files, previous)
        self.n = len(self.t)
        # The positions of each action in each account and brand.
        self.by_action: dict[tuple[str, str, int], np.ndarray[Any, Any]] = {}
        for (a, b), (lo, hi) in self.groups.items():
            codes = self.action[lo:hi]
            for code in np.unique(codes):
                self.by_action[(a, b, int(code))] = np.nonzero(codes == code)[0] + lo

    def _build(self, conn: duckdb.DuckDBPyConnection) -> None:
        live, params = _live(self.files)
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
        self.t = t["t"].to_numpy()
        self.file = t["file"].to_numpy()
        self.row = t["row"].to_numpy()
        self.action = t["action"].to_numpy()
        self.by_customer = _HashIndex(t["h_customer"].to_numpy())
        del t
        # Contiguous (lo, hi) of each account and brand.
        self.groups = {
            (a, b): v for (a, b), v in _groups(conn, "account_id, brand_id", self.files).items()
        }

    def _update(self, conn: duckdb.DuckDBPyConnection, old: Self) -> None:
        change = _Change(conn, old.files, old.file, old.row, self.files)
        keep = change.keep
        new = _rows_of(
            conn,
            self.files,
            change.added,
            "account_id, brand_id, event_id, epoch_us(event_time) as t, event_action,"
            " hash(account_id, customer_id) as h_customer",
            "account_id, brand_id, event_time, event_id",
        )
        # Python touches each distinct action, not each new event (see _runs).
        actions = pc.dictionary_encode(new["event_action"].combine_chunks())
        names = actions.dictionary.to_pylist()
        self.action_names = sorted(set(old.action_names) | {a for a in names if a})
        code = {a: i for i, a in enumerate(self.action_names)}
        # Old codes to new ones; the last entry keeps -1 (no action) at -1.
        recode = np.array([code[a] for a in old.action_names] + [-1], np.int32)
        # New events' codes: by their dictionary's codes, -1 where null (or empty).
        to_code = np.array(
            [code[a] if a else -1 for a in names] + [-1],
            np.int32,
        )
        new_codes = to_code[
            actions.indices.fill_null(len(actions.dictionary)).to_numpy(zero_copy_only=False)
        ]
        new_t = new["t"].to_numpy()
        new_ids = new["event_id"].combine_chunks()

        def search(lo: int, hi: int, a: int, b: int) -> np.ndarray[Any, Any]:
            times = old.t[lo:hi]
            left = lo + np.searchsorted(times, new_t[a:b], "left")
            right = lo + np.searchsorted(times, new_t[a:b], "right")
            for j in np.flatnonzero(right > left):  # the same event time: the event id decides
                tied = np.flatnonzero(keep[left[j] : right[j]]) + left[j]
                ids = old.reader.read(
                    "event_id", [(int(old.file[p]), int(old.row[p])) for p in tied]
                )
                k = bisect.bisect_left(ids, new_ids[a + j].as_py())
                left[j] = tied[k] if k < len(tied) else right[j]
            return left

        groups = _runs(new["account_id"].combine_chunks(), new["brand_id"].combine_chunks())
        ins, self.groups = _merge(old.groups, keep, groups, search)
        stay = np.flatnonzero(keep)
        moved = np.full(len(old.t), -1, np.int64)
        moved[stay], placed = _inserted(len(stay), ins)

        def merged(old_values: np.ndarray[Any, Any], new_values: np.ndarray[Any, Any]) -> Any:
            return np.insert(old_values[keep], ins, new_values.astype(old_values.dtype))

        self.t = merged(old.t, new_t)
        self.action = merged(recode[old.action], new_codes)
        self.file = merged(change.remap[old.file], new["file"].to_numpy())
        self.row = merged(old.row, new["row"].to_numpy())
        self.by_customer = old.by_customer.moved(moved, new["h_customer"].to_numpy(), placed)

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
    """Customers and events of one build. The events half lives in the pages process when one
    is given (api/pages.py): then `events` is None and pages come from there."""

    customers: CustomerIndex
    events: EventIndex | None

    def __init__(
        self,
        customers: Files,
        events: Files,
        version: int = 0,
        previous: Index | None = None,
        pages: PagesProcess | None = None,
    ) -> None:
        """The index of the files of a snapshot (version), updated from an index of an earlier
        snapshot of the same tables when given one."""
        self.version = version
        self.key = (customers, events)
        self.pages = pages
        remote: Future[tuple[tuple[int, ...], bool]] | None = None
        if pages is not None:  # built there while the customers are built here
            remote = _remote_builds.submit(
                pages.build, events, previous.key[1] if previous else None
            )
        conn = duckdb.connect()
        try:
            self.customers = CustomerIndex(
                conn, customers, previous.customers if previous else None
            )
            if remote is None:
                self.events = EventIndex(conn, events, previous.events if previous else None)
                self.event_file_rows = self.events.file_rows
                self.events_updated = self.events.updated
        finally:
            conn.close()
        if remote is not None:
            self.events = None
            self.event_file_rows, self.events_updated = remote.result()

    def event_records(
        self, account_id: str, brand_id: str, q: EventQuery, customer_hashes: list[int] | None
    ) -> list[str]:
        """The JSON records of the page q asks for (raises PagesLost when the pages process
        cannot answer from this build's events)."""
        if self.events is None:
            assert self.pages is not None
            return self.pages.page(self.key[1], account_id, brand_id, q, customer_hashes)
        return self.events.records(self.events.page(account_id, brand_id, q, customer_hashes))

    def customer_hashes(self, account_id: str, customer_ids: list[str]) -> list[int]:
        return _hash.many(account_id, customer_ids) if customer_ids else []


# Waits for the pages process's events builds while the customers are built (few at a time).
_remote_builds = ThreadPoolExecutor(2, "events-index-remote")
