"""Delivery: `send_email` commands from ingest to an SMTP sink, through the real processes.

    python -m bench.delivery [--commands N] [--per-request K] [--connections C] [--timeout S]

A fresh `mallard init` data dir (bench/.work/delivery/), `mallard serve` on a free loopback
port, the pipeline watcher (`mallard pipeline run --watch`, which dispatches after each pass)
and a loopback SMTP sink (aiosmtpd) in a process of its own, so that it does not share the GIL
with the load generator; the watcher's `MALLARD_SMTP_URL` points at it. The sink writes the
arrival time (CLOCK_MONOTONIC, one clock for every process of the machine) and Message-ID of
each message it takes.

N customers with emails are identified (batches of 100) and loaded by a pass; then N
`send_email` tracks of the transactional asset `welcome`, one per customer, are posted as
fast as the server accepts them (closed loop on C connections; K to a `batch` request, so that
they land within one roll of the log and one pass plans them all), each with its accept time by
messageId and the eventId the answer names. A send's Message-ID is `<sendId@mallard>` and its
sendId is `send_id(eventId, "email", address)` (orchestration/delivery/outbox.py), so each
arrival is matched to its command without reading the outbox.

Figures: emails/s at the sink (count / (last arrival - first arrival)) and end to end (N /
(last arrival - first command accepted)); accepted -> delivered p50/p95/max; exactly once: N
distinct expected messages at the sink, no duplicate, no unexpected one, every outbox send
`sent`. Bounded: the whole run fails after --timeout seconds; every process it starts is
stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.lake import WORK
from bench.loadgen import Conn, build_request, run
from bench.stats import row, sample, summarize, write_result
from mallard.harness import REPO, Server, free_port, init_data_dir
from mallard.offline import TELEMETRY_OFF
from orchestration.delivery.outbox import send_id

HOST = "127.0.0.1"
SERVER_ENV = {"MALLARD_RATE_PER_SECOND": "1000000000", "MALLARD_RATE_BURST": "1000000000"}
GOAL_RATE = 200.0  # emails/s sustained at the sink, on 2 cores
ASSET = "welcome"  # config/assets/welcome: transactional, so no preferences guard
BURST_GAP_S = 2.0  # arrivals further apart than this belong to different dispatches
_MESSAGE_ID = re.compile(rb"^message-id:\s*(\S+)", re.IGNORECASE | re.MULTILINE)


# --- the sink (its own process) -------------------------------------------------------------


def sink_main(port: int, out: Path) -> int:
    """An SMTP server on 127.0.0.1:port that takes every message and appends `<monotonic
    arrival> <Message-ID>` to `out`, flushed per message; prints `ready` once it listens and
    stops on SIGTERM."""
    from aiosmtpd.smtp import SMTP

    log = open(out, "ab", buffering=0)  # noqa: SIM115 - open for the process's life

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]  # noqa: N802
            now = time.monotonic()
            head = envelope.content.split(b"\r\n\r\n", 1)[0]
            m = _MESSAGE_ID.search(head)
            mid = m.group(1) if m else b"-"
            log.write(b"%.6f %s\n" % (now, mid))
            return "250 OK"

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        handler = Handler()
        srv = await loop.create_server(
            lambda: SMTP(handler, hostname="sink.invalid", ident="bench-sink"), HOST, port
        )
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        srv.close()

    run(serve())
    log.close()
    return 0


@dataclass
class Sink:
    out: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"smtp://{HOST}:{self.port}"

    def start(self) -> None:
        self.out.unlink(missing_ok=True)
        self.out.touch()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.delivery", "--sink", str(self.port), str(self.out)],
            cwd=REPO,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the SMTP sink did not start")

    def arrivals(self) -> list[tuple[float, str]]:
        out = []
        for line in self.out.read_bytes().splitlines():
            t, _, mid = line.partition(b" ")
            out.append((float(t), mid.decode()))
        return out

    def count(self) -> int:
        return self.out.read_bytes().count(b"\n")

    def stop(self) -> None:
        stop_process(self.proc, 30)


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; only the given process, by its PID."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Watcher:
    """`mallard pipeline run --watch`, as `make run` runs it: a pass whenever files land, and
    the dispatcher after each pass."""

    def __init__(self, data_dir: Path, smtp_url: str) -> None:
        self.data_dir, self.smtp_url = data_dir, smtp_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir / "bench-delivery-pipeline.log"

    def start(self) -> None:
        env = {
            **os.environ,
            "MALLARD_DATA_DIR": str(self.data_dir),
            "MALLARD_SMTP_URL": self.smtp_url,
            **TELEMETRY_OFF,
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mallard.cli", "pipeline", "run", "--watch"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the pipeline watcher exited {self.proc.returncode}: {self.log}")

    def stop(self) -> None:
        """SIGTERM lets the pass under way finish (bounded)."""
        stop_process(self.proc, 300)


# --- the load -------------------------------------------------------------------------------


def user(i: int) -> tuple[str, str]:
    return f"dl-{i}", f"dl{i}@example.org"


def identify_all(server: Server, n: int) -> None:
    with httpx.Client(base_url=server.base, headers=server.headers, timeout=60) as client:
        for lo in range(0, n, 100):
            batch = [
                {
                    "type": "identify",
                    "userId": user(i)[0],
                    "traits": {"email": user(i)[1], "firstName": f"Dee{i}"},
                    "messageId": f"dl-id-{i}",
                }
                for i in range(lo, min(lo + 100, n))
            ]
            r = client.post("/batch", json={"batch": batch})
            if r.status_code != 200:
                raise RuntimeError(f"identify batch answered {r.status_code}: {r.text[:200]}")


def wait_loaded(server: Server, n: int, deadline: float, watcher: Watcher) -> float:
    """Seconds until the first, the last and every 500th customer's traits answer 200."""
    t0 = time.monotonic()
    probes = sorted({0, n - 1, *range(0, n, 500)})
    with httpx.Client(base_url=server.base, headers=server.headers, timeout=30) as client:
        while probes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"customers not loaded: {len(probes)} probes missing")
            watcher.check()
            r = client.get(f"/profiles/userId:{user(probes[0])[0]}/traits")
            if r.status_code == 200:
                probes.pop(0)
                continue
            time.sleep(0.5)
    return time.monotonic() - t0


