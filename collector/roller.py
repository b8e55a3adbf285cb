"""Rolls sealed log segments into immutable Parquet landing files, exactly one file set each.

A segment's records land in `landing/date=<receive date>/<collector>-<seq>[-<n>].parquet`:
written to a dot-temp file, fsynced, renamed, directory fsynced; only then is the segment
deleted. With MALLARD_LANDING_URL they land on S3 instead, under the collector's own prefix
(`<collector>/date=.../`, mallard/landing.py), one whole PUT each. The names come from the
segment, so a crash at any point is repaired by rolling the segment again: files already
landed are kept, and none is written twice.

The records of calls a regulation dropped (collector.admission) land in no file: they go to the
regulations store's `dropped_events`, before the segment is deleted (again by a second roll).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sqlite3
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from collector.admission import is_dropped_record
from collector.wal import fsync_dir, list_segments, read_records, segment_seq
from mallard import landing
from mallard.distributed import storage
from mallard.paths import DataPaths
from mallard.regulations import ListsUnavailable, RegulationStore
from mallard.schemas import LANDING_SCHEMA, StoredHead

ROLLER_NICENESS = 10  # added to the server's: rolls yield the cores to acknowledging
_decode_head = msgspec.json.Decoder(StoredHead)
_encode = msgspec.json.Encoder().encode


def _head(raw: bytes) -> StoredHead:
    try:
        return _decode_head.decode(raw)
    except msgspec.ValidationError:
        # A record acknowledged before the collector required a string "event" (an object or a
        # number there stopped every roll of its segment and every start of the server): its
        # event column gets the value's JSON text; the message keeps the value itself.
        msg = msgspec.json.decode(raw)
        msg["event"] = _encode(msg.get("event")).decode()
        return msgspec.convert(msg, StoredHead)


def _ts(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def records_to_tables(records: list[bytes]) -> dict[str, pa.Table]:
    """Landing tables keyed by receive date (YYYY-MM-DD); dropped calls' records are left out."""
    by_date: dict[str, dict[str, list[object]]] = {}
    for raw in records:
        if is_dropped_record(raw):
            continue
        h = _head(raw)
        day = h.received_at[:10]
        cols = by_date.get(day)
        if cols is None:
            cols = by_date[day] = {f.name: [] for f in LANDING_SCHEMA}
        cols["event_id"].append(h.event_id)
        cols["message_id"].append(h.message_id)
        cols["client_id"].append(h.client_id)
        cols["account_id"].append(h.account_id)
        cols["brand_id"].append(h.brand_id)
        cols["type"].append(h.type)
        cols["event"].append(h.event)
        cols["user_id"].append(h.user_id)
        cols["anonymous_id"].append(h.anonymous_id)
        cols["timestamp"].append(_ts(h.timestamp))
        cols["received_at"].append(_ts(h.received_at))
        cols["sent_at"].append(_ts(h.sent_at))
        cols["channel"].append(h.channel)
        cols["source"].append(h.source)
        cols["message"].append(raw.decode())
    return {day: pa.table(cols, schema=LANDING_SCHEMA) for day, cols in by_date.items()}


