"""Ingestion: durable single messages vs a no-op Litestar endpoint, durable batches, and ack
latency at half the maximum load (once the roller has landed the log, before the batches). One
run, one machine, loopback.

    python -m bench.ingest [--full] [--workers N]

--workers N serves with `mallard serve --workers N` (and the no-op endpoint with N processes
too), batches on 4 connections per worker; its figures go to bench/results/ingest-workers<N>.json.

Both servers are real subprocesses started the way users start them (`mallard serve` with
fsync on; the no-op app with the same uvicorn settings); the load generator shares the machine.
When `wrk` is installed (Debian's package), the closed-loop figures are taken again with it: a
generator in C takes less of the 2 cores from the server it measures than the Python one.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from bench.generator import Traffic
from bench.loadgen import Result, build_request, closed_loop, open_loop, run
from bench.stats import row, sample, summarize, write_result
from mallard.harness import REPO, Server, free_port, init_data_dir, wait_http
from mallard.paths import DataPaths

WORK = Path(__file__).parent / ".work"  # same disk as ./data, so fsync costs what it will
HOST = "127.0.0.1"
SERVER_ENV = {
    "MALLARD_RATE_PER_SECOND": "1000000000",  # measure the collector, not the rate limiter
    "MALLARD_RATE_BURST": "1000000000",
}


def bodies(n: int, seed: int = 7) -> list[tuple[str, dict[str, Any]]]:
    """n realistic single calls (action, body) from the traffic generator."""
    out = []
    for msg in Traffic(seed=seed, customers=max(n // 5, 1), events=n).client_messages():
        msg.pop("_receivedAt")
        out.append((msg["type"], msg))
    return out


def wrk_rate(
    url: str,
    requests: list[tuple[str, bytes]],
    headers: dict[str, str],
    seconds: float,
    conns: int,
    work: Path,
) -> tuple[float, int]:
    """(requests/s answered 200, answers that were not 200) of a wrk closed loop that sends
    `requests` (path, body) in turn on `conns` connections, one wrk thread."""
    script = work / "wrk.lua"
    lines = ["local reqs = {}"]
    hdr = "{" + ", ".join(f"[{json.dumps(k)}]={json.dumps(v)}" for k, v in headers.items()) + "}"
    for path, body in requests:
        lines.append(
            f'reqs[#reqs+1] = wrk.format("POST", {json.dumps(path)}, {hdr}, '
            f"{json.dumps(body.decode())})"
        )
    lines.append("local i = 0")
    lines.append("request = function() i = i % #reqs + 1; return reqs[i] end")
    script.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(bad.group(1)) if bad else 0
    return rate * (total - errors) / total if total else 0.0, errors


def wait_landed(data_dir: Path, timeout: float) -> float:
    """Seconds until the collector's log holds no segment but the one being written (every
    earlier one rolled and landed), bounded by timeout."""
    started = time.monotonic()
    wal = DataPaths(data_dir).wal_dir
    while time.monotonic() - started < timeout:
        if len(list(wal.glob("*/*.wal"))) <= 1:
            break
        time.sleep(0.1)
    return time.monotonic() - started


def report_line(label: str, res: Result, per_request: int = 1) -> None:
    lat = summarize(res.latencies_ms) if res.latencies_ms else {}
    print(
        f"{label:<34} {res.rate * per_request:>12,.0f}/s  errors {res.errors:<5} "
        f"p50 {lat.get('p50', 0):6.2f} ms  p99 {lat.get('p99', 0):7.2f} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ingest")
    p.add_argument("--full", action="store_true")
    p.add_argument("--workers", type=int, default=1, help="server processes on the port")
    args = p.parse_args(argv)
    batch_conns = 4 * args.workers
    seconds = 30.0 if args.full else 8.0
    WORK.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=WORK))
    enc = msgspec.json.Encoder()
    calls = bodies(2000)
    batches = [
        enc.encode({"batch": [{**m, "type": a} for a, m in calls[i : i + 100]]})
        for i in range(0, len(calls), 100)
    ]

    noop_port = free_port()
    noop_log = work / "noop.log"
    with open(noop_log, "wb") as log:
        noop = subprocess.Popen(
            [
                sys.executable,
                *("-m", "bench.noop_app", "--port", str(noop_port)),
                *("--workers", str(args.workers)),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    env = {**SERVER_ENV, "MALLARD_SERVE_WORKERS": str(args.workers)}
    server = Server(work / "data", free_port(), init_data_dir(work / "data"), env=env)
    try:
        wait_http(f"http://{HOST}:{noop_port}/health", noop, noop_log, 60)
        server.start()
        hdr = {"content-type": "application/json", "auth-token": server.creds["token"]}
        durable_single = [
            build_request(HOST, server.port, f"{server.base_path}/{a}", enc.encode(m), hdr)
            for a, m in calls
        ]
        noop_single = [
            build_request(HOST, noop_port, "/noop", enc.encode(m), hdr) for _, m in calls
        ]
        durable_batch = [
            build_request(HOST, server.port, f"{server.base_path}/batch", b, hdr) for b in batches
        ]

        # Warm both servers (imports, JIT-free but caches, connection setup).
        run(closed_loop(HOST, noop_port, noop_single, 16, 1.0))
        run(closed_loop(HOST, server.port, durable_single, 16, 1.0))

        conns = 32
        r_noop = run(closed_loop(HOST, noop_port, noop_single, conns, seconds))
        report_line("no-op Litestar endpoint", r_noop)
        r_single = run(closed_loop(HOST, server.port, durable_single, conns, seconds))
        report_line("durable single message", r_single)
        # Half load is measured before the batches, once the roller has landed what the closed
        # loop logged: right after the batches it is still landing hundreds of thousands of
        # messages on the same 2 cores, a load of its own, not half of this one.
        drained = wait_landed(work / "data", 60.0)
        half = r_single.rate / 2
        r_half = run(open_loop(HOST, server.port, durable_single, half, seconds))
        report_line(f"durable single at {half:,.0f} req/s ({drained:.1f} s to land)", r_half)
        r_batch = run(closed_loop(HOST, server.port, durable_batch, batch_conns, seconds))
        report_line("durable batch (100 per request)", r_batch, per_request=100)
        by_wrk: dict[str, tuple[float, int]] = {}
        if shutil.which("wrk"):
            single_paths = [(f"{server.base_path}/{a}", enc.encode(m)) for a, m in calls]
            noop_paths = [("/noop", enc.encode(m)) for _, m in calls]
            batch_paths = [(f"{server.base_path}/batch", b) for b in batches]
            for label, port, reqs, n in (
                ("no-op", noop_port, noop_paths, conns),
                ("single", server.port, single_paths, conns),
                ("batch", server.port, batch_paths, batch_conns),
            ):
                by_wrk[label] = wrk_rate(f"http://{HOST}:{port}", reqs, hdr, seconds, n, work)
                print(f"wrk {label:<30} {by_wrk[label][0]:>12,.0f} req/s", flush=True)
    finally:
        server.stop()
        noop.terminate()
        noop.wait(30)

    ratio = r_single.rate / r_noop.rate if r_noop.rate else 0.0
    half_lat = summarize(r_half.latencies_ms)
    single_lat = summarize(r_single.latencies_ms)
    errors = r_noop.errors + r_single.errors + r_batch.errors + r_half.errors
    errors += sum(e for _, e in by_wrk.values())
    # Goals of issue 39.
    rows = [
        row("no-op Litestar endpoint", round(r_noop.rate), "req/s"),
        row("durable single message", round(r_single.rate), "req/s"),
        row("durable / no-op", round(ratio, 3), "ratio", ">= 0.70", ratio >= 0.70),
        row(
            "durable batch, 100 per request",
            round(r_batch.rate * 100),
            "msgs/s",
            ">= 150,000",
            r_batch.rate * 100 >= 150_000,
        ),
        row("ack p50 at half load", round(half_lat["p50"], 2), "ms"),
        row(
            "ack p99 at half load", round(half_lat["p99"], 2), "ms", "<= 10", half_lat["p99"] <= 10
        ),
        row("ack p99 at full load (32 conns)", round(single_lat["p99"], 2), "ms"),
    ]
    if by_wrk:
        w_ratio = by_wrk["single"][0] / by_wrk["no-op"][0] if by_wrk["no-op"][0] else 0.0
        w_batch = by_wrk["batch"][0] * 100
        rows += [
            row("wrk: no-op Litestar endpoint", round(by_wrk["no-op"][0]), "req/s"),
            row("wrk: durable single message", round(by_wrk["single"][0]), "req/s"),
            row("wrk: durable / no-op", round(w_ratio, 3), "ratio", ">= 0.70", w_ratio >= 0.70),
            row(
                "wrk: durable batch, 100 per request",
                round(w_batch),
                "msgs/s",
                ">= 150,000",
                w_batch >= 150_000,
            ),
        ]
    rows.append(row("non-200 answers", errors, "count", "0", errors == 0))
    write_result(
        "ingest" if args.workers == 1 else f"ingest-workers{args.workers}",
        rows,
        {
            "durable, half load (open loop)": sample(r_half.latencies_ms),
            "durable, full load (32 conns)": sample(r_single.latencies_ms),
            "no-op, full load (32 conns)": sample(r_noop.latencies_ms),
        },
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
