"""Which snapshot the API serves, and its index: follows the catalog's snapshots, lists their
files and builds or updates their indexes, in a request when small, else in the background.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.index import Files, Index
from api.index import ducklake_format as lake_format
from api.marts import EVENTS, FRESHNESS, PROFILES, SCHEMA, SERVED, at
from api.pages import PagesLost, PagesProcess
from api.service.lake import Lake
from api.service.snapshot import Snapshot
from mallard.paths import DataPaths
from mallard.priority import yield_cpu
from mallard.regulations import Generation

log = logging.getLogger(__name__)
# Marts up to this size (Parquet bytes) are indexed inside the request that first needs them, so
# an answer right after a pipeline run already uses the index; bigger ones in the background.
INLINE_BUILD_BYTES = 32 * 1024 * 1024
# A change to the catalog that its files' stats missed is picked up after about this long.
SNAPSHOT_MAX_AGE_S = 1.0


class Serving(Lake):
    """The snapshots and indexes of one Warehouse (the reads themselves: api/service/reads.py)."""

    def __init__(
        self,
        paths: DataPaths,
        use_index: bool = True,
        build_nice: int = 0,
        pages_process: bool = False,
        pages_idle: bool = False,
    ) -> None:
        super().__init__(paths)
        self.use_index = use_index
        self.build_nice = build_nice  # the background index builds' niceness
        # Event pages from a process of their own (api/pages.py), not on this one's GIL.
        self.pages = PagesProcess(build_nice, pages_idle) if pages_process and use_index else None
        self._keys: dict[int, tuple[Files, Files, int] | None] = {}  # version -> files, bytes
        self._indexes: dict[tuple[Files, Files], Index] = {}
        self._unusable: set[tuple[Files, Files]] = set()
        # Why the lake's files are not what ducklake_format knows ("" when they are; None until
        # checked, at the first listing).
        self._format_mismatch: str | None = None
        self._wanted: int | None = None  # the newest version the builder is asked to index
        self._builder_running = False
        self._serving: int | None = None  # newest version answered from an index
        self._serving_bytes = 0  # the Parquet bytes of its marts
        self._build_lock = threading.Lock()
        # The current snapshot as last read: (catalog files' stats, version, monotonic time).
        self._seen: tuple[tuple[Any, ...] | None, int, float] | None = None
        self._seen_lock = threading.Lock()
        self._recheck_pool: ThreadPoolExecutor | None = None
        self._rechecking = False
        self._fresh: dict[int, Snapshot] = {}
        self.latest: Snapshot | None = None  # the newest snapshot a request has read
        # Finished Deletes (orchestration/regulations): when the count moves, everything held
        # of earlier snapshots goes; an index build begun before is not kept.
        self._purges = Generation(paths.purge_generation)
        self._purges_seen: int | None = None
        self._purge_epoch = 0

    def warm(self) -> None:
        """Start building the current snapshot's index now, not at the first request."""

        def run() -> None:
            try:
                self.snapshot()
            except Exception:  # nothing to warm yet (no lake, no marts): requests will tell
                log.debug("read index not warmed", exc_info=True)

        threading.Thread(target=run, daemon=True).start()

    def index_status(self) -> dict[str, Any]:
        """For /health: the current snapshot, whether its answers come from the in-memory index
        (else from SQL on the lake, much slower on a big lake: the index is being built, in the
        background, or cannot be), and the newest snapshot answered from an index."""
        version: int | None = None
        indexed = False
        try:
            version = self._current_version()
            indexed = self.index(version) is not None  # starts a build if none is under way
        except Exception:  # no lake or marts yet
            log.debug("no read index status", exc_info=True)
        return {
            "snapshot": version,
            "indexed": indexed,
            "servingSnapshot": self._serving,
            "building": self._builder_running,
            "pagesProcess": self.pages.pid if self.pages is not None else None,
        }

    def close(self) -> None:
        if self.pages is not None:
            self.pages.close()
        if self._recheck_pool is not None:
            self._recheck_pool.shutdown(wait=True)
        super().close()

    def _catalog_signature(self) -> tuple[Any, ...] | None:
        files = [self.paths.lake_catalog, self.paths.lake_catalog.with_name("catalog.sqlite-wal")]
        sig: list[tuple[int, int, int] | None] = []
        for f in files:
            try:
                st = os.stat(f)
            except FileNotFoundError:
                sig.append(None)
                continue
            sig.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(sig) if sig[0] is not None else None

    def _current_version(self) -> int:
        """The current snapshot. A commit writes the SQLite catalog (or its WAL): while neither
        file changed, it is the one read last, without a catalog query (~2 ms, more while the
        pipeline commits; stalls of ~1 s seen while it writes). A change is read in the
        request on a small lake, in the background on a big one. In case the files' stats missed
        a change, the snapshot is read again every SNAPSHOT_MAX_AGE_S, in the background: read
        in a request, that sent one request a second to a worker thread for the query."""
        sig = self._catalog_signature()
        seen = self._seen
        if seen is None or sig is None:
            return self._read_version(sig)
        changed = sig != seen[0]
        # A big lake's new snapshot is served only once the builder has indexed it, in the
        # background: reading its number in the request would not serve it sooner, and while a
        # pass commits (the catalog's WAL changes with each of its writes) sent most requests
        # to a worker thread for a catalog query.
        if changed and not self._indexed_in_background():
            return self._read_version(sig)
        if changed or time.monotonic() - seen[2] >= SNAPSHOT_MAX_AGE_S:
            self._recheck()
        return seen[1]

    def _indexed_in_background(self) -> bool:
        """Whether answers come from an index too big to build in a request."""
        return self.use_index and self._serving_bytes > INLINE_BUILD_BYTES

    def _read_version(self, sig: tuple[Any, ...] | None) -> int:
        """Query the current snapshot; sig: the catalog files' stats taken before the query."""
        version = lake_format.current_snapshot(self._query)
        with self._seen_lock:
            # Snapshots only grow: a slower reader of an older one does not put it back.
            if self._seen is None or version >= self._seen[1]:
                self._seen = (sig, version, time.monotonic())
        return version

    def _recheck(self) -> None:
        """Read the current snapshot again on the re-check thread, unless it is doing so."""
        with self._seen_lock:
            if self._rechecking:
                return
            self._rechecking = True
            if self._recheck_pool is None:
                self._recheck_pool = ThreadPoolExecutor(1, thread_name_prefix="snapshot-recheck")

        def run() -> None:
            try:
                self._read_version(self._catalog_signature())
            except Exception:  # the catalog busy past retries: the next re-check reads it
                log.debug("current snapshot not re-read", exc_info=True)
            finally:
                self._rechecking = False

        self._recheck_pool.submit(run)

    def snapshot(self, version: int | None = None) -> Snapshot:
        """The current committed snapshot, or a given one (a scroll's), with its freshness.

        When the current snapshot's files are too big to index inside a request and their index
        is still being built, the answer comes from the newest snapshot that has one: a few
        seconds older (the freshness headers say so), instead of seconds-long scans of the lake.
        """
        self._drop_if_purged()
        latest = version is None
        if version is None:
            version = self._current_version()
            if self._serving is not None and version != self._serving and self._behind(version):
                version = self._serving
        snap = self._fresh.get(version)
        if snap is None:
            # A pass commits its marts one by one and the freshness row last: a snapshot read
            # between them holds events newer than its row says. Through the newest receipt in
            # the snapshot's own events, the header is never older than an event it serves.
            fresh = self._query(
                f"select built_at, greatest(data_through,"
                f" (select max(received_time) from {at(EVENTS, version)}))"
                f" from {at(FRESHNESS, version)}"
            )
            snap = Snapshot(version, *(fresh[0] if fresh else (None, None)))
            if len(self._fresh) > 1000:  # the served one stays: requests read it
                self._fresh = {k: v for k, v in self._fresh.items() if k == self._serving}
            self._fresh[version] = snap
        if latest:
            self.latest = snap
        return snap

    def _drop_if_purged(self) -> None:
        """After a Delete purged the lake's files, and again when it finished: drop the indexes,
        the event pages process, the snapshots' freshness and the DuckDB connection (its caches
        and file handles), so no answer comes from data the Delete removed or from files it
        deleted; the next answers read the lake as it is now."""
        purges = self._purges.read()
        if self._purges_seen is None:
            self._purges_seen = purges
        if purges == self._purges_seen:
            return
        with self._build_lock:
            self._purges_seen = purges
            self._purge_epoch += 1
            self._indexes, self._keys, self._fresh = {}, {}, {}
            self._unusable = set()
            self._serving, self._serving_bytes, self._seen, self.latest = None, 0, None, None
        if self.pages is not None:
            self.pages.close()  # started again at its next use, empty
        Lake.close(self)
        log.info("a Delete finished: read index and connections dropped")

    # --- the index -------------------------------------------------------------------------

    def _files_of(self, version: int) -> tuple[Files, Files, int] | None:
        """The Parquet data files of customers and events at a version, each with its delete
        file, and their bytes; or None when some rows cannot be read from them."""
        if version in self._keys:
            return self._keys[version]
        if self._carried(version):
            return self._keys[version]
        if self._format_mismatch is None:
            self._format_mismatch = lake_format.mismatch(self._query) or ""
            if self._format_mismatch:
                log.warning(
                    "no read index: %s, not what api/index/ducklake_format.py knows;"
                    " answering from SQL",
                    self._format_mismatch,
                )
        if self._format_mismatch:
            self._keys[version] = None
            return None
        out: list[Files] = []
        size = 0
        for table in (PROFILES, EVENTS):
            found = self._table_files(table, version)
            if isinstance(found, str):
                if found:
                    log.warning(
                        "no read index at snapshot %d: %s.%s %s; answering from SQL",
                        version,
                        SCHEMA,
                        table,
                        found,
                    )
                self._keys[version] = None
                return None
            out.append(found[0])
            size += found[1]
        key = (out[0], out[1], size)
        if len(self._keys) > 1000:
            self._keys.clear()
        self._keys[version] = key
        return key

    def _carried(self, version: int) -> bool:
        """Give a version the files and freshness of the newest earlier one known, when none of
        the snapshots between them changed the served marts (customers, events, freshness): most
        of a pass's commits write only intermediate tables. One query of DuckLake's list of
        snapshot changes (~10 ms) instead of listing the files and counting the marts' rows
        (0.15-0.5 s at 10M events, in the API process while the pass runs)."""
        known = [v for v, k in self._keys.items() if v < version and k is not None]
        base = max(known, default=None)
        if base is None or base not in self._fresh:
            return False
        if not lake_format.unchanged(self._query, SERVED, base, version):
            return False
        before = self._fresh[base]
        self._fresh[version] = Snapshot(version, before.built_at, before.data_through)
        self._keys[version] = self._keys[base]
        return True

    def _table_files(self, table: str, version: int) -> tuple[Files, int] | str:
        """A table's files at a version and their bytes, or why the index cannot read its rows
        from them ("" when it has no files: no table yet)."""
        return lake_format.table_files(self._query, table, version)

    def index(self, snap: Snapshot | int) -> Index | None:
        """The index of a snapshot's files: built now when small, else in the background (and
        None until then, so the answer comes from SQL)."""
        if not self.use_index:
            return None
        version = snap if isinstance(snap, int) else snap.version
        found = self._files_of(version)
        if found is None:
            return None
        customers, events, size = found
        key = (customers, events)
        idx = self._indexes.get(key)
        if idx is not None:
            self._served(version, size)
            return idx
        if key in self._unusable:
            return None
        if size <= INLINE_BUILD_BYTES:
            return self._build(key, version)
        self._follow(version)
        return None

    def _served(self, version: int, size: int) -> None:
        if self._serving is None or version > self._serving:
            self._serving, self._serving_bytes = version, size

    def _behind(self, version: int) -> bool:
        """Whether answers stay on the serving snapshot for now: the version's index is being
        built in the background, or its files are being listed there.

        Listing a version's files costs a few catalog queries and a count over the marts:
        ~0.2 s at 10M events idle, more while a pipeline runs, which commits a snapshot per
        model. A request never waits for that once an index serves a big lake."""
        if not self.use_index:
            return False
        if version not in self._keys and self._serving_bytes > INLINE_BUILD_BYTES:
            self._follow(version)
            return True
        found = self._files_of(version)
        if found is None:
            return False  # no index at that version: its answers come from SQL
        key = (found[0], found[1])
        if key in self._unusable or found[2] <= INLINE_BUILD_BYTES:
            return False  # index() builds it in the request, or answers come from SQL
        if key in self._indexes and version in self._fresh:
            return False  # index() returns it, and its freshness is known
        # Its index, or only its freshness (a commit that left the marts' files as they were:
        # most of a pass's), is read by the builder: read in the request, that query met the
        # pass's writes to the catalog (seen: ~1 s stalls).
        self._follow(version)
        return True

    def _follow(self, version: int) -> None:
        """Have the builder list the files of this version, or a newer one, and index them."""
        with self._build_lock:
            if self._wanted is None or version > self._wanted:
                self._wanted = version
            if not self._builder_running:
                self._builder_running = True
                threading.Thread(target=self._builder, daemon=True).start()

    def _builder(self) -> None:
        """Index the newest wanted version, one at a time: a pipeline run replaces the marts in
        several commits, and only the last of them is worth indexing. At build_nice: the
        requests answered meanwhile come first (the build's DuckDB threads inherit it)."""
        yield_cpu(self.build_nice)
        while True:
            with self._build_lock:
                version = self._wanted
                if version is None:
                    self._builder_running = False
                    return
            try:
                found = self._files_of(version)
            except Exception:  # the catalog busy past retries: the next request asks again
                log.warning("read index: files of snapshot %d not listed", version, exc_info=True)
                found = None
            if found is not None:
                key = (found[0], found[1])
                idx = self._indexes.get(key)
                if idx is None and key not in self._unusable:
                    idx = self._build(key, version)
                if idx is not None and self._freshness_read(version):
                    self._served(version, found[2])
            with self._build_lock:
                if self._wanted == version:
                    self._wanted = None

    def _freshness_read(self, version: int) -> bool:
        """Read a version's freshness before it is served, so no request reads it."""
        try:
            self.snapshot(version)
            return True
        except Exception:  # the catalog busy past retries: the next request asks again
            log.warning("read index: freshness of snapshot %d not read", version, exc_info=True)
            return False

    def _build(self, key: tuple[Files, Files], version: int) -> Index | None:
        self._unless_memory_only()
        t0 = time.monotonic()
        epoch = self._purge_epoch
        # Updated from the newest index of an earlier snapshot: most of its rows are this
        # one's too, and a data file's deletes then only grow.
        earlier = [i for i in self._indexes.values() if i.version <= version]
        try:
            previous = max(earlier, key=lambda i: i.version, default=None)
            idx = Index(*key, version, previous=previous, pages=self.pages)
            # Each file's live rows in the index must be DuckLake's, or it would silently miss
            # some or answer with deleted ones (deletes inlined in the catalog).
            if (idx.customers.file_rows, idx.event_file_rows) != (key[0].rows, key[1].rows):
                log.warning(
                    "read index rows differ from the marts' (deletes inlined in the catalog);"
                    " answering from SQL"
                )
                self._unusable.add(key)
                return None
        except PagesLost:  # not these files' fault: the next request builds again
            log.warning("event pages process lost during the index build", exc_info=True)
            return None
        except Exception:
            log.exception("read index build failed; answering from SQL")
            self._unusable.add(key)
            return None
        if epoch != self._purge_epoch:  # a Delete finished meanwhile: built from old files
            return None
        # Keep this build and the one before it (scrolls pinned to it may still be reading).
        self._indexes = {k: v for k, v in list(self._indexes.items())[-1:]} | {key: idx}
        log.info("read index built in %.1f s", time.monotonic() - t0)
        return idx

    def _forget(self, idx: Index) -> None:
        self._indexes = {k: v for k, v in self._indexes.items() if v is not idx}
