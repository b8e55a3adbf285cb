"""Journeys: 100,000 customers at a wait, moved on at once when it falls due.

    python -m bench.journeys [--customers N] [--timeout S] [--reuse] [--profile]

Setup (not timed, each duration reported): a fresh `mallard init` data dir
(bench/.work/journeys/), a config dir copied from the repository's `config/` with one more
journey (`bench_wait`: wait 1h -> send the transactional email asset `welcome` -> exit,
re-entry never; MALLARD_CONFIG_DIR), `mallard serve` on a free loopback port taking N
identifies with emails and N `start_journey` tracks (batches of 100), a pipeline pass (the pass
of `mallard pipeline run`, its dispatch step held off, so that the entering is measured on its
own), then `mallard dispatch` with the clock (MALLARD_NOW) at T0: every customer enters and
waits. The data dir is then copied aside (`journeys-snapshot/`), so that `--reuse` starts again
from here.

Timed: the clock at T0+1h+1m, a subprocess (`--worker`) that builds the dispatcher's Planning
and Outbox as `dispatch()` does and times `plan()` (nothing new), `advance()` (every instance:
wait -> send, the send queued in the outbox through the guards and rendering -> exit) and
`record()` (the journey events written to the dispatcher's log) one after the other: what
`mallard dispatch` does without sending (the delivery scenario covers sending). At this size
advance() moves every second instance in a second process (settings' journey_split_at).
Figures: the advance's wall time and instances per second, the worker's peak RSS (getrusage
ru_maxrss; the RSS before advance is reported too) and the second process's. Checked: N
instances exited (exit_step), N sends pending in the outbox, none failed or skipped.
`--profile`: one more advance from the snapshot under cProfile (this process's part), its top
functions by cumulative time printed. Bounded: the run fails after --timeout seconds; every
process it starts is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.lake import WORK
from bench.stats import row, write_result
from mallard.harness import REPO, Server, free_port, init_data_dir
from mallard.offline import TELEMETRY_OFF

HOST = "127.0.0.1"
SERVER_ENV = {"MALLARD_RATE_PER_SECOND": "1000000000", "MALLARD_RATE_BURST": "1000000000"}
GOAL_S = 10.0  # advance 100k due instances, on 2 cores
JOURNEY = "bench_wait"
ASSET = "welcome"  # transactional: no preferences guard
T0 = datetime(2030, 1, 6, 9, 0, tzinfo=UTC)
DUE = T0 + timedelta(hours=1, minutes=1)
JOURNEY_TOML = f"""# bench/journeys.py: wait an hour, send one email, leave.
name = "Bench wait"
reentry = "never"

[[steps]]
id = "pause"
type = "wait"
duration = "1h"
next = "hello"

[[steps]]
id = "hello"
type = "send"
asset = "{ASSET}"
next = "done"

