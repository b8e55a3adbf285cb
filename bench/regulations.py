"""A Delete under load: one SUPPRESS_WITH_DELETE regulation of 100 users, filed over HTTP on a
real `mallard serve` of the benchmark lake while single durable messages of other users keep
arriving; the time from the POST to `finished`, its steps, its evidence, and ingestion before
and during the Delete.

    python -m bench.regulations [--full] [--events N] [--customers N] [--rate R]

The Delete rewrites landing files and lake files and expires snapshots, so it runs on a copy
of the lake's data dir, and the shared lake stays as the other scenarios use it. The copy
hard-links every Parquet file (landing and lake files are never written in place: a rewrite is
a new file, or a temp file renamed over the name, so the link keeps the shared lake's version)
and copies everything else (the catalog, the stores, Dagster's instance, logs: changed in
place); the copy's catalog is pointed at its own files. On one filesystem the copy costs the
non-Parquet bytes only; the Delete then needs free space for the files it rewrites (checked
first). Every Parquet file of the shared lake is checked unchanged afterwards; if one did
change, the lake is marked for rebuild.

The server starts the regulation's run itself (`mallard regulations run ID`, a detached
process). The load is an open loop at a fixed rate (a collector's steady traffic; `--rate 0`: a
closed loop at the maximum, the collector's capacity while the Delete shares the cores), from a
baseline window before the POST until the GET shows the regulation finished (bounded: 20
minutes). The subjects are users with events, chosen with the lake's seed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
import warnings
from array import array
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench.generator import Traffic
from bench.lake import MANIFEST, WORK, ensure_lake, sizes
from bench.loadgen import Conn, build_request, run
from bench.stats import row, sample, summarize, write_result
from mallard.harness import Server, free_port, relocate_catalog
from mallard.paths import DataPaths
from mallard.warehouse import connect

HOST = "127.0.0.1"
SERVER_ENV = {
    "MALLARD_RATE_PER_SECOND": "1000000000",  # measure ingestion and the Delete, not the limiter
    "MALLARD_RATE_BURST": "1000000000",
}
GOAL_S = 300.0  # Segment promises 30 days
SLOT = b"0" * 10  # the part of a load message's messageId each send numbers
KEEP_UP = 0.95  # open loop: the share of the offered rate the collector answers during the Delete


# --- the copy of the data dir ---------------------------------------------------------------------


@dataclass
class Copied:
    seconds: float
    linked_bytes: int
    copied_bytes: int
    files: int


def tree_bytes(root: Path) -> tuple[int, int]:
    """(Parquet bytes, other bytes) of the regular files under root."""
    parquet = other = 0
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            if p.suffix == ".parquet":
                parquet += p.stat().st_size
            else:
                other += p.stat().st_size
    return parquet, other


def parquet_stats(root: Path) -> dict[str, tuple[int, int, int]]:
    """Per Parquet file under root: (inode, size, mtime in ns), to tell whether one changed."""
    out = {}
    for p in root.rglob("*.parquet"):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def copy_data_dir(src: Path, dst: Path) -> Copied:
    """A copy of the data dir `src` at `dst`: Parquet files hard-linked (copied when a link is
    refused), the rest copied, symlinks kept; the bench manifest left out."""
    t0 = time.perf_counter()
    shutil.rmtree(dst, ignore_errors=True)
    linked = copied = files = 0
    for root, dirs, names in os.walk(src):
        here = Path(root)
        there = dst / here.relative_to(src)
        there.mkdir(parents=True, exist_ok=True)
        for name in [d for d in dirs if (here / d).is_symlink()]:
            os.symlink(os.readlink(here / name), there / name)
            dirs.remove(name)
        for name in names:
            s, d = here / name, there / name
            if here == src and name == MANIFEST:
                continue
            files += 1
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
                continue
            size = s.stat().st_size
            if name.endswith(".parquet"):
                try:
                    os.link(s, d)
                    linked += size
                    continue
                except OSError:
                    pass
            shutil.copy2(s, d)
            copied += size
    return Copied(time.perf_counter() - t0, linked, copied, files)


# --- the subjects ---------------------------------------------------------------------------------


@dataclass
class Subjects:
    user_ids: list[str]
    strings: list[str]  # every identifier of theirs (userIds, anonymousIds, emails, customer ids)
    events: int  # their rows in marts.events
    eligible: int  # users the choice was made from
    others: list[str]  # users who stay (checked still served afterwards)


def choose_subjects(paths: DataPaths, account_id: str, n: int, seed: int) -> Subjects:
    """n users of the account with events, seeded. Also 20 other such users, who are not
    deleted."""
    conn = connect(paths, read_only=True)
    try:
        eligible = sorted(
            r[0]
            for r in conn.execute(
                """
                with with_events as (
                    select distinct customer_id from lake.marts.events where account_id = $a
                )
                select distinct c.user_id from lake.marts.customers c
                where c.account_id = $a and c.user_id is not null
                  and c.customer_id in (select customer_id from with_events)
                """,
                {"a": account_id},
            ).fetchall()
        )
        if len(eligible) < n + 20:
            raise RuntimeError(f"only {len(eligible)} users to choose {n} subjects from")
        picked = random.Random(seed).sample(eligible, n + 20)
        chosen, others = sorted(picked[:n]), sorted(picked[n:])
        customers = [
            r[0]
            for r in conn.execute(
                "select customer_id from lake.marts.customers where account_id = $a"
                " and user_id in (select unnest($u))",
                {"a": account_id, "u": chosen},
            ).fetchall()
        ]
        values = [
            r[0]
            for r in conn.execute(
                "select distinct id_value from lake.marts.customer_identifiers"
                " where customer_id in (select unnest($c))",
                {"c": customers},
            ).fetchall()
        ]
        row_ = conn.execute(
            "select count(*) from lake.marts.events where customer_id in (select unnest($c))",
            {"c": customers},
        ).fetchone()
    finally:
        conn.close()
    strings = sorted({*chosen, *values, *customers})
    return Subjects(chosen, strings, int(row_[0]) if row_ else 0, len(eligible), others)


# --- the ingest load ------------------------------------------------------------------------------


def load_bodies(n: int, subjects: Subjects) -> list[tuple[str, bytes]]:
    """n single calls (action, JSON body) of users who are not in the lake: the generator's
    traffic with its userIds and emails renamed (lg-<n>, lg<n>@example.org; its anonymousIds
    are of another seed). None names any identifier of the subjects. Each messageId holds a
    slot of zeros (SLOT) each send fills with its own number (`numbered`), so every message
    sent is a new one, not a duplicate the pipeline drops."""
    enc = msgspec.json.Encoder()
    out = []
    for k, msg in enumerate(Traffic(seed=7, customers=max(n // 5, 1), events=n).client_messages()):
        for key in ("_receivedAt", "timestamp", "sentAt"):  # live traffic: the time is now
            msg.pop(key, None)
        msg["messageId"] = f"lg-{SLOT.decode()}-{k}"
        if "userId" in msg:
            msg["userId"] = "lg-" + msg["userId"].removeprefix("user-")
        traits = msg.get("traits")
        if traits and "email" in traits:
            traits["email"] = traits["email"].replace("user", "lg").replace(".com", ".org")
        out.append((msg["type"], enc.encode(msg)))
    pattern = re.compile(b"|".join(re.escape(s.encode()) for s in subjects.strings))
    clash = [b for _, b in out if pattern.search(b)]
    if clash:
        raise AssertionError(f"a load message names a subject: {clash[0][:200]!r}")
    return out


def numbered(request: bytes, i: int) -> bytes:
    """The request with its messageId's slot set to i (same length: content-length holds)."""
    at = request.index(b"lg-" + SLOT) + 3
    return request[:at] + b"%0*d" % (len(SLOT), i) + request[at + len(SLOT) :]


