"""`mallard up`, what `make run` calls: init, serve, demo data, pipeline, the pipeline watcher,
Dagster UI and daemon, and a local mailbox for email unless MALLARD_SMTP_URL names a server.

Ctrl-C or SIGTERM stops every process it started, by PID, and says so. With mallard/app.py and
mallard/cli.py, part of the composition root: it starts the applications (and takes the
orchestrator's telemetry switch for the processes it starts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from mallard.passes import PassRecord, read_last_pass
from mallard.paths import DataPaths
from mallard.processes import stop_groups


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see its log in data/run/")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not answer at {url} within {timeout:.0f}s")


def _show_pass(paths: DataPaths, shown: PassRecord | None) -> PassRecord | None:
    """Print a pass that failed, and the first that succeeds after failures, whoever ran it
    (mallard/passes.py): a failing pipeline shows in the terminal `make run` holds."""
    last = read_last_pass(paths)
    if last is None or (shown is not None and last.pass_number == shown.pass_number):
        return shown
    if not last.ok:
        print(("ERROR " if last.loud else "") + last.line(), file=sys.stderr, flush=True)
    elif shown is not None and not shown.ok:
        print(f"pipeline recovered: {last.line()}", flush=True)
    return last


class Terminated(Exception):
    """SIGTERM arrived: stop like Ctrl-C does."""


def _terminate(*_: object) -> None:
    raise Terminated


def up(data_dir: Path, port: int, dagster_port: int, mailbox_port: int = 1025) -> int:
    from orchestration.environment import TELEMETRY_OFF

    paths = DataPaths(data_dir.resolve())
    env = {
        **os.environ,
        "MALLARD_DATA_DIR": str(paths.root),
        "DAGSTER_HOME": str(paths.dagster_home),
        **TELEMETRY_OFF,
    }
    # Without a mail server of the user's, email goes to the local mailbox started below.
    local_mailbox = not os.environ.get("MALLARD_SMTP_URL")
    if local_mailbox:
        env["MALLARD_SMTP_URL"] = f"smtp://127.0.0.1:{mailbox_port}"
    mallard = [sys.executable, "-m", "mallard.cli"]
    first_time = not (paths.root / "demo-credentials.json").exists()
    init = subprocess.run([*mallard, "init", "--json"], env=env, capture_output=True, text=True)
    if init.returncode:
        sys.stderr.write(init.stderr)
        return init.returncode
    creds = json.loads(init.stdout)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(paths.run_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        (paths.run_dir / f"{name}.pid").write_text(str(proc.pid))
        procs.append((name, proc))
        return proc

    def stop_all(why: str) -> None:
        # A second Ctrl-C or SIGTERM must not cut the stop short and leave children behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        running = [name for name, proc in procs if proc.poll() is None]
        if running:
            print(f"{why}: stopping {', '.join(running)}", flush=True)
        stop_groups([proc for _, proc in reversed(procs)], 20)
        for name, _proc in procs:
            (paths.run_dir / f"{name}.pid").unlink(missing_ok=True)
        if running:
            print("Mallard stopped.", flush=True)

    # SIGTERM unwinds like Ctrl-C's KeyboardInterrupt, so both stop everything the same way.
    signal.signal(signal.SIGTERM, _terminate)
    why = "exiting"
    try:
        url = f"http://127.0.0.1:{port}"
        if local_mailbox:
            start("mailbox", [*mallard, "mailbox", "serve", "--port", str(mailbox_port)])
        server = start("server", [*mallard, "serve", "--port", str(port)])
        _wait_http(f"{url}/health", server, "mallard serve")
        if first_time:
            from mallard.demo import send_demo_traffic

            print(f"sent {send_demo_traffic(url, creds)} demo messages", flush=True)
            # The collector rolls its log into landing files every few seconds.
            time.sleep(float(os.environ.get("MALLARD_ROLL_INTERVAL_S", "2.0")) + 1)
        pipe = subprocess.run([*mallard, "pipeline", "run"], env=env)
        if pipe.returncode:
            print("pipeline run failed; the server keeps running", file=sys.stderr)
        shown = read_last_pass(paths)
        # Passes from here on run in one warm process as files land; the daemon's sensor and
        # schedules stand back while it runs (orchestration/locks.py, watcher_lock).
        start("pipeline-watch", [*mallard, "pipeline", "run", "--watch"])
        dagster_bin = Path(sys.executable).parent
        ui = start(
            "dagster-webserver",
            [
                str(dagster_bin / "dagster-webserver"),
                "-m",
                "orchestration.definitions",
                "-h",
                "127.0.0.1",
                "-p",
                str(dagster_port),
            ],
        )
        start(
            "dagster-daemon",
            [str(dagster_bin / "dagster-daemon"), "run", "-m", "orchestration.definitions"],
        )
        _wait_http(f"http://127.0.0.1:{dagster_port}/server_info", ui, "dagster-webserver")
        mail = (
            f"local mailbox {env['MALLARD_SMTP_URL']}; read it: mallard mailbox list | show N"
            if local_mailbox
            else "the server MALLARD_SMTP_URL names"
        )
        base = f"{url}/track/{creds['clientId']}/{creds['accountId']}/{creds['brandId']}/v1"
        print(
            f"""
