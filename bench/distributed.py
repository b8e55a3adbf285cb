"""The distributed topology against the embedded default, in one run on one machine:
ingest through two collectors vs one, pass time and read latency on the PostgreSQL+S3 lake vs
the embedded one (SQLite catalog, local files) on the same messages; ratios reported.

    python -m bench.distributed [--full] [--messages N]

The distributed side is mallard/topology.py (a real PostgreSQL, moto's S3 server, 2
collectors, 2 API replicas, each a process of its own); the embedded side one `mallard serve`.
Both get the same batches; a pass is `mallard pipeline run` in a process of its own, as a
script would run it (the first pass builds every model, the second is incremental). Reads are
traits lookups by userId through a replica, one connection, after a warm-up. Every process
shares this machine's cores, the load generator and the S3 server included: on one machine
two collectors share what one had, so the ingest ratio says what the topology costs here,
not what a second machine adds (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench.ingest import bodies
from bench.loadgen import Result, build_request, closed_loop, run
from bench.stats import row, sample, summarize, write_result
from mallard.cluster import free_port
from mallard.topology import Deployment

WORK = Path(__file__).parent / ".work"
HOST = "127.0.0.1"
UNLIMITED = {"MALLARD_RATE_PER_SECOND": "1000000000", "MALLARD_RATE_BURST": "1000000000"}


class Embedded:
    """One `mallard serve` on a data dir of its own: the default topology."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLARD_", "AWS_"))}
        self.env.update(
            MALLARD_DATA_DIR=str(root / "data"), DAGSTER_HOME=str(root / "data" / "dagster")
        )
        self.env.update(UNLIMITED)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.creds: dict[str, str] = {}

    def mallard(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "mallard.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise RuntimeError(f"mallard {' '.join(args)}: {out.stderr[-3000:]}")
        return out.stdout

    def start(self) -> Embedded:
        self.creds = json.loads(self.mallard("init", "--json"))
        log = open(self.root / "serve.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{HOST}:{self.port}/health").status_code == 200:
                    return self
            time.sleep(0.2)
        raise RuntimeError("embedded mallard serve did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)


def base_path(creds: dict[str, str]) -> str:
    return f"/track/{creds['clientId']}/{creds['accountId']}/{creds['brandId']}/v1"


def send_all(port: int, creds: dict[str, str], batches: list[bytes]) -> None:
    hdr = {"content-type": "application/json", "auth-token": creds["token"]}
    with httpx.Client(base_url=f"http://{HOST}:{port}", headers=hdr, timeout=60) as client:
        for b in batches:
            r = client.post(f"{base_path(creds)}/batch", content=b)
            r.raise_for_status()


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def wait_landed(what: str, count: Any, want: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count() >= want:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{what}: fewer than {want} messages landed within {timeout:.0f} s")


def lookups(port: int, creds: dict[str, str], users: list[str], n: int) -> list[float]:
    """Traits by userId, one after another on one connection (ms each)."""
    hdr = {"auth-token": creds["token"]}
    rng = random.Random(3)
    out: list[float] = []
    with httpx.Client(base_url=f"http://{HOST}:{port}", headers=hdr, timeout=60) as client:
        for i in range(n + 20):
            user = rng.choice(users)
            t0 = time.perf_counter()
            r = client.get(f"{base_path(creds)}/profiles/userId:{user}/traits")
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"traits of {user}: {r.status_code} {r.text[:200]}")
            if i >= 20:  # the first lookups warm the connection and the lake's caches
                out.append(ms)
    return out


async def _together(*loads: Any) -> list[Result]:
    return list(await asyncio.gather(*loads))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.distributed")
    p.add_argument("--full", action="store_true")
    p.add_argument("--messages", type=int, help="the same input for both lakes (default 20k)")
    args = p.parse_args(argv)
    n = args.messages or (200_000 if args.full else 20_000)
    seconds = 20.0 if args.full else 8.0
    reads = 1000 if args.full else 300
    WORK.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=WORK, prefix="distributed-"))
    enc = msgspec.json.Encoder()
    calls = bodies(n + n // 10)
    users = sorted({m["userId"] for _, m in calls if m.get("userId")})
    batch_of = 100

    def batches(part: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
        return [
            enc.encode({"batch": [{**m, "type": a} for a, m in part[i : i + batch_of]]})
            for i in range(0, len(part), batch_of)
        ]

    first, second = batches(calls[:n]), batches(calls[n:])
    dep = Deployment(work / "distributed", extra_env=UNLIMITED)
    emb = Embedded(work / "embedded")
    (work / "embedded").mkdir(parents=True)
    figures: dict[str, Any] = {}
    try:
        dep.start()
        emb.start()
        c1, c2 = dep.served["collector-1"], dep.served["collector-2"]
        api = dep.served["api-1"]

        # The same input in both: half through each collector, all through the embedded one.
        half = len(first) // 2
        send_all(c1.port, dep.creds, first[:half])
        send_all(c2.port, dep.creds, first[half:])
        send_all(emb.port, emb.creds, first)
        emb_landing = emb.root / "data" / "landing"

        def emb_rows() -> int:
            import pyarrow.parquet as pq

            return sum(pq.read_metadata(f).num_rows for f in emb_landing.glob("date=*/*.parquet"))

        def dep_rows() -> int:
            import pyarrow.parquet as pq

            fs = dep.cluster.s3()
            return sum(
                pq.read_metadata(f"mallard/{k}", filesystem=fs).num_rows
                for k in dep.cluster.s3_keys("landing/")
            )

        def both_passes(key: str, which: str, landed: int) -> None:
            """A pass on each lake once both hold `landed` messages, timed."""
            wait_landed("embedded", emb_rows, landed)
            wait_landed("distributed", dep_rows, landed)
            figures[f"{key}_emb"] = timed(lambda: emb.mallard("pipeline", "run"))
            figures[f"{key}_dep"] = timed(lambda: dep.mallard("pipeline", "run"))
            print(
                f"{which} pass: embedded {figures[f'{key}_emb']:.1f} s, "
                f"PG+S3 {figures[f'{key}_dep']:.1f} s",
                flush=True,
            )

        both_passes("pass1", "first", n)
        send_all(c1.port, dep.creds, second)
        send_all(emb.port, emb.creds, second)
        both_passes("pass2", "second", len(calls))

        lat_emb = lookups(emb.port, emb.creds, users, reads)
        lat_dep = lookups(api.port, dep.creds, users, reads)
        figures["read_emb"], figures["read_dep"] = summarize(lat_emb), summarize(lat_dep)
        print(
            f"traits p50/p99: embedded {figures['read_emb']['p50']:.1f}/"
            f"{figures['read_emb']['p99']:.1f} ms, PG+S3 replica "
            f"{figures['read_dep']['p50']:.1f}/{figures['read_dep']['p99']:.1f} ms",
            flush=True,
        )

        # Ingest: durable batches of 100, 4 connections in all, to one collector, then to two.
        hdr = {"content-type": "application/json", "auth-token": dep.creds["token"]}
        load = first[: min(len(first), 200)]

        def reqs(port: int) -> list[bytes]:
            return [
                build_request(HOST, port, f"{base_path(dep.creds)}/batch", b, hdr) for b in load
            ]

        run(closed_loop(HOST, c1.port, reqs(c1.port), 4, 1.0))  # warm
        run(closed_loop(HOST, c2.port, reqs(c2.port), 4, 1.0))
        one = run(closed_loop(HOST, c1.port, reqs(c1.port), 4, seconds))
        two = run(
            _together(
                closed_loop(HOST, c1.port, reqs(c1.port), 2, seconds),
                closed_loop(HOST, c2.port, reqs(c2.port), 2, seconds),
            )
        )
        figures["ingest_one"] = one.rate * batch_of
        figures["ingest_two"] = sum(r.rate for r in two) * batch_of
        figures["ingest_errors"] = one.errors + sum(r.errors for r in two)
        lat_one = one.latencies_ms
        lat_two = [x for r in two for x in r.latencies_ms]
        print(
            f"ingest: one collector {figures['ingest_one']:,.0f} msgs/s, two "
            f"{figures['ingest_two']:,.0f} msgs/s",
            flush=True,
        )
    finally:
        emb.stop()
        dep.stop()
    shutil.rmtree(work, ignore_errors=True)

    f = figures
    rows = [
        row("messages in each lake", len(calls), "msgs"),
        row("ingest, one collector (batches of 100)", round(f["ingest_one"]), "msgs/s"),
        row("ingest, two collectors (same load)", round(f["ingest_two"]), "msgs/s"),
        row("two collectors / one", round(f["ingest_two"] / f["ingest_one"], 2), "ratio"),
        row("ingest non-200 answers", f["ingest_errors"], "count", "0", f["ingest_errors"] == 0),
        row("first pass, embedded", round(f["pass1_emb"], 1), "s"),
        row("first pass, PostgreSQL+S3", round(f["pass1_dep"], 1), "s"),
        row("first pass PG+S3 / embedded", round(f["pass1_dep"] / f["pass1_emb"], 2), "ratio"),
        row("second pass, embedded", round(f["pass2_emb"], 1), "s"),
        row("second pass, PostgreSQL+S3", round(f["pass2_dep"], 1), "s"),
        row("second pass PG+S3 / embedded", round(f["pass2_dep"] / f["pass2_emb"], 2), "ratio"),
        row("traits p50, embedded", round(f["read_emb"]["p50"], 2), "ms"),
        row("traits p99, embedded", round(f["read_emb"]["p99"], 2), "ms"),
        row("traits p50, PG+S3 replica", round(f["read_dep"]["p50"], 2), "ms"),
        row("traits p99, PG+S3 replica", round(f["read_dep"]["p99"], 2), "ms"),
        row(
            "traits p50 PG+S3 / embedded",
            round(f["read_dep"]["p50"] / f["read_emb"]["p50"], 2),
            "ratio",
        ),
    ]
    write_result(
        "distributed",
        rows,
        {
            "traits, embedded": sample(lat_emb),
            "traits, PG+S3 replica": sample(lat_dep),
            "ingest, one collector": sample(lat_one),
            "ingest, two collectors": sample(lat_two),
        },
    )
    for r in rows:
        print(f"{r['metric']:<42} {r['value']} {r['unit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
