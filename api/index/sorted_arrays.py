"""Sorted arrays of the read index: rows by key hash (HashIndex) and by (account, key)
(KeyIndex), and the merge of new rows into sorted old ones that an update of an index makes.

Python touches each run or group of rows, never each row: numpy and Arrow's C++ kernels do the
per-row work, and Arrow's release the GIL, which the requests answered meanwhile need.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class HashIndex:
    """Rows by a 64-bit hash of their key: sorted hashes plus the row of each."""

    def __init__(self, hashes: np.ndarray[Any, Any]) -> None:
        # Not a stable sort (twice as fast): the rows of one hash are sorted where they are used.
        order = np.argsort(hashes)
        self.hashes = hashes[order]
        self.rows = order.astype(np.int64)

    @classmethod
    def of_sorted(cls, hashes: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> HashIndex:
        index = cls.__new__(cls)
        index.hashes, index.rows = hashes, rows
        return index

    def moved(
        self, to: np.ndarray[Any, Any], hashes: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
    ) -> HashIndex:
        """This index after its rows moved (row r to to[r]; -1: gone) and rows were added."""
        where = to[self.rows]
        kept = where >= 0
        old_hashes, old_rows = self.hashes[kept], where[kept]
        order = np.argsort(hashes)
        at = np.searchsorted(old_hashes, hashes[order])
        return HashIndex.of_sorted(
            np.insert(old_hashes, at, hashes[order]), np.insert(old_rows, at, rows[order])
        )

    def rows_of(self, h: int) -> np.ndarray[Any, Any]:
        key = self.hashes.dtype.type(h)
        lo = int(np.searchsorted(self.hashes, key, "left"))
        hi = int(np.searchsorted(self.hashes, key, "right"))
        return self.rows[lo:hi]


def runs_of(*columns: pa.Array) -> dict[Any, tuple[int, int]]:
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
        key = tuple(str(col[lo].as_py()) for col in columns)  # as table.key_ranges keys them
        out[key[0] if len(columns) == 1 else key] = (lo, hi)
    return out


def merge(
    ranges: dict[Any, tuple[int, int]],
    kept: np.ndarray[Any, Any],
    new_groups: dict[Any, tuple[int, int]],
    search: Callable[[int, int, int, int], np.ndarray[Any, Any]],
) -> tuple[np.ndarray[Any, Any], dict[Any, tuple[int, int]]]:
    """Where new rows go among sorted old ones, of which only the kept stay.

    Rows come in groups (an account, an account and brand), each old group's rows at [lo, hi)
    of ranges, the new rows' at [a, b) of new_groups (see runs_of). search(lo, hi, a, b) gives,
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


def search_strings(
    values: pa.Array, new_values: pa.Array
) -> Callable[[int, int, int, int], np.ndarray[Any, Any]]:
    """merge's search over sorted strings: Arrow's binary search (no GIL held, no copy)."""

    def search(lo: int, hi: int, a: int, b: int) -> np.ndarray[Any, Any]:
        found = pc.search_sorted(values.slice(lo, hi - lo), new_values.slice(a, b - a))
        return lo + found.to_numpy().astype(np.int64)

    return search


def inserted(
    n: int, ins: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """For n kept items and new ones inserted before positions ins (np.insert's meaning): the
    new position of each kept item, and of each new one."""
    kept = np.arange(n)
    return kept + np.searchsorted(ins, kept, "right"), ins + np.arange(len(ins))


def take_merged(
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


class KeyIndex:
    """Rows by (account, key): the non-null keys sorted by Arrow's C++ kernels, which release
    the GIL (a Python loop over a million keys held it for seconds, stalling the requests the
    server answers while it builds). A lookup is a binary search over ~20 keys.

    Arrow and Python order strings alike: Arrow by their UTF-8 bytes, Python by code points."""

    def __init__(
        self, rows: np.ndarray[Any, Any], values: pa.Array, accounts: dict[str, tuple[int, int]]
    ) -> None:
        self.rows, self.values, self.accounts = rows, values, accounts

    @classmethod
    def build(cls, account: pa.Array, values: pa.Array) -> KeyIndex:
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
    ) -> KeyIndex:
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
        ins, out = merge(
            self.accounts,
            kept,
            runs_of(new["a"].combine_chunks()),
            search_strings(self.values, new_values),
        )
        new_rows = rows[valid[order.to_numpy()]]
        return KeyIndex(
            np.insert(where[stay], ins, new_rows),
            take_merged(self.values, stay, new_values, ins),
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
