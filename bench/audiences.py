"""Audiences: what evaluating audience files costs a pass, on the benchmark lake.

    python -m bench.audiences [--full] [--events N] [--customers N] [--pairs P] [--reuse]
        [--copies SUFFIX] [--seconds S]

Quick: the 1M-event, 100k-customer lake; full: the 10M-event, 1M-customer lake of
bench/pipeline.py (either built when missing, not timed). It works on two copies (Parquet
hard-linked, bench/regulations.py's copy_data_dir), so the lake stays as the other scenarios
expect: one without audience files, one with three (docs/audiences.md): a trait filter over
`customers`, an event filter over `events`, an email domain over `customer_profiles`. One untimed
pass on each takes the models as they are now; on the copy with audiences it is the pass where
every member enters (its time is reported). Then P pairs of passes, each after the same new
events on both copies: one without audiences, one with them, in the steady state (few
customers change). The passes run as the pipeline watcher runs them (bench/pipeline.py's
long-lived process), 100,000 new events each, as the pipeline's incremental-pass goal. Reported
per pass: wall time, CPU time (the process and dbt, which other load on the shared cores
stretches far less than the wall time), dbt's own elapsed time, and on the copy with audiences
the seconds of the audience models and their data tests (dbt's run_results). Then the read
API's metadata lookups by userId on both copies (a real server each; the same customers, 300 at
random and 150 members): the `customers` view the API reads joins the open stays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.lake import MANIFEST, WORK, Lake, ensure_lake, sizes
from bench.loadgen import build_request, labeled_closed_loop, run
from bench.pipeline import _LONG_LIVED, step_seconds
from bench.read_api import HOST, SERVER_ENV, sample_user_ids, wait_for_index
from bench.regulations import copy_data_dir
from bench.stats import row, sample, summarize, write_result
from mallard.harness import REPO, Server, free_port, mallard, relocate_catalog
from mallard.offline import TELEMETRY_OFF
from mallard.paths import DataPaths

NEW_EVENTS = 100_000  # as the pipeline's incremental-pass goal (bench/pipeline.py)
AUDIENCES = {
    "pro_plan": "select customer_id from customers where traits ->> 'plan' = 'pro'",
    "buyers": "select customer_id from events where event_action = 'order_completed'",
    "example_com": (
        "select customer_id from customer_profiles where email_lower like '%@example.com'"
    ),
}
MODELS = ("int_audience_matches", "audience_members", "audiences")


@dataclass(frozen=True)
class Timed:
    wall: float  # the pass, compaction after it apart
    dbt: float  # dbt's elapsed time (run_results.json)
    models: dict[str, float]  # the audience models' execution times
    tests: float  # the audience models' data tests, together
    compaction: float  # seconds of the compaction after the pass (not in wall)
    cpu: float  # CPU seconds of the pass, its compaction included


def dbt_seconds(paths: DataPaths) -> tuple[float, dict[str, float], float]:
    """dbt's elapsed time, the audience models' seconds and their tests' seconds in the last dbt
    invocation (run_results.json)."""
    doc = json.loads((paths.dbt_target / "run_results.json").read_text())
    models, tests = {}, 0.0
    for r in doc["results"]:
        kind, _, name, *_ = r["unique_id"].split(
            "."
        )  # model.<project>.<name>, test.<..>.<name>.<hash>
        if kind == "model" and name in MODELS:
            models[name] = float(r["execution_time"])
        elif kind == "test" and any(m in name for m in MODELS):
            tests += float(r["execution_time"])
    return float(doc.get("elapsed_time") or 0.0), models, tests


def copy_lake(source: Lake, name: str, reuse: bool) -> Lake:
    """A copy of the lake under WORK/name; with `reuse`, the copy an earlier run left (with the
    traffic it landed since) when there is one."""
    copy = (WORK / name).resolve()
    manifest = copy / MANIFEST
    if reuse and manifest.exists():
        d = json.loads(manifest.read_text())
        print(f"reusing {copy.name}", flush=True)
        return Lake(**{**d, "data_dir": copy})
    copied = copy_data_dir(source.data_dir, copy)
    relocate_catalog(source.data_dir, copy)
    print(f"copied the lake to {copy.name} in {copied.seconds:.1f} s", flush=True)
    return replace(source, data_dir=copy)


def config_dir(name: str, audiences: dict[str, str]) -> Path:
    config = WORK / name
    shutil.rmtree(config, ignore_errors=True)
    shutil.copytree(REPO / "config", config)
    shutil.rmtree(config / "audiences", ignore_errors=True)
    if audiences:
        (config / "audiences").mkdir()
        for audience, sql in audiences.items():
            (config / "audiences" / f"{audience}.sql").write_text(sql + "\n")
    return config


class Passes:
    """Passes on one copy as the pipeline watcher runs them (bench/pipeline.py's long-lived
    process: Dagster, dbt and the project loaded once), with the copy's config dir. The process's
    first pass is untimed; each timed pass lands NEW_EVENTS first."""

    def __init__(self, lake: Lake, config: Path) -> None:
        self.lake = lake
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LONG_LIVED, str(lake.data_dir)],
            cwd=REPO,
            env={**os.environ, "MALLARD_CONFIG_DIR": str(config), **TELEMETRY_OFF},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.t0 = time.perf_counter()

    def ready(self) -> float:
        """Seconds until the process's first pass ended."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                return time.perf_counter() - self.t0
        raise AssertionError(f"the pass process exited ({self.proc.wait()})")

    def cpu(self) -> float:
        """CPU seconds of the pass process and its reaped children so far (/proc/<pid>/stat:
        utime, stime, cutime, cstime). Idle between passes, so a pass's CPU is the difference:
        other load on the cores stretches it far less than the wall time."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def timed(self, label: str) -> Timed:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.lake.land_more(NEW_EVENTS)
        cpu0 = self.cpu()
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        result = next((ln.split() for ln in self.proc.stdout if ln.startswith("pass ")), [])
        if not result or result[2] != "True":
            raise AssertionError(f"a pass failed ({self.proc.poll()}): {result}")
        wall, compact = float(result[1]), float(result[3])
        cpu = self.cpu() - cpu0
        dbt, models, tests = dbt_seconds(DataPaths(self.lake.data_dir))
        steps = step_seconds(self.lake.data_dir)
        t = Timed(wall - compact, dbt, models, tests, compact, cpu)
        inside = ", ".join(f"{k} {v:.1f}" for k, v in models.items())
        print(
            f"{label:<32} {t.wall:6.1f} s, CPU {cpu:6.1f} s  (steps: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items())
            + f"; dbt's elapsed {dbt:.1f} s"
            + (f"; audience models {inside}, their tests {tests:.1f} s" if models else "")
            + (f"; compaction after it {compact:.1f} s" if compact else "")
            + ")",
            flush=True,
        )
        return t

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.wait(timeout=600) != 0:
            raise AssertionError(f"the pass process exited with {self.proc.returncode}")


def metadata_lookups(lake: Lake, config: Path, users: list[str], seconds: float) -> list[float]:
    """Latencies (ms) of `GET profiles/userId:<id>/metadata` over HTTP against a real server on
    the lake, closed loop on two connections once its read index is built: the read API answers
    metadata from the `customers` view, one query per customer (api/service/reads.py)."""
    env = {**SERVER_ENV, "MALLARD_CONFIG_DIR": str(config)}
    server = Server(lake.data_dir, free_port(), lake.creds, env=env)
    server.start()
    try:
        r = server.get(f"profiles/userId:{users[0]}/metadata")
        assert r.status_code == 200 and "audiencesStatic" in r.json(), r.text[:300]
        wait_for_index(server)
        hdr = {"auth-token": lake.creds["token"], "accept": "application/json"}
        reqs = [
            (
                "metadata",
                build_request(
                    HOST,
                    server.port,
                    f"{server.base_path}/profiles/userId:{u}/metadata",
                    b"",
                    hdr,
                    "GET",
                ),
            )
            for u in users
        ]
        run(labeled_closed_loop(HOST, server.port, reqs, 2, 3.0))  # warm caches
        res = run(labeled_closed_loop(HOST, server.port, reqs, 2, seconds, 20_000))["metadata"]
        assert res.errors == 0 and res.latencies_ms, res
        return res.latencies_ms
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.audiences")
    ap.add_argument("--full", action="store_true", help="the 10M-event, 1M-customer lake")
    ap.add_argument("--events", type=int)
    ap.add_argument("--customers", type=int)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--reuse", action="store_true", help="the copies an earlier run left")
    ap.add_argument(
        "--copies", default="", help="a suffix of the copies' names (runs side by side)"
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="of metadata lookups per lake")
    args = ap.parse_args(argv)
    events, customers = sizes(args.full, args.events, args.customers)
    source = ensure_lake(events, customers)
    name = f"{events}-{customers}{args.copies}"
    off = copy_lake(source, f"audiences-off-{name}", args.reuse)
    on = copy_lake(source, f"audiences-on-{name}", args.reuse)
    no_files = config_dir(f"audiences-config-off{args.copies}", {})
    files = config_dir(f"audiences-config-on{args.copies}", AUDIENCES)

    # The processes' first passes, one after the other: untimed, but on a fresh copy the one
    # with audiences is where every member enters (process start included).
    passes_off = Passes(off, no_files)
    passes_off.ready()
    passes_on = Passes(on, files)
    entering = passes_on.ready()
    print(f"first pass with audiences, process start included: {entering:.1f} s", flush=True)
    without: list[Timed] = []
    with_: list[Timed] = []
    try:
        for i in range(args.pairs):
            without.append(passes_off.timed(f"pass {i + 1} without audiences"))
            with_.append(passes_on.timed(f"pass {i + 1} with {len(AUDIENCES)} audiences"))
    finally:
        passes_off.close()
        passes_on.close()
    out = mallard(
        "sql",
        "-c",
        "select audience, status, members from audiences order by audience",
        "--format",
        "json",
        data_dir=on.data_dir,
    )
    found = json.loads(out.stdout)
    print(found)
    assert all(a["status"] == "ok" and a["members"] > 0 for a in found), found

    # The same customers on both copies: at random, and members of an audience.
    users = sample_user_ids(on, 300)
    conn_out = mallard(
        "sql",
        "-c",
        "select distinct user_id from audience_members where left_at is null"
        " and user_id is not null order by user_id limit 150",
        "--format",
        "json",
        data_dir=on.data_dir,
    )
    users += [r["user_id"] for r in json.loads(conn_out.stdout)]
    lookups = {}
    for label, lake, config in (("without", off, no_files), ("with", on, files)):
        lookups[label] = metadata_lookups(lake, config, users, args.seconds)
        lat = summarize(lookups[label])
        print(
            f"metadata by userId, {label} audiences: {len(lookups[label]):,} requests"
            f"  p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms",
            flush=True,
        )

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 1)

    diffs = [b.wall - a.wall for a, b in zip(without, with_, strict=True)]
    size = f"{customers:,} customers, {NEW_EVENTS:,} new events, median of {args.pairs}"
    rows = [
        row(f"pass without audiences ({size})", med([t.wall for t in without]), "s"),
        row(f"pass with {len(AUDIENCES)} audiences ({size})", med([t.wall for t in with_]), "s"),
        row("difference within a pair (median)", med(diffs), "s"),
        row("CPU of the pass without audiences", med([t.cpu for t in without]), "s"),
        row("CPU of the pass with audiences", med([t.cpu for t in with_]), "s"),
        row(
            "CPU difference within a pair (median)",
            med([b.cpu - a.cpu for a, b in zip(without, with_, strict=True)]),
            "s",
        ),
        row("dbt elapsed without audiences", med([t.dbt for t in without]), "s"),
        row("dbt elapsed with audiences", med([t.dbt for t in with_]), "s"),
        row(
            "audience models within the pass with audiences",
            med([sum(t.models.values()) for t in with_]),
            "s",
        ),
        row("audience data tests within that pass", med([t.tests for t in with_]), "s"),
        row(
            "compaction after the passes, without / with (median)",
            f"{med([t.compaction for t in without])} / {med([t.compaction for t in with_])}",
            "s",
        ),
        row("audience members", sum(a["members"] for a in found), "rows"),
    ]
    if not args.reuse:
        rows.append(row("first pass with audiences (all enter)", round(entering, 1), "s"))
    for label, lat_ms in lookups.items():
        lat = summarize(lat_ms)
        rows += [
            row(f"metadata by userId, {label} audiences, p50", round(lat["p50"], 2), "ms"),
            row(f"metadata by userId, {label} audiences, p99", round(lat["p99"], 2), "ms"),
        ]
    write_result(
        "audiences",
        rows,
        {f"metadata by userId, {k} audiences": sample(v) for k, v in lookups.items()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