async def _post(conn: Conn, request: bytes) -> tuple[int, bytes]:
    """One request on a keep-alive connection: (status, body)."""
    conn.writer.write(request)
    status_line = await conn.reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length = 0
    while True:
        line = await conn.reader.readline()
        if line in (b"\r\n", b""):
            break
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await conn.reader.readexactly(length) if length else b""


@dataclass
class Accepted:
    """Per command i: its eventId and the monotonic time of its 200 (None: refused)."""

    event_ids: list[str | None]
    at: list[float | None]
    refused: int = 0


async def post_commands(
    port: int, server: Server, n: int, connections: int, per_request: int
) -> Accepted:
    """The n commands, `per_request` to a request (1: single `track` calls; more: `batch`
    calls, whose answer lists each message's eventId), as fast as accepted on `connections`
    connections."""
    hdr = {"content-type": "application/json", "auth-token": server.creds["token"]}
    action = "track" if per_request == 1 else "batch"
    path = f"{server.base_path}/{action}"
    acc = Accepted([None] * n, [None] * n)
    it = iter(range(0, n, per_request))

    def command(i: int) -> dict[str, Any]:
        return {
            "type": "track",
            "userId": user(i)[0],
            "event": "send_email",
            "assetId": ASSET,
            "messageId": f"dl-cmd-{i}",
        }

    async def loop() -> None:
        conn = await Conn.open(HOST, port)
        try:
            for lo in it:
                ids = range(lo, min(lo + per_request, n))
                doc: dict[str, Any] = (
                    command(lo) if action == "track" else {"batch": [command(i) for i in ids]}
                )
                body = json.dumps(doc).encode()
                status, answer = await _post(conn, build_request(HOST, port, path, body, hdr))
                if status != 200:
                    acc.refused += len(ids)
                    continue
                now, got = time.monotonic(), json.loads(answer)
                for i, event_id in zip(ids, got.get("eventIds") or [got["eventId"]], strict=True):
                    acc.at[i] = now
                    acc.event_ids[i] = event_id
        finally:
            conn.close()

    await asyncio.gather(*(loop() for _ in range(connections)))
    return acc