@dataclass
class Load:
    """Every request of the load: when it was due (open loop) or sent, when its answer came,
    and its status (-1: the connection failed)."""

    due: array[float] = field(default_factory=lambda: array("d"))
    done: array[float] = field(default_factory=lambda: array("d"))
    status: array[int] = field(default_factory=lambda: array("i"))
    started: float = 0.0

    def add(self, due: float, status: int) -> None:
        self.due.append(due)
        self.done.append(time.perf_counter())
        self.status.append(status)

    def window(self, t0: float, t1: float) -> tuple[float, list[float], int]:
        """(answers 200 per second completed in [t0, t1), latencies in ms of the requests due
        in it, non-200 answers due in it)."""
        ok = sum(
            1 for d, s in zip(self.done, self.status, strict=True) if t0 <= d < t1 and s == 200
        )
        lat = [(d - q) * 1000 for q, d in zip(self.due, self.done, strict=True) if t0 <= q < t1]
        errors = sum(
            1 for q, s in zip(self.due, self.status, strict=True) if t0 <= q < t1 and s != 200
        )
        return ok / (t1 - t0) if t1 > t0 else 0.0, lat, errors


async def _send(conn: Conn, request: bytes, port: int) -> tuple[Conn, int]:
    """Send one request; on a failed connection, count -1 and go on with a new one."""
    try:
        return conn, await conn.send(request)
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
        conn.close()
        with contextlib.suppress(OSError):
            conn = await Conn.open(HOST, port)
        return conn, -1


