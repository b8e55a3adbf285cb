"""A benchmark lake: a `mallard init` data dir whose landing files are generated traffic.

Landing files go through the collector's own code: the generator stamps each message with the
collector's `stamp()`, the records are framed into a sealed write-ahead-log segment, and the
roller's `roll_segment()` turns that into landing Parquet. So the files are exactly what a
collector would have written, without 10M HTTP requests. Generation runs one process per core,
each a part of the traffic (bench.generator.Traffic.split), like one collector each.

The pipeline scenario builds a fresh lake and leaves it (with a manifest) for the read API and
freshness scenarios, which reuse it when its size matches or build it otherwise.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.generator import Traffic
from collector.roller import roll_segment
from collector.wal import SEALED_SUFFIX, frame
from mallard.harness import init_data_dir, mallard
from mallard.paths import DataPaths

WORK = Path(__file__).parent / ".work"  # git-ignored; same disk as ./data
MANIFEST = "bench-lake.json"
ROWS_PER_FILE = 50_000  # a busy collector rolls every 2 s: tens of thousands of rows a file

# (events, customers) of the lake each size works on
QUICK = (1_000_000, 100_000)
FULL = (10_000_000, 1_000_000)


def sizes(full: bool, events: int | None, customers: int | None) -> tuple[int, int]:
    """The lake size for --full/--quick, with optional overrides (customers default to 1/10)."""
    ev, cu = FULL if full else QUICK
    if events is not None:
        ev = events
        cu = customers if customers is not None else max(1, events // 10)
    elif customers is not None:
        cu = customers
    return ev, cu


def _next_seq(paths: DataPaths, collector_id: str) -> int:
    seqs = [
        int(p.stem.split("-")[-1])
        for p in paths.landing_dir.glob(f"date=*/{collector_id}-*.parquet")
        if p.stem.split("-")[-1].isdigit()
    ]
    return max(seqs, default=0) + 1


def write_landing(
    data_dir: Path, traffic: Traffic, collector_id: str, rows_per_file: int = ROWS_PER_FILE
) -> tuple[int, int]:
    """Land one traffic model through a log segment and the roller. Returns (rows, files)."""
    paths = DataPaths(data_dir)
    seq = _next_seq(paths, collector_id)
    rows = files = 0
    with tempfile.TemporaryDirectory(dir=data_dir) as wal_dir:
        chunk: list[bytes] = []

        def roll() -> None:
            nonlocal seq, rows, files
            segment = Path(wal_dir) / f"{seq:016d}{SEALED_SUFFIX}"
            segment.write_bytes(b"".join(frame(r) for r in chunk))
            files += len(roll_segment(segment, paths, collector_id))
            rows += len(chunk)
            seq += 1
            chunk.clear()

        for raw in traffic.stored_messages():
            chunk.append(raw)
            if len(chunk) >= rows_per_file:
                roll()
        if chunk:
            roll()
    return rows, files


def generate(
    data_dir: Path, traffic: Traffic, prefix: str, workers: int | None = None
) -> tuple[int, int, float]:
    """Land the traffic with one process per part. Returns (rows, files, seconds)."""
    workers = workers or max(1, min(os.cpu_count() or 1, 8))
    parts = traffic.split(workers)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            pool.submit(write_landing, data_dir, part, f"{prefix}{part.part}") for part in parts
        ]
        done = [f.result() for f in futures]
    return sum(r for r, _ in done), sum(f for _, f in done), time.perf_counter() - t0


@dataclass
class Lake:
    """A benchmark data dir, its demo credentials and the traffic landed in it."""

    data_dir: Path
    creds: dict[str, str]
    events: int
    customers: int
    seed: int
    built: bool = False
    extra_batches: int = 0  # traffic landed since the first build (incremental, rebuilds)
    extra_events: int = 0

    @property
    def paths(self) -> DataPaths:
        return DataPaths(self.data_dir)

    @property
    def traffic(self) -> Traffic:
        """The lake's traffic, sent to the demo tenant `mallard init` made (the API's creds)."""
        return Traffic(
            seed=self.seed,
            customers=self.customers,
            events=self.events,
            client_id=self.creds["clientId"],
            account_id=self.creds["accountId"],
            brand_id=self.creds["brandId"],
        )

    def save(self) -> None:
        d = {**asdict(self), "data_dir": str(self.data_dir)}
        (self.data_dir / MANIFEST).write_text(json.dumps(d, indent=1))

    def land_more(self, events: int) -> int:
        """Land a day of new traffic after what the lake holds: the same customers (some
        identify again, with new trait values), new devices and messages. Returns the rows."""
        base = self.traffic
        self.extra_batches += 1
        more = replace(
            base,
            seed=self.seed * 1000 + self.extra_batches,
            events=events,
            start=base.start + timedelta(days=base.span_days + self.extra_batches),
            span_days=1.0,
        )
        rows, _, _ = generate(self.data_dir, more, "inc")
        self.extra_events += rows
        self.save()
        return rows

    def pipeline_run(self, timeout: float = 7200) -> float:
        """`mallard pipeline run`; returns its wall time in seconds."""
        t0 = time.perf_counter()
        mallard("pipeline", "run", data_dir=self.data_dir, timeout=timeout)
        return time.perf_counter() - t0


def lake_dir(events: int, customers: int, seed: int) -> Path:
    return WORK / f"lake-{events}-{customers}-s{seed}"


def fresh_lake(events: int, customers: int, seed: int = 42) -> Lake:
    """An empty, initialised data dir (any previous one of this size is removed)."""
    d = lake_dir(events, customers, seed)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    lake = Lake(d.resolve(), init_data_dir(d), events, customers, seed)
    lake.save()
    return lake


def load_lake(events: int, customers: int, seed: int = 42) -> Lake | None:
    """The lake of this size a previous scenario built, if any."""
    f = lake_dir(events, customers, seed) / MANIFEST
    if not f.exists():
        return None
    d: dict[str, Any] = json.loads(f.read_text())
    lake = Lake(**{**d, "data_dir": Path(d["data_dir"])})
    return lake if lake.built else None


def ensure_lake(events: int, customers: int, seed: int = 42) -> Lake:
    """A built lake of this size: reused, or generated and built now (not timed)."""
    lake = load_lake(events, customers, seed)
    if lake is not None:
        return lake
    lake = fresh_lake(events, customers, seed)
    rows, files, secs = generate(lake.data_dir, lake.traffic, "gen")
    print(f"landed {rows:,} events in {files} files ({secs:.0f} s); building...", flush=True)
    secs = lake.pipeline_run()
    print(f"built in {secs:.0f} s", flush=True)
    lake.built = True
    lake.save()
    return lake