def outbox_states(data_dir: Path) -> dict[str, int]:
    """`status[:reason]` -> sends, of the email channel."""
    db = data_dir / "outbox.sqlite"
    if not db.exists():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute(
            "select status, reason, count(*) from sends where channel = 'email' group by 1, 2"
        ).fetchall()
    except sqlite3.OperationalError:  # made, its tables not yet
        return {}
    finally:
        con.close()
    return {(f"{s}:{r}" if r else s): c for s, r, c in rows}


def bursts(times: list[float]) -> list[tuple[float, float, int]]:
    """(first, last, count) of each run of arrivals with no gap over BURST_GAP_S."""
    out: list[tuple[float, float, int]] = []
    for t in times:
        if out and t - out[-1][1] <= BURST_GAP_S:
            first, _, k = out[-1]
            out[-1] = (first, t, k + 1)
        else:
            out.append((t, t, 1))
    return out


# --- the scenario ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.delivery")
    p.add_argument("--full", action="store_true", help="same run (the scenario has one size)")
    p.add_argument("--commands", type=int, default=10_000)
    p.add_argument("--connections", type=int, default=4, help="closed-loop posting connections")
    p.add_argument(
        "--per-request", type=int, default=100, help="commands per request (1: single tracks)"
    )
    p.add_argument("--timeout", type=float, default=900.0, help="fail after this many seconds")
    p.add_argument("--sink", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sink:
        return sink_main(int(args.sink[0]), Path(args.sink[1]))
    n = args.commands
    started = time.monotonic()
    deadline = started + args.timeout

    data_dir = (WORK / "delivery").resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    creds = init_data_dir(data_dir)
    sink = Sink(data_dir / "sink-arrivals.txt")
    server = Server(data_dir, free_port(), creds, env=SERVER_ENV)
    watcher = Watcher(data_dir, sink.url)
    acc = Accepted([], [])
    timed_out = ""
    loaded_s = post_s = 0.0
    states: dict[str, int] = {}
    try:
        sink.start()
        server.start()
        watcher.start()
        t0 = time.monotonic()
        identify_all(server, n)
        loaded_s = wait_loaded(server, n, deadline, watcher)
        print(f"{n:,} customers identified, loaded {loaded_s:.1f} s after", flush=True)
        t0 = time.monotonic()
        acc = run(post_commands(server.port, server, n, args.connections, args.per_request))
        post_s = time.monotonic() - t0
        print(
            f"{n - acc.refused:,} commands accepted in {post_s:.1f} s"
            f" ({(n - acc.refused) / post_s:,.0f}/s), {acc.refused} refused",
            flush=True,
        )
        expected = n - acc.refused
        last_print = 0.0
        while True:
            got = sink.count()
            states = outbox_states(data_dir)
            busy = states.get("pending", 0) + states.get("sending", 0)
            if got >= expected and sum(states.values()) >= expected and not busy:
                break
            if time.monotonic() > deadline:
                timed_out = f"{got:,} of {expected:,} at the sink after {args.timeout:g} s"
                break
            watcher.check()
            if time.monotonic() - last_print >= 10:
                print(f"  at the sink: {got:,}; outbox: {states}", flush=True)
                last_print = time.monotonic()
            time.sleep(0.5)
        time.sleep(2.0)  # a late duplicate would show here
        states = outbox_states(data_dir)
    finally:
        watcher.stop()
        server.stop()
        sink.stop()

    # Each arrival's command, by the Message-ID its send id makes.
    by_mid: dict[str, int] = {}
    for i in range(n):
        if acc.event_ids[i] is not None:
            by_mid[f"<{send_id(acc.event_ids[i], 'email', user(i)[1])}@mallard>"] = i
    arrivals = sink.arrivals()
    seen: dict[str, float] = {}
    duplicates = unexpected = 0
    for t, mid in arrivals:
        if mid not in by_mid:
            unexpected += 1
        elif mid in seen:
            duplicates += 1
        else:
            seen[mid] = t
    expected = len(by_mid)
    delivered = len(seen)
    lat_s = sorted(seen[m] - acc.at[by_mid[m]] for m in seen)  # type: ignore[operator]
    times = sorted(t for t, _ in arrivals)
    first_acc = min((t for t in acc.at if t is not None), default=0.0)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    sink_rate = len(times) / span if span else 0.0
    e2e = delivered / (times[-1] - first_acc) if times and delivered else 0.0
    runs = bursts(times)
    big = max(runs, key=lambda b: b[2]) if runs else (0.0, 0.0, 0)
    big_rate = big[2] / (big[1] - big[0]) if big[1] > big[0] else 0.0
    lat = summarize(lat_s) if lat_s else {"p50": 0.0, "p95": 0.0, "max": 0.0}
    not_sent = sum(c for s, c in states.items() if s != "sent")
    print(
        f"{delivered:,} of {expected:,} delivered ({duplicates} duplicates, {unexpected}"
        f" unexpected); sink {sink_rate:,.1f} emails/s over {span:.1f} s in {len(runs)}"
        f" bursts (largest {big[2]:,} at {big_rate:,.1f}/s); end to end {e2e:,.1f} emails/s;"
        f" accepted -> delivered p50 {lat['p50']:.1f} s p95 {lat['p95']:.1f} s"
        f" max {lat['max']:.1f} s; outbox {states}",
        flush=True,
    )
    if timed_out:
        print(f"timed out: {timed_out}", flush=True)
    once = delivered == expected == n and duplicates == 0 and unexpected == 0 and not not_sent
    rows = [
        row("customers identified (batches of 100), then loaded by a pass", n, "customers"),
        row("  identified -> loaded (traits answer)", round(loaded_s, 1), "s"),
        row(
            f"send_email commands accepted ({args.per_request} a request,"
            f" {args.connections} conns, closed loop)",
            expected,
            "count",
            f"{n:,}",
            expected == n,
        ),
        row("  posting rate", round(expected / post_s) if post_s else 0, "msgs/s"),
        row(
            "delivered: distinct expected messages at the sink",
            delivered,
            "count",
            f"{n:,}",
            delivered == n,
        ),
        row("duplicates at the sink", duplicates, "count", "0", duplicates == 0),
        row("unexpected messages at the sink", unexpected, "count", "0", unexpected == 0),
        row(
            "outbox sends not `sent` (failed, skipped, left)", not_sent, "count", "0", not_sent == 0
        ),
        row("exactly once", "yes" if once else "no", "", "yes", once),
        row(
            "emails at the sink, first -> last arrival",
            round(sink_rate, 1),
            "emails/s",
            f">= {GOAL_RATE:g}",
            sink_rate >= GOAL_RATE and once,
        ),
        row(f"  arrival bursts (gaps > {BURST_GAP_S:g} s between)", len(runs), "count"),
        row("  largest burst", round(big_rate, 1), "emails/s"),
        row("end to end, first accepted -> last arrival", round(e2e, 1), "emails/s"),
        row("accepted -> delivered p50", round(lat["p50"], 1), "s"),
        row("accepted -> delivered p95", round(lat["p95"], 1), "s"),
        row("accepted -> delivered max", round(lat["max"], 1), "s"),
    ]
    if timed_out:
        rows.append(row("bounded run", f"timed out: {timed_out}", "", "finished", False))
    # seconds, shown as ms on the shared latency CDF axis
    write_result("delivery", rows, {"accepted -> delivered": sample([s * 1000 for s in lat_s])})
    return 1 if timed_out else 0


if __name__ == "__main__":
    sys.exit(main())
