"""Read API latency over HTTP against a real `mallard serve` on the pipeline's lake: traits by
userId and an events page, idle and while `mallard pipeline run` rebuilds after new data.

    python -m bench.read_api [--full] [--events N] [--customers N] [--seed S]

Quick: the 1M-event lake; full: 10M events, 1M customers (built by bench.pipeline, or built here
when missing). Closed loop on keep-alive connections (2 by default): each connection sends its
next request when the answer arrives, so latency is service time plus the little queueing two
clients cause. Every phase is bounded in time and in requests.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import httpx

from bench.lake import Lake, ensure_lake, sizes
from bench.loadgen import Result, build_request, labeled_closed_loop, run
from bench.stats import row, sample, summarize, write_result
from mallard.harness import REPO, Server, free_port
from mallard.offline import TELEMETRY_OFF
from mallard.warehouse import connect

HOST = "127.0.0.1"
SERVER_ENV = {
    "MALLARD_RATE_PER_SECOND": "1000000000",  # measure the reads, not the rate limiter
    "MALLARD_RATE_BURST": "1000000000",
}
TRAITS_GOAL_MS, EVENTS_GOAL_MS = 5.0, 30.0


def sample_user_ids(lake: Lake, n: int = 2000) -> list[str]:
    conn = connect(lake.paths, read_only=True)
    try:
        rows = conn.execute(
            "select user_id from lake.marts.customer_profiles where user_id is not null"
            f" using sample reservoir({n} rows) repeatable ({lake.seed})"
        ).fetchall()
        return sorted(r[0] for r in rows)
    finally:
        conn.close()


def event_queries(lake: Lake) -> list[str]:
    """A mix of realistic event pages: newest first, one action, excluded actions, a day's
    window, oldest first, a deeper page."""
    t = lake.traffic
    day = (t.start + timedelta(days=t.span_days / 2)).date()
    return [
        "size=100",
        "size=100&include=product_viewed",
        "size=100&exclude=page,identify",
        f"size=100&start={day}&end={day + timedelta(days=1)}",
        "size=100&sort=asc",
        "size=50&from=1000",
    ]


def uncached_event_queries(lake: Lake) -> list[str]:
    """Newest-first pages of each hour of the traffic: every page reads a row group no other
    page reads (720 of them at 30 days, several GB decoded), so the read index's row-group cache
    (api/index/, 256 MB) rarely holds it: a page's cost when nobody asked for it just before."""
    t = lake.traffic
    hours = int(t.span_days * 24)
    return [
        f"size=100&start={(t.start + timedelta(hours=h)).strftime('%Y-%m-%dT%H:%M:%SZ')}"
        f"&end={(t.start + timedelta(hours=h + 1)).strftime('%Y-%m-%dT%H:%M:%SZ')}"
        for h in range(hours)
    ]


def check_answers(server: Server, user_id: str, query: str) -> None:
    """The measured requests must return data, not fast 404s or empty pages."""
    r = server.get(f"profiles/userId:{user_id}/traits")
    if r.status_code != 200 or r.json().get("externalId") != user_id:
        raise AssertionError(f"traits of {user_id}: {r.status_code} {r.text[:200]}")
    r = server.get(f"events/?{query}")
    if r.status_code != 200 or not r.json().get("data"):
        raise AssertionError(f"events/?{query}: {r.status_code} {r.text[:200]}")


