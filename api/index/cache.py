"""The row-group cache of the read index: single rows of immutable Parquet files by (file,
row), each read decoding one small row group, kept while it is among the most recently read."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from api.index.ducklake_format import Files

ROW_GROUP_CACHE_BYTES = 256 * 1024 * 1024


class GroupCache:
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


row_groups = GroupCache(ROW_GROUP_CACHE_BYTES)


class Rows:
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
            col = row_groups.get(
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
