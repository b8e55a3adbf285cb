"""Freshness: the time from an accepted message (the POST's 200) to its visibility in the read
API, on the pipeline's lake, with the pipeline kept running as a deployment runs it.

    python -m bench.freshness [--full] [--events N] [--customers N] [--mode watch|loop|sensor]
                              [--load-rate MSGS_PER_S]

`watch` runs `mallard pipeline run --watch` (one process, a pass whenever files land), the
pipeline watcher `make run` starts; `loop` runs `mallard pipeline run` back to back, a new
process each; `sensor` runs the Dagster daemon alone (the landing-files sensor starts the
pipeline job, a new process a run), as when no watcher runs. A
probe identify with a new userId is sent every few seconds through the real collector
(write-ahead log, roll to landing files); each pending probe's traits are polled until they
answer 200. Bounded: probes for a fixed time, then a bounded wait for the last ones (those still
unseen are reported). Meanwhile a steady background load of batches of 100 tracks (1,000
messages/s unless --load-rate says otherwise) goes through the same collector, so each pass takes
thousands of messages, as in a deployment with traffic. The watcher runs a full pass at least
every MALLARD_FULL_PASS_EVERY_S (30 s) (after served passes: a served part and the rest, each a
Dagster run), and served passes between them; the report gives the median of each kind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.lake import Lake, ensure_lake, sizes
from bench.stats import row, summarize, write_result
from mallard.harness import REPO, Server, free_port
from mallard.offline import TELEMETRY_OFF

GOAL_P95_S = 10.0
LOAD_RATE = 1000.0  # messages/s of background load
LOAD_BATCH = 100  # messages per background request
POLL_S = 0.25  # visibility is measured to this resolution
SERVER_ENV = {"MALLARD_RATE_PER_SECOND": "1000000000", "MALLARD_RATE_BURST": "1000000000"}


@dataclass
class Probe:
    user_id: str
    acked: float  # monotonic time of the 200
    seen: float | None = None
    acked_at: float = field(default_factory=time.time)  # the 200, as the runs' clock tells it

    @property
    def delay(self) -> float | None:
        return None if self.seen is None else self.seen - self.acked

    def waited_on(self, runs: list[Run]) -> list[Run]:
        """The runs under way while the probe waited to be seen."""
        if self.delay is None:
            return []
        seen_at = self.acked_at + self.delay
        return [r for r in runs if r.start < seen_at and r.end > self.acked_at]


@dataclass(frozen=True)
class Run:
    """A finished Dagster run of the pipeline job (a pass of `kind`) or of the compaction job
    the watcher runs after a pass that completes (`kind` "compaction")."""

    start: float
    end: float
    ok: bool
    kind: str

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def holds_served(self) -> bool:
        """Whether the served marts wait for it: anything but a served pass."""
        return self.kind != "served"


def pipeline_run(lake: Lake, timeout: float) -> int:
    """One `mallard pipeline run` on the lake, its output appended to the pipeline log; its exit
    code."""
    env = {**os.environ, "MALLARD_DATA_DIR": str(lake.data_dir), **TELEMETRY_OFF}
    with open(lake.data_dir / "bench-freshness-pipeline.log", "ab") as log:
        return subprocess.run(
            [sys.executable, "-m", "mallard.cli", "pipeline", "run"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        ).returncode


@dataclass
class PipelineLoop:
    """`mallard pipeline run` back to back in a thread, until stopped."""

    lake: Lake
    runs: list[tuple[float, int]] = field(default_factory=list)  # (seconds, exit code)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            rc = pipeline_run(self.lake, timeout=7200)
            self.runs.append((time.perf_counter() - t0, rc))

    def stop(self) -> None:
        """Let the current run finish (a killed run would only be redone), then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass
class _LongRunning:
    """A pipeline driver that is one process staying up; its runs are the Dagster instance's."""

    lake: Lake
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    @property
    def runs(self) -> list[tuple[float, int]]:
        """(seconds, 0 or 1 when failed) of the pipeline's runs recorded since it started."""
        return [(r.seconds, 0 if r.ok else 1) for r in self.recorded if r.kind != "compaction"]

    @property
    def recorded(self) -> list[Run]:
        """The pipeline's and the compaction's runs since it started, in the order they began."""
        import dagster as dg

        from orchestration.defs.ingest import PIPELINE
        from orchestration.window import PASS_KIND_TAG

        with dg.DagsterInstance.from_config(str(self.lake.paths.dagster_home)) as instance:
            out = []
            for job in (PIPELINE, "compaction"):
                for r in instance.get_run_records(dg.RunsFilter(job_name=job)):
                    if r.start_time and r.end_time and r.start_time >= self.started:
                        ok = r.dagster_run.status == dg.DagsterRunStatus.SUCCESS
                        kind = r.dagster_run.tags.get(PASS_KIND_TAG, "full")
                        kind = kind if job == PIPELINE else "compaction"
                        out.append(Run(r.start_time, r.end_time, ok, kind))
            return sorted(out, key=lambda r: r.start)

    def _spawn(self, cmd: list[str], log_name: str, env: dict[str, str], **kw: Any) -> None:
        self.started = time.time()
        env = {
            **os.environ,
            "MALLARD_DATA_DIR": str(self.lake.data_dir),
            **TELEMETRY_OFF,
            **env,
        }
        with open(self.lake.data_dir / log_name, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, **kw
            )


