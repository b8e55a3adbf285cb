"""The product as `make run` starts it (mallard/up.py), for the whole-system test: `mallard mailbox
serve` (the local mailbox, MALLARD_SMTP_URL), `mallard serve`, `mallard pipeline run --watch` and
`dagster-daemon run` as real subprocesses on a fresh data dir and free loopback ports, each in a
session of its own and stopped or killed by its PID (its process group).

Each process's output goes to `run/<name>.log` under the data dir, as under `make run`, every
line stamped with the wall time it was read at, so a check can tell what happened after a kill.
Intervals are short (roll interval, full passes, compaction threshold) so three minutes see
many passes of every kind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from mallard.harness import REPO, Endpoint, free_port, init_data_dir, wait_http
from mallard.offline import TELEMETRY_OFF
from mallard.paths import DataPaths
from mallard.processes import alive, stop_groups

SERVER, WATCHER, DAEMON, MAILBOX = "server", "pipeline-watch", "dagster-daemon", "mailbox"
# The journey and audience the schedule uses, beside the repository's config (assets, tenants).
JOURNEY_ID = "sys_flow"
JOURNEY_TOML = """# The whole-system test's journey: every path ends within a minute of real
# time, and the branch reads a trait (`tier`) each persona gets once, so a replay can tell the
# path taken.
name = "System test flow"
reentry = "always"

[[steps]]
id = "hello"
type = "send"
asset = "welcome"
next = "pause"

[[steps]]
id = "pause"
type = "wait"
duration = "10s"
next = "route"

[[steps]]
id = "route"
type = "branch"
cases = [{ if = "traits.tier = 'gold'", goto = "gold" }]
else = "done"

[[steps]]
id = "gold"
type = "send"
asset = "reminder"
next = "done"

[[steps]]
id = "done"
type = "exit"
"""
AUDIENCE = "sys_gold"
AUDIENCE_SQL = "-- Gold personas of the system test.\nselect customer_id from customers\n" + (
    "where traits ->> 'tier' = 'gold';\n"
)
# Settings of every product process: short intervals, no rate limit on the test's senders.
PRODUCT_ENV = {
    "MALLARD_ROLL_INTERVAL_S": "0.5",
    "MALLARD_FULL_PASS_EVERY_S": "10",
    "MALLARD_COMPACT_AT_FILES": "3",
    "MALLARD_COMPACT_SLICE_S": "5",
    "MALLARD_RATE_PER_SECOND": "100000",
    "MALLARD_RATE_BURST": "100000",
    # Passes niced, not SCHED_IDLE: on a host shared with other work an idle-class pass waits
    # for every other process and a pass of a few messages took minutes (105 s for the first).
    "MALLARD_PIPELINE_IDLE": "0",
}


@dataclass
class Proc:
    name: str
    cmd: list[str]
    popen: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = None


def _stamp_lines(stream: IO[bytes], log: Path) -> None:
    """Copies a process's output to its log, each line after the wall time it was read."""
    with open(log, "ab") as out:
        for line in iter(stream.readline, b""):
            out.write(f"{time.time():.3f} ".encode() + line)
            out.flush()