async def steady_load(
    port: int,
    requests: list[bytes],
    rate: float,
    stop: threading.Event,
    max_seconds: float,
    load: Load,
    connections: int,
) -> None:
    """Open loop at `rate` requests per second (latency counts from each request's due time),
    or a closed loop on `connections` connections when rate is 0; until `stop` is set or
    `max_seconds` have passed."""
    conns = [await Conn.open(HOST, port) for _ in range(connections)]
    load.started = time.perf_counter()
    end = load.started + max_seconds
    if rate <= 0:

        async def loop(k: int) -> None:
            i = k
            while not stop.is_set() and time.perf_counter() < end:
                due = time.perf_counter()
                request = numbered(requests[i % len(requests)], i)
                conns[k], status = await _send(conns[k], request, port)
                load.add(due, status)
                i += connections

        await asyncio.gather(*(loop(k) for k in range(connections)))
    else:
        free: asyncio.Queue[Conn] = asyncio.Queue()
        for c in conns:
            free.put_nowait(c)
        tasks: set[asyncio.Task[None]] = set()

        async def one(due: float, request: bytes) -> None:
            conn = await free.get()
            try:
                conn, status = await _send(conn, request, port)
            finally:
                free.put_nowait(conn)
            load.add(due, status)

        i = 0
        while not stop.is_set():
            due = load.started + i / rate
            if due >= end:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t = asyncio.create_task(one(due, numbered(requests[i % len(requests)], i)))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
        await asyncio.gather(*tasks)
        conns = []
        while not free.empty():
            conns.append(free.get_nowait())
    for c in conns:
        c.close()


# --- the regulation -------------------------------------------------------------------------------


