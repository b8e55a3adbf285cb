"""Rolls sealed log segments into immutable Parquet landing files, exactly one file set each.

A segment's records land in `landing/date=<receive date>/<collector>-<seq>[-<n>].parquet`:
written to a dot-temp file, fsynced, renamed, directory fsynced; only then is the segment
deleted. The names come from the segment, so a crash at any point is repaired by rolling the
segment again: files already renamed are kept, and none is written twice.
"""

from __future__ import annotations

import os
import queue
import threading
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from collector.wal import fsync_dir, list_segments, read_records, segment_seq
from mallard.paths import DataPaths
from mallard.schemas import LANDING_SCHEMA, StoredHead

_decode_head = msgspec.json.Decoder(StoredHead)


def _ts(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def records_to_tables(records: list[bytes]) -> dict[str, pa.Table]:
    """Landing tables keyed by receive date (YYYY-MM-DD)."""
    by_date: dict[str, dict[str, list[object]]] = {}
    for raw in records:
        h = _decode_head.decode(raw)
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


def _write_atomic(table: pa.Table, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, target)
    fsync_dir(target.parent)


def roll_segment(segment: Path, paths: DataPaths, collector_id: str) -> list[Path]:
    """Land one segment's intact records; returns the landing files (new or already there)."""
    records = list(read_records(segment))
    seq = segment_seq(segment)
    out = []
    for day, table in sorted(records_to_tables(records).items()):
        target = paths.landing_partition(day) / f"{collector_id}-{seq:016d}.parquet"
        if not target.exists():
            _write_atomic(table, target)
        out.append(target)
    segment.unlink()
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


class Roller:
    """A thread that lands segments as the log seals them."""

    def __init__(self, paths: DataPaths, collector_id: str) -> None:
        self.paths = paths
        self.collector_id = collector_id
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="wal-roller", daemon=True)
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def submit(self, segment: Path) -> None:
        self._queue.put(segment)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            seg = self._queue.get()
            if seg is None:
                return
            try:
                roll_segment(seg, self.paths, self.collector_id)
            except Exception as e:  # kept on disk; landed by the next recovery
                self.errors.append(f"{seg.name}: {e}")