class Product(Endpoint):
    """Mallard on a fresh data dir under `root`, with a config dir of its own (the test's
    journey, later an audience); `prepare` makes both, `start` starts a process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.config = root / "config"
        self.work = root / "work"  # the test's own files (import CSVs, the oracle): not data
        self.paths = DataPaths(self.data)
        self.port = free_port()
        self.smtp_port = free_port()
        self.creds: dict[str, str] = {}
        self.procs: dict[str, Proc] = {}
        self.lock = threading.Lock()  # one start, stop or kill at a time

    # --- setup -------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """What every product process and CLI call of the test runs with (as up.py sets it)."""
        return {
            **os.environ,
            **TELEMETRY_OFF,
            **PRODUCT_ENV,
            "MALLARD_DATA_DIR": str(self.data),
            "DAGSTER_HOME": str(self.paths.dagster_home),
            "MALLARD_CONFIG_DIR": str(self.config),
            "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{self.smtp_port}",
            "MALLARD_PUBLIC_URL": self.url,
        }

    def prepare(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        shutil.copytree(REPO / "config", self.config)
        (self.config / "journeys" / f"{JOURNEY_ID}.toml").write_text(JOURNEY_TOML)
        self.creds = init_data_dir(self.data)
        self.paths.run_dir.mkdir(parents=True, exist_ok=True)
        python = sys.executable
        bin_dir = Path(python).parent
        mailbox = [python, "-m", "mallard.cli", "mailbox", "serve", "--port", str(self.smtp_port)]
        self.procs = {
            MAILBOX: Proc(MAILBOX, mailbox),
            SERVER: Proc(SERVER, [python, "-m", "mallard.cli", "serve", "--port", str(self.port)]),
            WATCHER: Proc(WATCHER, [python, "-m", "mallard.cli", "pipeline", "run", "--watch"]),
            DAEMON: Proc(
                DAEMON, [str(bin_dir / "dagster-daemon"), "run", "-m", "orchestration.definitions"]
            ),
        }

    def add_audience(self) -> None:
        directory = self.config / "audiences"
        directory.mkdir(exist_ok=True)
        tmp = directory / f".{AUDIENCE}.sql.tmp"
        tmp.write_text(AUDIENCE_SQL)
        tmp.rename(directory / f"{AUDIENCE}.sql")

    # --- processes ---------------------------------------------------------------------------

    def start(self, name: str) -> None:
        with self.lock:
            self._start(name)

    def _start(self, name: str) -> None:
        proc = self.procs[name]
        assert proc.popen is None or proc.popen.poll() is not None, f"{name} runs already"
        log = self.paths.run_dir / f"{name}.log"
        proc.popen = subprocess.Popen(
            proc.cmd,
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (self.paths.run_dir / f"{name}.pid").write_text(str(proc.popen.pid))
        assert proc.popen.stdout is not None
        proc.reader = threading.Thread(
            target=_stamp_lines, args=(proc.popen.stdout, log), name=f"log-{name}", daemon=True
        )
        proc.reader.start()
        if name == SERVER:
            wait_http(f"{self.url}/health", proc.popen, log, 120)  # type: ignore[arg-type]
        if name == MAILBOX:
            _wait_port(self.smtp_port, proc.popen, log)

    def kill(self, name: str) -> int | None:
        """kill -9 of the process's group (the process and any child it started); its PID, or
        None when it was not running."""
        with self.lock:
            popen = self.procs[name].popen
            if popen is None or popen.poll() is not None:
                return None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            _wait_group_gone(popen.pid)
            return popen.pid

    def restart(self, name: str) -> None:
        with self.lock:
            popen = self.procs[name].popen
            if popen is None or popen.poll() is not None:
                self._start(name)

    def stop_all(self, timeout: float = 30) -> None:
        """SIGTERM to each group, the daemon first, the mailbox last; a group still there after
        `timeout` s is SIGKILLed. Then any regulation run still live."""
        with self.lock:
            running = [
                p.popen
                for name in (DAEMON, WATCHER, SERVER, MAILBOX)
                if (p := self.procs.get(name)) and p.popen and p.popen.poll() is None
            ]
            stop_groups(running, timeout)
        for pid in self.regulation_run_pids().values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def regulation_run_pids(self) -> dict[str, int]:
        """regulation id -> PID of its live run (the runs the server starts, each a session of
        its own, named by `run/regulations/<id>.pid`)."""
        out: dict[str, int] = {}
        for f in (self.paths.run_dir / "regulations").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(f.read_text())
                if alive(pid):
                    out[f.stem] = pid
        return out

    def kill_regulation_run(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _wait_group_gone(pid)

    def exited(self) -> list[str]:
        """The processes that are not running (none is, once the test stops them)."""
        return [
            f"{name} (exit {p.popen.returncode})"
            for name, p in self.procs.items()
            if p.popen is not None and p.popen.poll() is not None
        ]

    # --- idle --------------------------------------------------------------------------------

    def pending(self) -> list[str]:
        """What keeps the pipeline from idle, [] when nothing: sealed write-ahead log segments,
        landing files not loaded, no finished full pass after the last load, unfinished
        regulations, sends or journey events not done, journey instances still active."""
        out = []
        # Sealed segments wait for the roller; an open one (and the spare beside it, whose room
        # is written ahead) is sealed within the roll interval once it holds a record, and its
        # landing file then fails the settling below.
        sealed = list(self.paths.wal_dir.rglob("*.sealed"))
        if sealed:
            out.append(f"{len(sealed)} sealed write-ahead log segments not rolled")
        landing = {
            str(p.relative_to(self.paths.landing_dir))
            for p in self.paths.landing_dir.glob("date=*/*.parquet")
        }
        try:
            from mallard.warehouse import connect

            conn = connect(self.paths, read_only=True)
            try:
                loaded = {
                    r[0]
                    for r in conn.execute(
                        "select landing_file from lake.raw.landing_files"
                    ).fetchall()
                }
                row = conn.execute(
                    "select (select max(loaded_at) from lake.raw.landing_files),"
                    " (select m.loaded_through from lake.marts.freshness f"
                    "  join lake.state.pass_manifest m on m.pass_id = f.full_pass_id)"
                ).fetchone()
            finally:
                conn.close()
        except Exception as e:  # the lake mid-commit, or not built yet
            return [f"the lake: {type(e).__name__}: {str(e)[:200]}"]
        if landing - loaded:
            out.append(f"{len(landing - loaded)} landing files not loaded")
        if row is None or row[1] is None or (row[0] is not None and row[1] < row[0]):
            out.append(f"no full pass after the last load (loaded {row})")
        from mallard.regulations import RegulationStore

        store = RegulationStore(self.paths)
        try:
            unfinished = [r.regulation_id for r in store.unfinished()]
        finally:
            store.close()
        if unfinished:
            out.append(f"regulations unfinished: {unfinished}")
        if self.paths.outbox_db.exists():
            import sqlite3

            conn2 = sqlite3.connect(f"file:{self.paths.outbox_db}?mode=ro", uri=True, timeout=30)
            try:
                for what, sql in (
                    (
                        "sends not done",
                        "select count(*) from sends"
                        " where status in ('pending', 'sending') or recorded = 0",
                    ),
                    (
                        "journey instances active",
                        "select count(*) from journey_instances where status = 'active'",
                    ),
                    (
                        "journey events unrecorded",
                        "select count(*) from journey_events where recorded = 0",
                    ),
                ):
                    with contextlib.suppress(sqlite3.OperationalError):  # no such table yet
                        n = conn2.execute(sql).fetchone()[0]
                        if n:
                            out.append(f"{n} {what}")
            finally:
                conn2.close()
        return out

    def wait_landed(self, event_ids: list[str], timeout: float = 60) -> None:
        """Waits until the collector has rolled these acknowledged messages into landing files."""
        import pyarrow.parquet as pq

        want, seen = set(event_ids), set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for f in self.paths.landing_dir.glob("date=*/*.parquet"):
                seen |= set(pq.read_table(f, columns=["event_id"]).column("event_id").to_pylist())
            if want <= seen:
                return
            time.sleep(0.2)
        raise AssertionError(f"{len(want - seen)} acknowledged messages not landed in {timeout} s")

    def wait_idle(self, timeout: float, settle_s: float = 5.0) -> list[str]:
        """Waits until `pending()` is empty twice, `settle_s` apart, with no new landing file in
        between; what was still pending at the timeout ([] when idle)."""
        deadline = time.monotonic() + timeout
        last: list[str] = ["not asked"]
        while time.monotonic() < deadline:
            last = self.pending()
            if not last:
                files = len(list(self.paths.landing_dir.glob("date=*/*.parquet")))
                time.sleep(settle_s)
                last = self.pending()
                if not last and files == len(list(self.paths.landing_dir.glob("date=*/*.parquet"))):
                    return []
            time.sleep(1)
        return last

    # --- calls -------------------------------------------------------------------------------

    def cli(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [sys.executable, "-m", "mallard.cli", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and out.returncode:
            raise AssertionError(
                f"mallard {' '.join(args)}: {out.returncode}\n{out.stdout}{out.stderr}"
            )
        return out

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.base}/{path}", headers=self.headers, timeout=30, **kw)

    def log_lines(self, name: str) -> list[tuple[float, str]]:
        """(wall time, line) of a process's log, over all its starts."""
        log = self.paths.run_dir / f"{name}.log"
        out = []
        if log.exists():
            for raw in log.read_text(errors="replace").splitlines():
                stamp, _, line = raw.partition(" ")
                with contextlib.suppress(ValueError):
                    out.append((float(stamp), line))
        return out


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} after {timeout} s:\n{log.read_text()}")


def _group_members(pgid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(stat.parent.name))
    return out


def _wait_group_gone(pgid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