Mallard is running (data in {paths.root}; logs in {paths.run_dir}).
  Server (ingestion, read API, tag): {url}      health: {url}/health   OpenAPI: {url}/schema
  Dagster UI:                        http://127.0.0.1:{dagster_port}
  Pipeline: a pass whenever files land (mallard pipeline run --watch; runs show in the UI)
  Email:                             {mail}
  auth-token: {creds["token"]}
  writeKey:   {creds["writeKey"]}

Try:
  curl -s -X POST {base}/track -H 'auth-token: {creds["token"]}' \\
       -H 'content-type: application/json' -d '{{"userId":"u-1001","event":"Clicked Hello"}}'
  curl -s '{base}/events/?size=5' -H 'auth-token: {creds["token"]}'
  curl -s {base}/profiles/userId:u-1001/traits -H 'auth-token: {creds["token"]}'
Press Ctrl-C to stop.""",
            flush=True,
        )
        while all(p.poll() is None for _, p in procs):
            time.sleep(1)
            shown = _show_pass(paths, shown)
        dead = [n for n, p in procs if p.poll() is not None]
        print(f"stopped: {', '.join(dead)} exited; see {paths.run_dir}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        why = "\nCtrl-C"
        return 0
    except Terminated:
        why = "SIGTERM"
        return 0
    finally:
        stop_all(why)


def up_distributed(data_dir: Path, dagster_port: int) -> int:
    """`mallard up --distributed`: the distributed topology on this machine, under
    <data dir>/distributed (mallard/topology.py): PostgreSQL and an S3 server on loopback, two
    collectors, two API replicas, the pipeline watcher and Dagster, demo data sent through
    both collectors. Ctrl-C or SIGTERM stops every process by PID."""
    from mallard.demo import send_demo_traffic
    from mallard.topology import Deployment

    dep = Deployment(data_dir.resolve() / "distributed")
    signal.signal(signal.SIGTERM, _terminate)
    try:
        print(f"starting PostgreSQL, S3 (moto), 2 collectors, 2 API replicas in {dep.root}")
        dep.start(watcher=True)
        for name in ("collector-1", "collector-2"):
            sent = send_demo_traffic(dep.served[name].url, dep.creds)
            print(f"sent {sent} demo messages through {name}", flush=True)
        print(f"starting Dagster at http://127.0.0.1:{dagster_port}", flush=True)
        dep.start_dagster(dagster_port)
        c = dep.creds
        tenant = f"track/{c['clientId']}/{c['accountId']}/{c['brandId']}/v1"
        rows = "\n".join(
            f"  {name:<12} {s.url}/{tenant}/   (collector id {s.collector_id})"
            for name, s in dep.served.items()
        )
        env = dep.cluster.env()
        print(
            f"""
Mallard (distributed) is running; logs and PIDs in {dep.run_dir}.
{rows}
  Lake catalog: PostgreSQL {env["MALLARD_LAKE_CATALOG"]}
  Lake files:   {env["MALLARD_LAKE_DATA_URL"]}  landing: {env["MALLARD_LANDING_URL"]}
                (S3 server {env["AWS_ENDPOINT_URL"]})
  Dagster UI:   http://127.0.0.1:{dagster_port} (instance on PostgreSQL)
  auth-token:   {c["token"]}
Send to the collectors, read from the replicas (a load balancer would split them so).
Press Ctrl-C to stop.""",
            flush=True,
        )
        while all(p.poll() is None for p in dep.procs.values()):
            time.sleep(1)
        dead = [n for n, p in dep.procs.items() if p.poll() is not None]
        print(f"stopped: {', '.join(dead)} exited; see {dep.run_dir}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated):
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("stopping every process of the deployment", flush=True)
        dep.stop()
        print("Mallard stopped.", flush=True)