class PipelineWatch(_LongRunning):
    """`mallard pipeline run --watch`: one process that stays up, a pass whenever files land."""

    def start(self) -> None:
        cmd = [sys.executable, "-m", "mallard.cli", "pipeline", "run", "--watch"]
        self._spawn(cmd, "bench-freshness-pipeline.log", {})

    def stop(self) -> None:
        """SIGTERM lets the pass under way finish (a killed pass would only be redone)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(3600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SensorDaemon(_LongRunning):
    """The Dagster daemon with the landing-files sensor, started as `mallard up` starts it (no
    watcher runs here, so the sensor starts the passes)."""

    def start(self) -> None:
        env = {
            "DAGSTER_HOME": str(self.lake.paths.dagster_home),
            "DAGSTER_DISABLE_TELEMETRY": "1",
        }
        daemon = Path(sys.executable).parent / "dagster-daemon"
        self._spawn(
            [str(daemon), "run", "-m", "orchestration.definitions"],
            "bench-freshness-daemon.log",
            env,
            start_new_session=True,  # its code server and runs are in its process group
        )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def catch_up(lake: Lake) -> None:
    """One pass before the probes (not timed), as a deployment's pipeline is caught up when
    traffic comes: the messages earlier runs left, and every test after a change to the dbt
    project (a minute at 10M), which would otherwise fall on the first probes."""
    if rc := pipeline_run(lake, timeout=3600):
        raise RuntimeError(f"the catch-up pass failed ({rc}): see bench-freshness-pipeline.log")


@dataclass
class SteadyLoad:
    """Batches of LOAD_BATCH tracks at a fixed rate through the collector, on a thread with its
    own event loop (bench/loadgen.py's open loop), until the given seconds are over. Without a
    messageId each stored copy is a message of its own."""

    server: Server
    rate: float  # messages/s
    seconds: float
    sent: int = 0
    accepted: int = 0
    _thread: threading.Thread | None = None

    def start(self) -> None:
        if self.rate > 0:
            self._thread = threading.Thread(target=self._run, daemon=True, name="steady-load")
            self._thread.start()

    def _requests(self) -> list[bytes]:
        from bench.loadgen import build_request

        host, port = "127.0.0.1", self.server.port
        out = []
        for i in range(64):
            batch = [
                {
                    "type": "track",
                    "userId": f"steady-{(i * LOAD_BATCH + j) % 5000}",
                    "event": "Steady Load",
                    "properties": {"i": i, "j": j},
                }
                for j in range(LOAD_BATCH)
            ]
            body = json.dumps({"batch": batch}).encode()
            out.append(
                build_request(
                    host, port, f"{self.server.base_path}/batch", body, self.server.headers
                )
            )
        return out

    def _run(self) -> None:
        from bench.loadgen import open_loop, run

        res = run(
            open_loop(
                "127.0.0.1",
                self.server.port,
                self._requests(),
                self.rate / LOAD_BATCH,
                self.seconds,
                connections=8,
            )
        )
        self.sent = (res.requests + res.errors) * LOAD_BATCH
        self.accepted = res.requests * LOAD_BATCH

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def probe_loop(
    server: Server, seconds: float, interval: float, settle: float, tag: str
) -> list[Probe]:
    """Send a probe every `interval` s for `seconds`, poll until all are visible or `settle`
    seconds after the last probe."""
    probes: list[Probe] = []
    pending: list[Probe] = []
    headers = server.headers
    with httpx.Client(base_url=server.base, headers=headers, timeout=30) as client:
        t_start = time.monotonic()
        next_send = t_start
        n = 0
        while True:
            now = time.monotonic()
            sending = now - t_start < seconds
            if sending and now >= next_send:
                n += 1
                user_id = f"fresh-{tag}-{n}"
                r = client.post(
                    "/identify",
                    json={"userId": user_id, "event": "identify", "traits": {"probe": n}},
                )
                if r.status_code == 200:
                    p = Probe(user_id, time.monotonic())
                    probes.append(p)
                    pending.append(p)
                next_send += interval
            # Probes become visible in the order they were accepted (the log rolls in order and
            # a pipeline run loads every file present): poll the oldest until one is missing.
            while pending:
                if client.get(f"/profiles/userId:{pending[0].user_id}/traits").status_code != 200:
                    break
                pending.pop(0).seen = time.monotonic()
            if not sending and (not pending or now - t_start > seconds + settle):
                return probes
            time.sleep(POLL_S)


def p95(delays: list[float]) -> float:
    return float(summarize(delays)["p95"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.freshness")
    p.add_argument("--full", action="store_true")
    p.add_argument("--events", type=int)
    p.add_argument("--customers", type=int)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--mode", choices=("watch", "loop", "sensor"), default="watch")
    p.add_argument("--seconds", type=float, help="how long probes are sent")
    p.add_argument(
        "--load-rate", type=float, default=LOAD_RATE, help="background messages/s (0: none)"
    )
    args = p.parse_args(argv)
    events, customers = sizes(args.full, args.events, args.customers)
    seconds = args.seconds or (300.0 if args.full else 90.0)
    interval = 5.0 if args.full else 3.0
    settle = 1800.0 if args.full else 600.0  # bounded wait for the last probes

    lake = ensure_lake(events, customers, args.seed)
    catch_up(lake)
    server = Server(lake.data_dir, free_port(), lake.creds, env=SERVER_ENV)
    server.start()
    runner: PipelineWatch | PipelineLoop | SensorDaemon = {
        "watch": PipelineWatch,
        "loop": PipelineLoop,
        "sensor": SensorDaemon,
    }[args.mode](lake)
    runs: list[tuple[float, int]] = []
    recorded: list[Run] = []
    load = SteadyLoad(server, args.load_rate, seconds)
    try:
        runner.start()
        load.start()
        probes = probe_loop(server, seconds, interval, settle, tag=str(int(time.time())))
        load.join()
        runs = list(runner.runs)  # finished runs only: stopping the daemon interrupts its runs
        if isinstance(runner, _LongRunning):
            recorded = runner.recorded
    finally:
        runner.stop()
        server.stop()
    seen = [d for d in (pr.delay for pr in probes) if d is not None]
    unseen = len(probes) - len(seen)
    lat = summarize(seen) if seen else {"p50": 0.0, "p95": 0.0, "max": 0.0}
    failed_runs = sum(1 for _, rc in runs if rc != 0)
    cycle = summarize([s for s, _ in runs]) if runs else {"p50": 0.0}
    kinds = ("full", "served", "compaction")
    by_kind = {
        kind: summarize(secs) if (secs := [r.seconds for r in recorded if r.kind == kind]) else None
        for kind in kinds
    }
    count = {kind: sum(1 for r in recorded if r.kind == kind) for kind in kinds}
    # Where the tail comes from: the probes whose wait had only served passes in it, and those
    # that waited while a pass the served marts cannot run beside (full) or a compaction
    # ran (one writer commits to the lake at a time).
    waits = [
        (pr.delay, any(r.holds_served for r in pr.waited_on(recorded)))
        for pr in probes
        if pr.delay is not None
    ]
    served_only = [d for d, held in waits if not held] if recorded else []
    held_lat = [d for d, held in waits if held]
    print(
        f"{len(probes)} probes, {unseen} not visible in time; accepted -> visible "
        f"p50 {lat['p50']:.1f} s  p95 {lat['p95']:.1f} s  max {lat['max']:.1f} s; "
        f"{len(runs)} pipeline runs ({failed_runs} failed), median {cycle['p50']:.1f} s"
        + "".join(
            f"; {count[k]} {k} passes, median {v['p50']:.1f} s" for k, v in by_kind.items() if v
        )
        + f"; background load {load.accepted / seconds:,.0f} msgs/s accepted"
        + (
            f"; waited on served passes only: {len(served_only)} probes, "
            f"p95 {summarize(served_only)['p95']:.1f} s"
            if served_only
            else ""
        )
        + (
            f"; waited on a full pass or a compaction: {len(held_lat)} probes, "
            f"p95 {summarize(held_lat)['p95']:.1f} s"
            if held_lat
            else ""
        ),
        flush=True,
    )
    ok95 = bool(seen) and unseen == 0 and lat["p95"] <= GOAL_P95_S
    rows = [
        row("lake size: events", lake.events + lake.extra_events, "events"),
        row("pipeline driven by", args.mode, ""),
        row("probes accepted", len(probes), "count"),
        row("accepted -> visible p50", round(lat["p50"], 1), "s"),
        row("accepted -> visible p95", round(lat["p95"], 1), "s", f"<= {GOAL_P95_S:g}", ok95),
        row("accepted -> visible max", round(lat["max"], 1), "s"),
        row("probes never visible (bounded wait)", unseen, "count", "0", unseen == 0),
        row("background load accepted", round(load.accepted / seconds), "msgs/s"),
        row("pipeline run, median", round(cycle["p50"], 1), "s"),
        *[
            row(f"{kind} passes (median s)", f"{count[kind]} ({v['p50']:.1f})", "")
            for kind, v in by_kind.items()
            if v
        ],
        *[
            row(f"accepted -> visible p95, {label} ({len(ds)} probes)", round(p95(ds), 1), "s")
            for label, ds in (
                ("waited on served passes only", served_only),
                ("waited on a full pass or a compaction", held_lat),
            )
            if ds
        ],
        row("failed pipeline runs", failed_runs, "count", "0", failed_runs == 0),
    ]
    # seconds, shown as ms on the shared latency CDF axis
    write_result("freshness", rows, {"accepted -> visible": [round(s * 1000) for s in seen]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