def regulation_pid(paths: DataPaths, regulation_id: str) -> int | None:
    """The PID of the regulation's live run (mallard/regulation_runs.py writes it), if any."""
    try:
        return int((paths.run_dir / "regulations" / f"{regulation_id}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_run_exit(paths: DataPaths, regulation_id: str, timeout: float) -> bool:
    """Whether the regulation's run process is gone within `timeout`."""
    pid = regulation_pid(paths, regulation_id)
    deadline = time.monotonic() + timeout
    while pid is not None and alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def stop_run(paths: DataPaths, regulation_id: str) -> None:
    """Stop the regulation's run and what it started, by its PID (checked to be that run's):
    it runs in a session of its own, so its process group is its PID."""
    pid = regulation_pid(paths, regulation_id)
    if pid is None or not alive(pid):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return
    if b"regulations" not in cmdline or regulation_id.encode() not in cmdline:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        if wait_run_exit(paths, regulation_id, 30):
            return


def step_times(paths: DataPaths, regulation_id: str) -> tuple[list[tuple[str, float, str]], float]:
    """The Dagster steps of the regulation's run(s) in the copy's instance: (step, seconds,
    status) in order, and the first run's start (epoch seconds; 0 when none)."""
    import dagster as dg

    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        records = instance.get_run_records(dg.RunsFilter(tags={"regulation": regulation_id}))
        records = sorted(records, key=lambda r: r.start_time or 0)
        steps = []
        for rec in records:
            stats = instance.get_run_step_stats(rec.dagster_run.run_id)
            for s in sorted(stats, key=lambda s: s.start_time or 0):
                if s.start_time is not None and s.end_time is not None:
                    status = s.status.value.lower() if s.status else "?"
                    steps.append((s.step_key, s.end_time - s.start_time, status))
        first = next((r.start_time for r in records if r.start_time), 0.0)
    return steps, float(first or 0.0)


def epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wait_for_index(server: Server, timeout: float = 900) -> float:
    """Seconds until the server answers from its read index (its build is start-up work, not
    part of the baseline)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        with contextlib.suppress(httpx.HTTPError):
            status = httpx.get(f"{server.url}/health", timeout=10).json().get("readIndex") or {}
            if status.get("indexed"):
                return time.perf_counter() - t0
        time.sleep(0.5)
    raise AssertionError(f"the read index was not built within {timeout:.0f} s")


# --- the scenario ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    regulation_id: str = ""
    post_status: int = 0
    post_ms: float = 0.0
    status: str = "not filed"
    answer: dict[str, Any] = field(default_factory=dict)
    seen_s: float | None = None  # POST sent -> first GET answering finished (or failed)
    polls: int = 0
    poll_errors: int = 0


def file_and_follow(server: Server, user_ids: list[str], timeout: float, out: Outcome) -> float:
    """POST the regulation, GET it every second until finished or failed (or `timeout`), into
    `out`. Returns the time (perf_counter) the POST was sent."""
    body = {
        "regulationType": "SUPPRESS_WITH_DELETE",
        "subject": {"type": "USER_ID", "ids": user_ids},
    }
    with httpx.Client(base_url=server.base, headers=server.headers, timeout=30) as client:
        posted = time.perf_counter()
        r = client.post("/regulations", json=body)
        out.post_ms = (time.perf_counter() - posted) * 1000
        out.post_status = r.status_code
        if r.status_code != 200:
            out.status = f"POST {r.status_code}: {r.text[:200]}"
            return posted
        out.regulation_id = r.json()["regulationId"]
        out.status = r.json()["status"]
        while time.perf_counter() - posted < timeout:
            time.sleep(1.0)
            out.polls += 1
            try:
                g = client.get(f"/regulations/{out.regulation_id}")
            except httpx.HTTPError:
                out.poll_errors += 1
                continue
            if g.status_code != 200:
                out.poll_errors += 1
                continue
            out.answer = g.json()
            out.status = out.answer["status"]
            if out.status in ("finished", "failed"):
                out.seen_s = time.perf_counter() - posted
                break
    return posted


def served(server: Server, user_ids: list[str], code: int) -> int:
    """How many of the users' traits answer `code`."""
    with httpx.Client(base_url=server.base, headers=server.headers, timeout=30) as client:
        return sum(
            1 for u in user_ids if client.get(f"/profiles/userId:{u}/traits").status_code == code
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.regulations")
    p.add_argument("--full", action="store_true")
    p.add_argument("--events", type=int)
    p.add_argument("--customers", type=int)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--subjects", type=int, default=100, help="userIds in the Delete")
    p.add_argument(
        "--rate", type=float, default=500.0, help="ingest messages/s (0: closed loop at the max)"
    )
    p.add_argument("--baseline", type=float, default=20.0, help="seconds of load before the POST")
    p.add_argument("--timeout", type=float, default=1200.0, help="give up on the Delete after")
    p.add_argument("--keep", action="store_true", help="keep the copy of the data dir")
    args = p.parse_args(argv)
    events, customers = sizes(args.full, args.events, args.customers)
    warmup = 3.0  # seconds of load before the baseline window (connections, caches)

    lake = ensure_lake(events, customers, args.seed)
    copy = DataPaths((WORK / f"regulations-{lake.data_dir.name}").resolve())
    parquet, other = tree_bytes(lake.data_dir)
    free = shutil.disk_usage(WORK).free
    # The copy's own bytes, plus new files for what the Delete rewrites (up to every Parquet
    # file, the hard-linked originals staying), plus room for the pipeline's passes.
    need = other + parquet + (2 << 30)
    if free < need:
        print(f"not enough free space for the copy and its Delete: {free:,} < {need:,} bytes")
        return 1
    before = parquet_stats(lake.data_dir)
    copied = copy_data_dir(lake.data_dir, copy.root)
    relocate_catalog(lake.paths.root, copy.root)
    print(
        f"copied the data dir in {copied.seconds:.1f} s: {copied.copied_bytes / 2**20:,.0f} MiB"
        f" copied, {copied.linked_bytes / 2**20:,.0f} MiB of Parquet hard-linked",
        flush=True,
    )
    server: Server | None = None
    loader: threading.Thread | None = None
    stop = threading.Event()
    out = Outcome()
    try:
        subjects = choose_subjects(copy, lake.creds["accountId"], args.subjects, args.seed)
        print(
            f"{len(subjects.user_ids)} subjects ({subjects.events:,} events) chosen from"
            f" {subjects.eligible:,} users",
            flush=True,
        )
        server = Server(copy.root, free_port(), lake.creds, env=SERVER_ENV)
        server.start()
        index_s = wait_for_index(server)
        print(f"read index ready after {index_s:.1f} s", flush=True)
        hdr = {"content-type": "application/json", "auth-token": lake.creds["token"]}
        requests = [
            build_request(HOST, server.port, f"{server.base_path}/{a}", b, hdr)
            for a, b in load_bodies(2000, subjects)
        ]
        load = Load()
        conns = 64 if args.rate > 0 else 8
        limit = warmup + args.baseline + args.timeout + 60
        loader = threading.Thread(
            target=run,
            args=(steady_load(server.port, requests, args.rate, stop, limit, load, conns),),
            name="ingest-load",
        )
        loader.start()
        time.sleep(warmup + args.baseline)
        posted = file_and_follow(server, subjects.user_ids, args.timeout, out)
        ended = time.perf_counter()
        stop.set()
        loader.join()
        print(f"regulation {out.regulation_id}: {out.status} after {ended - posted:.1f} s")
        if out.regulation_id:
            # The run still works a moment after it shows finished; its last word is read once
            # it has exited (bounded; stopped when it does not end).
            live = out.status in ("finished", "failed")
            if not live or not wait_run_exit(copy, out.regulation_id, 120):
                stop_run(copy, out.regulation_id)
            last = server.get(f"regulations/{out.regulation_id}")
            if last.status_code == 200:
                out.answer = last.json()
                out.status = out.answer["status"]
        gone = served(server, subjects.user_ids, 404) if out.status == "finished" else 0
        kept = served(server, subjects.others, 200)
    finally:
        stop.set()
        if loader is not None:
            loader.join()
        if out.regulation_id:
            stop_run(copy, out.regulation_id)
        if server is not None:
            server.stop()
    steps, run_started = step_times(copy, out.regulation_id) if out.regulation_id else ([], 0.0)
    changed = sum(1 for k, v in parquet_stats(lake.data_dir).items() if before.get(k, v) != v)
    changed += sum(1 for k in before if not (lake.data_dir / k).exists())
    if changed:
        lake.built = False  # the next scenario builds it again
        lake.save()
        print(f"{changed} Parquet files of the shared lake changed: it is marked for rebuild")
    if not args.keep:
        shutil.rmtree(copy.root, ignore_errors=True)

    base_t0 = load.started + warmup
    before_rate, before_lat, before_err = load.window(base_t0, posted)
    during_rate, during_lat, during_err = load.window(posted, ended)
    errors = sum(1 for s in load.status if s != 200)
    ratio = during_rate / before_rate if before_rate else 0.0
    ev = out.answer.get("evidence") or {}
    deleted = sum((ev.get("rowsDeleted") or {}).values())
    created, finished = epoch(out.answer.get("createdAt")), epoch(out.answer.get("finishedAt"))
    print_load("ingest before the Delete", before_rate, before_lat, before_err)
    print_load("ingest during the Delete", during_rate, during_lat, during_err)
    for step, secs, status in steps:
        print(f"  step {step:<20} {secs:8.1f} s  {status}")
    print(f"evidence: {json.dumps(ev)}", flush=True)

    n = len(subjects.user_ids)
    loop = f"open loop, {args.rate:g} msgs/s" if args.rate > 0 else f"closed loop, {conns} conns"
    rows = [
        row("lake size: events", lake.events + lake.extra_events, "events"),
        row("data dir copy (Parquet hard-linked), not timed", round(copied.seconds, 1), "s"),
        row("  bytes copied", round(copied.copied_bytes / 2**20), "MiB"),
        row("  bytes hard-linked", round(copied.linked_bytes / 2**20), "MiB"),
        row("subjects (userIds in one SUPPRESS_WITH_DELETE)", n, "users"),
        row("  their events in marts.events", subjects.events, "events"),
        row("ingest load", loop, ""),
        row("POST regulations answer", out.post_status, "status", "200", out.post_status == 200),
        row("POST regulations latency", round(out.post_ms, 1), "ms"),
        row("regulation status", out.status, "", "finished", out.status == "finished"),
        row(
            "POST -> finished (seen by GET every 1 s)",
            round(out.seen_s, 1) if out.seen_s is not None else f"> {args.timeout:g}",
            "s",
            f"<= {GOAL_S:g}",
            out.status == "finished" and out.seen_s is not None and out.seen_s <= GOAL_S,
        ),
    ]
    if created and finished:
        rows.append(
            row("  createdAt -> finishedAt (its stamps)", round(finished - created, 1), "s")
        )
    if created and run_started:
        rows.append(row("  filed -> Dagster run started", round(run_started - created, 1), "s"))
    rows += [row(f"  step {step}", round(secs, 1), "s", "", None) for step, secs, _ in steps]
    failed_steps = [s for s, _, status in steps if status != "success"]
    if failed_steps:
        rows.append(row("  steps not succeeded", ", ".join(failed_steps), "", "none", False))
    rows += [
        row("ingest before the Delete", round(before_rate), "msgs/s"),
        row("ingest during the Delete", round(during_rate), "msgs/s"),
        row(
            "ingest during / before",
            round(ratio, 3),
            "ratio",
            f">= {KEEP_UP:g}" if args.rate > 0 else "",
            ratio >= KEEP_UP if args.rate > 0 else None,
        ),
        row("ack p50 before", round(_pct(before_lat, "p50"), 2), "ms"),
        row("ack p99 before", round(_pct(before_lat, "p99"), 2), "ms"),
        row("ack p50 during", round(_pct(during_lat, "p50"), 2), "ms"),
        row("ack p99 during", round(_pct(during_lat, "p99"), 2), "ms"),
        row("ingest non-200 answers", errors, "count", "0", errors == 0),
        row("evidence: rows deleted (all tables)", deleted, "rows", "> 0", deleted > 0),
        row("evidence: landing rows removed", ev.get("landingRowsRemoved", 0), "rows"),
        row("evidence: landing files rewritten", ev.get("landingFilesRewritten", 0), "files"),
        row("evidence: lake files rewritten", ev.get("filesRewritten", 0), "files"),
        row("evidence: snapshots expired", ev.get("snapshotsExpired", 0), "snapshots"),
        _zero("evidence: rows remaining", ev.get("rowsRemainingTotal"), "rows"),
        _zero("evidence: bytes found", ev.get("bytesFoundTotal"), "matches"),
        row(
            "subjects' traits answering 404 after",
            f"{gone} of {n}",
            "",
            "all",
            gone == n,
        ),
        row(
            "other users' traits still 200",
            f"{kept} of {len(subjects.others)}",
            "",
            "all",
            kept == len(subjects.others),
        ),
        row("shared lake Parquet files changed", changed, "files", "0", changed == 0),
    ]
    write_result(
        "regulations",
        rows,
        {
            "ack, before the Delete": sample(before_lat),
            "ack, during the Delete": sample(during_lat),
        },
    )
    return 0


def _pct(xs: list[float], key: str) -> float:
    return summarize(xs)[key] if xs else 0.0


def _zero(metric: str, value: Any, unit: str) -> dict[str, object]:
    if value is None:
        return row(metric, "not reported", unit, "0", False)
    return row(metric, value, unit, "0", value == 0)


def print_load(label: str, rate: float, lat: list[float], errors: int) -> None:
    print(
        f"{label:<26} {rate:>8,.0f} msgs/s  errors {errors:<4} p50 {_pct(lat, 'p50'):7.2f} ms"
        f"  p99 {_pct(lat, 'p99'):7.2f} ms",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