def wait_for_index(server: Server, timeout: float = 900) -> float:
    """Seconds until the server answers from its in-memory read index (GET /health): until
    then answers come from SQL on the lake, which is not what a warm server serves."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        status = httpx.get(f"{server.url}/health", timeout=10).json().get("readIndex") or {}
        if status.get("indexed"):
            return time.perf_counter() - t0
        time.sleep(0.5)
    raise AssertionError(f"the read index was not built within {timeout:.0f} s")


def print_line(label: str, res: Result) -> None:
    lat = summarize(res.latencies_ms) if res.latencies_ms else {}
    print(
        f"{label:<28} {res.requests + res.errors:>7,} req  errors {res.errors:<4} "
        f"p50 {lat.get('p50', 0):7.2f} ms  p99 {lat.get('p99', 0):7.2f} ms  "
        f"max {lat.get('max', 0):8.2f} ms",
        flush=True,
    )


def latency_rows(label: str, res: Result, goal_ms: float) -> list[dict[str, object]]:
    if not res.latencies_ms:
        return [row(f"{label}: no answers", 0, "requests", f"p99 <= {goal_ms:g} ms", False)]
    lat = summarize(res.latencies_ms)
    return [
        row(f"{label} p50", round(lat["p50"], 2), "ms"),
        row(f"{label} p99", round(lat["p99"], 2), "ms", f"<= {goal_ms:g}", lat["p99"] <= goal_ms),
        row(f"{label} max", round(lat["max"], 2), "ms"),
    ]


def served_after(
    server: Server, lake: Lake, pipeline: subprocess.Popen[bytes]
) -> tuple[Callable[[], bool], list[float]]:
    """When the reads "during the rebuild" stop: once the pipeline has exited and the API
    answers from the snapshot it left, so the read index's update after the pass is measured
    too. Checked on a thread of its own (the load generator's loop is not held up); also
    gives the seconds from the pipeline's exit to those answers (bounded: 300 s)."""
    done = threading.Event()
    took = [0.0]

    def watch() -> None:
        while pipeline.poll() is None:
            time.sleep(0.1)
        ended = time.perf_counter()
        conn = connect(lake.paths, read_only=True)
        try:
            current = conn.execute("select id from lake.current_snapshot()").fetchone()
        finally:
            conn.close()
        final = str(current[0]) if current else ""
        while time.perf_counter() - ended < 300:
            if server.get("events/?size=1").headers.get("x-mallard-snapshot") == final:
                break
            time.sleep(0.2)
        took[0] = time.perf_counter() - ended
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    return done.is_set, took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.read_api")
    p.add_argument("--full", action="store_true")
    p.add_argument("--events", type=int)
    p.add_argument("--customers", type=int)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--connections", type=int, default=2, help="closed-loop clients (1-4)")
    args = p.parse_args(argv)
    events, customers = sizes(args.full, args.events, args.customers)
    seconds = 30.0 if args.full else 12.0  # per idle phase
    limit = 50_000 if args.full else 20_000  # requests per phase
    rebuild_cap = 3600.0 if args.full else 900.0  # seconds of measuring during the rebuild
    increment = min(100_000, max(1, events // 10))
    conns = max(1, min(args.connections, 4))

    lake = ensure_lake(events, customers, args.seed)
    users = sample_user_ids(lake)
    if not users:
        print("no identified customers in the lake")
        return 1
    server = Server(lake.data_dir, free_port(), lake.creds, env=SERVER_ENV)
    server.start()
    hdr = {"auth-token": lake.creds["token"], "accept": "application/json"}

    def get(path: str) -> bytes:
        return build_request(HOST, server.port, f"{server.base_path}/{path}", b"", hdr, "GET")

    pipeline: subprocess.Popen[bytes] | None = None
    try:  # the server is stopped whatever fails, the first checks included
        check_answers(server, users[0], event_queries(lake)[0])
        index_s = wait_for_index(server)
        print(f"read index ready after {index_s:.1f} s", flush=True)
        traits = [("traits", get(f"profiles/userId:{u}/traits")) for u in users]
        pages = [("events", get(f"events/?{q}")) for q in event_queries(lake)]
        mixed = [x for i, t in enumerate(traits) for x in (t, pages[i % len(pages)])]
        run(labeled_closed_loop(HOST, server.port, mixed, conns, 3.0))  # warm caches
        idle_traits = run(labeled_closed_loop(HOST, server.port, traits, conns, seconds, limit))
        print_line("traits by userId, idle", idle_traits["traits"])
        idle_events = run(labeled_closed_loop(HOST, server.port, pages, conns, seconds, limit))
        print_line("events page, idle", idle_events["events"])
        cold = [("events", get(f"events/?{q}")) for q in uncached_event_queries(lake)]
        cold_events = run(labeled_closed_loop(HOST, server.port, cold, conns, seconds, limit))
        print_line("events page, uncached, idle", cold_events["events"])
        idle_mixed = run(labeled_closed_loop(HOST, server.port, mixed, conns, seconds, limit))
        print_line("traits, idle (mixed)", idle_mixed["traits"])
        print_line("events, idle (mixed)", idle_mixed["events"])

        snap_before = server.get("events/?size=1").headers.get("x-mallard-snapshot")
        added = lake.land_more(increment)
        print(f"landed {added:,} new events; rebuilding while reading...", flush=True)
        log = open(lake.data_dir / "bench-rebuild.log", "wb")  # noqa: SIM115 - closed below
        t0 = time.perf_counter()
        pipeline = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", "pipeline", "run"],
            cwd=REPO,
            env={**os.environ, "MALLARD_DATA_DIR": str(lake.data_dir), **TELEMETRY_OFF},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        caught_up, catch_up_s = served_after(server, lake, pipeline)
        during = run(
            labeled_closed_loop(HOST, server.port, mixed, conns, rebuild_cap, until=caught_up)
        )
        rc = pipeline.wait(timeout=7200)
        rebuild_s = time.perf_counter() - t0
        log.close()
        snap_after = server.get("events/?size=1").headers.get("x-mallard-snapshot")
        print_line("traits, during rebuild", during["traits"])
        print_line("events, during rebuild", during["events"])
        print(
            f"rebuild took {rebuild_s:.1f} s (exit {rc}); answers from it"
            f" {catch_up_s[0]:.1f} s after it ended",
            flush=True,
        )
    finally:
        if pipeline is not None and pipeline.poll() is None:
            pipeline.terminate()
            pipeline.wait(60)
        server.stop()

    errors = sum(
        r.errors
        for d in (idle_traits, idle_events, cold_events, idle_mixed, during)
        for r in d.values()
    )
    rows = [
        row("lake size: events", lake.events + lake.extra_events, "events"),
        row("lake size: customers (traffic model)", lake.customers, "customers"),
        row("closed-loop connections", conns, "count"),
        row("read index built after the server started", round(index_s, 1), "s"),
        *latency_rows("traits by userId, idle", idle_traits["traits"], TRAITS_GOAL_MS),
        *latency_rows("events page, idle", idle_events["events"], EVENTS_GOAL_MS),
        *latency_rows("events page, uncached, idle", cold_events["events"], EVENTS_GOAL_MS),
        *latency_rows("traits, during rebuild (mixed)", during["traits"], TRAITS_GOAL_MS),
        *latency_rows("events page, during rebuild (mixed)", during["events"], EVENTS_GOAL_MS),
        row("traits, idle (mixed) p99", round(_p99(idle_mixed["traits"]), 2), "ms"),
        row("events page, idle (mixed) p99", round(_p99(idle_mixed["events"]), 2), "ms"),
        row("rebuild during reads (+ new events)", round(rebuild_s, 1), "s", "exit 0", rc == 0),
        row("  answers from it, after it ended", round(catch_up_s[0], 1), "s"),
        row(
            "answers moved to the new build",
            f"snapshot {snap_before} -> {snap_after}",
            "",
            "changed",
            snap_before != snap_after,
        ),
        row("non-200 answers", errors, "count", "0", errors == 0),
    ]
    write_result(
        "read_api",
        rows,
        {
            "traits, idle": sample(idle_traits["traits"].latencies_ms),
            "events page, idle": sample(idle_events["events"].latencies_ms),
            "events page, uncached, idle": sample(cold_events["events"].latencies_ms),
            "traits, during rebuild": sample(during["traits"].latencies_ms),
            "events page, during rebuild": sample(during["events"].latencies_ms),
        },
    )
    return 0


def _p99(res: Result) -> float:
    return summarize(res.latencies_ms)["p99"] if res.latencies_ms else 0.0


if __name__ == "__main__":
    sys.exit(main())