[[steps]]
id = "done"
type = "exit"
"""


class Timeout(Exception):
    pass


# --- the worker (a subprocess: the dispatcher's steps, timed) -------------------------------


def worker(data_dir: Path, profile: Path | None) -> int:
    """plan, advance and record as dispatch() runs them, each timed, on this process's clock
    (MALLARD_NOW); prints one JSON line."""
    from mallard.paths import DataPaths
    from orchestration.delivery import dispatch as d
    from orchestration.delivery.outbox import Outbox

    def rss_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def cpu_s() -> float:
        """CPU seconds of this process and its finished children (the advance's helper): a
        figure the host's load moves much less than wall time."""
        me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    paths = DataPaths(data_dir.resolve())
    result = d.DispatchResult()
    out: dict[str, Any] = {"rss_start_mib": rss_mib()}
    outbox = Outbox(d.outbox_path(paths))
    planning = d.Planning.load(paths, d.public_url(paths))
    try:
        t = time.perf_counter()
        d.plan(paths, outbox, result, planning)
        out["plan_s"] = time.perf_counter() - t
        out["rss_before_advance_mib"] = rss_mib()
        t, c = time.perf_counter(), cpu_s()
        if profile is not None:
            import cProfile

            prof = cProfile.Profile()
            prof.runcall(d.advance, paths, outbox, result, planning)
            prof.dump_stats(profile)
        else:
            d.advance(paths, outbox, result, planning)
        out["advance_s"], out["advance_cpu_s"] = time.perf_counter() - t, cpu_s() - c
        out["rss_after_advance_mib"] = rss_mib()
        # advance() moves every second instance in a second process at this size
        # (journey_split_at): its peak RSS.
        out["rss_helper_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        t, c = time.perf_counter(), cpu_s()
        d.record(paths, outbox, result)
        out["record_s"], out["record_cpu_s"] = time.perf_counter() - t, cpu_s() - c
        out["rss_peak_mib"] = rss_mib()
    finally:
        planning.close()
        outbox.close()
    out["summary"] = result.summary()
    out["moved"], out["exited"], out["planned"] = result.moved, result.exited, result.planned
    print(json.dumps(out), flush=True)
    return 0


def pass_only(data_dir: Path) -> int:
    """One pipeline pass as `mallard pipeline run` makes it, without its dispatch step."""
    from orchestration import pipeline

    pipeline.dispatch_step = lambda paths: pipeline.StepResult(  # type: ignore[assignment]
        "dispatch", True, "held off by bench.journeys"
    )
    ok = True
    for step in pipeline.run_pipeline(data_dir):
        print(f"{'ok  ' if step.ok else 'FAIL'} {step.name}: {step.summary}", flush=True)
        ok = ok and step.ok
    return 0 if ok else 1


# --- the driver -----------------------------------------------------------------------------


def user(i: int) -> tuple[str, str]:
    return f"jb-{i}", f"jb{i}@example.org"


def post_all(server: Server, n: int, deadline: float) -> int:
    """n identifies, then n start_journey tracks, 100 to a batch; the messages accepted."""
    accepted = 0
    with httpx.Client(base_url=server.base, headers=server.headers, timeout=60) as client:
        for kind in ("identify", "start"):
            for lo in range(0, n, 100):
                if time.monotonic() > deadline:
                    raise Timeout("posting")
                batch: list[dict[str, Any]] = []
                for i in range(lo, min(lo + 100, n)):
                    uid, address = user(i)
                    if kind == "identify":
                        batch.append(
                            {
                                "type": "identify",
                                "userId": uid,
                                "traits": {"email": address, "firstName": f"Jay{i}"},
                                "messageId": f"jb-id-{i}",
                            }
                        )
                    else:
                        batch.append(
                            {
                                "type": "track",
                                "userId": uid,
                                "event": "start_journey",
                                "messageId": f"jb-start-{i}",
                                "properties": {"journeyIdToTrigger": JOURNEY},
                            }
                        )
                r = client.post("/batch", json={"batch": batch})
                if r.status_code != 200:
                    raise RuntimeError(f"{kind} batch answered {r.status_code}: {r.text[:200]}")
                accepted += len(batch)
    return accepted


def landed_rows(data_dir: Path) -> int:
    import pyarrow.parquet as pq

    return sum(
        pq.ParquetFile(f).metadata.num_rows for f in (data_dir / "landing").glob("date=*/*.parquet")
    )


def cli(
    args: list[str], env: dict[str, str], deadline: float, log: Path
) -> tuple[int, float, float, str]:
    """A subprocess `python <args>` with `env`: (returncode, wall s, peak RSS MiB, stdout);
    its rusage is its own (wait4 on its PID). Killed (by PID) at the deadline."""
    t = time.perf_counter()
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env={**os.environ, **TELEMETRY_OFF, **env},
            stdout=subprocess.PIPE,
            stderr=err,
        )
    assert proc.stdout is not None
    try:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout(" ".join(args))
        out = b""
        # stdout is small (a summary or one JSON line); a long run is bounded by wait4's poll.
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                raise Timeout(" ".join(args))
            time.sleep(0.05)
        out = proc.stdout.read()
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode, time.perf_counter() - t, usage.ru_maxrss / 1024, out.decode()
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            os.waitpid(proc.pid, 0)
            proc.returncode = -9
        proc.stdout.close()


def outbox_counts(data_dir: Path) -> dict[str, dict[str, int]]:
    con = sqlite3.connect(f"file:{data_dir / 'outbox.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        q = {
            "instances": "select status || ':' || coalesce(exit_reason, step_id), count(*)"
            " from journey_instances group by 1",
            "sends": "select status || coalesce(':' || reason, ''), count(*) from sends group by 1",
            "events": "select event, count(*) from journey_events group by 1",
        }
        return {k: dict(con.execute(sql).fetchall()) for k, sql in q.items()}
    finally:
        con.close()


def setup(
    data_dir: Path, config: Path, n: int, deadline: float, env: dict[str, str]
) -> dict[str, Any]:
    """The untimed setup up to every customer waiting; its durations."""
    took: dict[str, Any] = {}
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    shutil.rmtree(config, ignore_errors=True)
    shutil.copytree(REPO / "config", config)
    (config / "journeys" / f"{JOURNEY}.toml").write_text(JOURNEY_TOML)
    t = time.perf_counter()
    creds = init_data_dir(data_dir)
    took["init_s"] = time.perf_counter() - t
    server = Server(data_dir, free_port(), creds, env={**SERVER_ENV, **env})
    try:
        server.start()
        t = time.perf_counter()
        accepted = post_all(server, n, deadline)
        took["post_s"] = time.perf_counter() - t
        while landed_rows(data_dir) < accepted:
            if time.monotonic() > deadline:
                raise Timeout("landing")
            time.sleep(0.5)
        took["landed_s"] = time.perf_counter() - t
    finally:
        server.stop()
    print(
        f"{accepted:,} messages accepted in {took['post_s']:.1f} s, landed after"
        f" {took['landed_s']:.1f} s",
        flush=True,
    )
    log = data_dir / "bench-journeys.log"
    base = {**env, "MALLARD_DATA_DIR": str(data_dir), "MALLARD_NOW": T0.isoformat()}
    rc, took["pass_s"], _, out = cli(
        ["-m", "bench.journeys", "--pass-only", str(data_dir)], base, deadline, log
    )
    print(out, end="", flush=True)
    if rc != 0:
        raise RuntimeError(f"the pipeline pass failed ({rc}): {log}")
    print(f"pipeline pass (no dispatch): {took['pass_s']:.1f} s", flush=True)
    rc, took["enter_s"], took["enter_rss_mib"], out = cli(
        ["-m", "mallard.cli", "dispatch"], base, deadline, log
    )
    if rc != 0:
        raise RuntimeError(f"mallard dispatch failed ({rc}): {log}")
    counts = outbox_counts(data_dir)
    took["waiting"] = counts["instances"].get("active:pause", 0)
    print(
        f"mallard dispatch at T0: {out.strip()} in {took['enter_s']:.1f} s"
        f" (peak RSS {took['enter_rss_mib']:.0f} MiB); instances {counts['instances']}",
        flush=True,
    )
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.journeys")
    p.add_argument("--full", action="store_true", help="same run (the scenario has one size)")
    p.add_argument("--customers", type=int, default=100_000)
    p.add_argument("--timeout", type=float, default=1200.0, help="fail after this many seconds")
    p.add_argument("--reuse", action="store_true", help="start from the last run's snapshot")
    p.add_argument("--profile", action="store_true", help="one more advance under cProfile")
    p.add_argument("--worker", metavar="DATA_DIR", help=argparse.SUPPRESS)
    p.add_argument("--profile-to", help=argparse.SUPPRESS)
    p.add_argument("--pass-only", metavar="DATA_DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(Path(args.worker), Path(args.profile_to) if args.profile_to else None)
    if args.pass_only:
        return pass_only(Path(args.pass_only))
    n = args.customers
    deadline = time.monotonic() + args.timeout
    data_dir = (WORK / "journeys").resolve()
    snapshot = (WORK / "journeys-snapshot").resolve()
    config = (WORK / "journeys-config").resolve()
    sink = f"smtp://{HOST}:{free_port()}"  # nothing listens: nothing is sent in this scenario
    env = {"MALLARD_CONFIG_DIR": str(config), "MALLARD_SMTP_URL": sink}
    took: dict[str, Any] = {}
    try:
        if args.reuse and (snapshot / "bench-setup.json").exists():
            took = json.loads((snapshot / "bench-setup.json").read_text())
            n = took["customers"]
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.copytree(snapshot, data_dir)
            print(f"reusing the snapshot of {n:,} waiting customers", flush=True)
        else:
            took = setup(data_dir, config, n, deadline, env)
            took["customers"] = n
            (data_dir / "bench-setup.json").write_text(json.dumps(took))
            t = time.perf_counter()
            shutil.rmtree(snapshot, ignore_errors=True)
            shutil.copytree(data_dir, snapshot)
            print(f"snapshot copied in {time.perf_counter() - t:.1f} s", flush=True)
        log = data_dir / "bench-journeys.log"
        due = {**env, "MALLARD_DATA_DIR": str(data_dir), "MALLARD_NOW": DUE.isoformat()}
        rc, wall_s, rss_mib, out = cli(
            ["-m", "bench.journeys", "--worker", str(data_dir)], due, deadline, log
        )
        if rc != 0:
            raise RuntimeError(f"the worker failed ({rc}): {log}")
        w = json.loads(out.strip().splitlines()[-1])
        counts = outbox_counts(data_dir)
        print(
            f"at T0+1h1m: plan {w['plan_s']:.2f} s, advance {w['advance_s']:.2f} s"
            f" ({n / w['advance_s']:,.0f} instances/s), record {w['record_s']:.2f} s;"
            f" RSS before advance {w['rss_before_advance_mib']:.0f} MiB, peak"
            f" {w['rss_peak_mib']:.0f} MiB (wait4 {rss_mib:.0f} MiB); {w['summary']}\n"
            f"outbox: {counts}",
            flush=True,
        )
        if args.profile:
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.copytree(snapshot, data_dir)
            prof = WORK / "journeys-advance.prof"
            rc, _, _, pout = cli(
                ["-m", "bench.journeys", "--worker", str(data_dir), "--profile-to", str(prof)],
                due,
                deadline,
                log,
            )
            if rc == 0:
                import pstats

                pw = json.loads(pout.strip().splitlines()[-1])
                print(f"profiled advance: {pw['advance_s']:.2f} s (under cProfile); {prof}")
                pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(30)
    except Timeout as e:
        print(f"timed out after {args.timeout:g} s: {e}", flush=True)
        write_result("journeys", [row("bounded run", f"timed out: {e}", "", "finished", False)])
        return 1

    exited = counts["instances"].get("exited:exit_step", 0)
    pending = counts["sends"].get("pending", 0)
    not_pending = sum(c for s, c in counts["sends"].items() if s != "pending")
    correct = exited == n == pending and not_pending == 0 and len(counts["instances"]) == 1
    adv = w["advance_s"]
    rows = [
        row(
            "customers identified and started (batches of 100 through the collector)",
            n,
            "customers",
        ),
        row("  setup: posting -> landed", round(took["landed_s"], 1), "s"),
        row("  setup: pipeline pass (dispatch held off)", round(took["pass_s"], 1), "s"),
        row(
            "  setup: `mallard dispatch` at T0: all enter and wait",
            round(took["enter_s"], 1),
            "s",
            f"{n:,} waiting",
            took["waiting"] == n,
        ),
        row("  entering", round(n / took["enter_s"]), "instances/s"),
        row("  entering: dispatcher peak RSS", round(took["enter_rss_mib"]), "MiB"),
        row(
            f"advance() at T0+1h1m: {n:,} due (wait -> send -> exit)",
            round(adv, 2),
            "s",
            f"<= {GOAL_S:g} s",
            adv <= GOAL_S and correct,
        ),
        row("  advance rate", round(n / adv), "instances/s"),
        row("  dispatcher peak RSS (ru_maxrss)", round(w["rss_peak_mib"]), "MiB"),
        row("  advance's second process: peak RSS", round(w["rss_helper_mib"]), "MiB"),
        row("  RSS before advance", round(w["rss_before_advance_mib"]), "MiB"),
        row("  plan() (nothing new)", round(w["plan_s"], 2), "s"),
        row(
            "  record() (takes 10,000 journey events a call: jr.unrecorded limit)",
            round(w["record_s"], 2),
            "s",
        ),
        row(
            "  plan + advance + record (dispatch without sending)",
            round(w["plan_s"] + adv + w["record_s"], 2),
            "s",
        ),
        row("instances exited (exit_step)", exited, "count", f"{n:,}", exited == n),
        row("sends queued (pending)", pending, "count", f"{n:,}", pending == n),
        row("sends failed or skipped", not_pending, "count", "0", not_pending == 0),
    ]
    write_result("journeys", rows)
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