def write_atomic(table: pa.Table, target: Path, tag: str = "") -> None:
    """Writes a Parquet file whole or not at all: a temp file, fsynced, renamed over the name,
    the directory fsynced. `tag` marks the temp file's writer."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # A per-process temp name: a roller orphaned by a killed server may still be finishing the
    # same segment while the next server's recovery rolls it; both produce the same file.
    tmp = target.parent / f".{target.name}.{os.getpid()}{tag}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, target)
    fsync_dir(target.parent)


# How long a roll retries the regulations store (busy, or unreadable for a moment) before it
# leaves the segment for the next recovery: a Delete waits for segments opened before it.
DROPPED_RETRY_S = 30.0


def keep_dropped(paths: DataPaths, records: list[bytes]) -> int:
    """Put the segment's dropped calls into the regulations store; how many were new."""
    rows = []
    for raw in records:
        if is_dropped_record(raw):
            _, reason, account_id, event_id, received_at = msgspec.json.decode(raw)
            at = datetime.fromisoformat(received_at).timestamp()
            rows.append((account_id, event_id, reason, at))
    if not rows:
        return 0
    deadline = time.monotonic() + DROPPED_RETRY_S
    while True:
        try:
            store = RegulationStore(paths)
            try:
                return store.record_dropped(rows)
            finally:
                store.close()
        except (sqlite3.Error, OSError, ListsUnavailable):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def roll_segment(segment: Path, paths: DataPaths, collector_id: str) -> list[Path]:
    """Land one segment's intact records; returns the landing files (new or already there;
    on S3, their names under the landing URL)."""
    try:
        records = list(read_records(segment))
    except FileNotFoundError:  # landed meanwhile by another roller (see write_atomic)
        return []
    seq = segment_seq(segment)
    remote = bool(storage().landing_url)
    out = []
    for day, table in sorted(records_to_tables(records).items()):
        file_name = f"{collector_id}-{seq:016d}.parquet"
        if remote:
            name = landing.remote_name(collector_id, day, file_name)
            if not landing.exists_remote(name):
                landing.write_remote(table, name)
            out.append(Path(name))
            continue
        target = paths.landing_partition(day) / file_name
        if not target.exists():
            write_atomic(table, target)
        out.append(target)
    # After the landing files: a store that cannot be written delays only the dropped records.
    keep_dropped(paths, records)
    segment.unlink(missing_ok=True)
    fsync_dir(segment.parent)
    return out


def recover(wal_dir: Path, paths: DataPaths, collector_id: str) -> int:
    """Land every segment left by a previous run (sealed or not). Returns the next seq."""
    last = 0
    if wal_dir.exists():
        for seg in list_segments(wal_dir):
            last = max(last, segment_seq(seg))
            roll_segment(seg, paths, collector_id)
    return last + 1


def _warm() -> None:
    """Runs in the worker at start, so the first roll does not pay for imports."""


def _exit_with(parent: int) -> None:
    """Worker initializer: exit once the server that started it is gone. A worker waiting for
    work never notices a SIGKILLed server by itself and lived on as an orphan (one per crash,
    seen in the crash tests); a roll it was doing stays in the log for the next recovery.

    The worker also runs at a lower priority than the server: a roll is ~0.1 s of CPU every
    2 s that nothing waits for, and at the server's priority it took the core from requests
    being acknowledged (stalls of 40-60 ms at 2,500 req/s on the 2 cores)."""
    with contextlib.suppress(OSError):
        os.nice(ROLLER_NICENESS)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-server").start()


class Roller:
    """Lands segments as the log seals them, in a separate process.

    Converting records to Parquet is CPU work under the GIL; in the server process it would
    stall request handling for tens of milliseconds every roll. A one-worker process pool
    keeps it off the event loop's core; rolls stay in seal order.
    """

    def __init__(self, paths: DataPaths, collector_id: str) -> None:
        self.paths = paths
        self.collector_id = collector_id
        self._pool: ProcessPoolExecutor | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_exit_with,
            initargs=(os.getpid(),),
        )
        self._pool.submit(_warm)

    def submit(self, segment: Path) -> None:
        assert self._pool is not None, "Roller.start() first"
        fut = self._pool.submit(roll_segment, segment, self.paths, self.collector_id)
        fut.add_done_callback(lambda f: self._check(segment, f))

    def _check(self, segment: Path, fut: Future[list[Path]]) -> None:
        exc = fut.exception()
        if exc is not None:  # the segment stays on disk; the next recovery lands it
            self.errors.append(f"{segment.name}: {exc}")

    def close(self) -> None:
        """Wait until every submitted segment has landed."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
