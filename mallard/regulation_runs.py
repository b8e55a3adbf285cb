"""Starting regulations' runs: a filing starts a detached `mallard regulations run ID` process,
at most one per regulation at a time; the regulations left unfinished (a killed run, a server
that stopped) are carried forward by one `mallard regulations run --unfinished` process that
takes them in filing order, however many there are (one process each would start dozens of
Dagster processes at once after an outage, every one waiting for the same pass).

A run holds an exclusive lock on `run/regulations/<id>.lock` under the data dir for as long as it
lives (the kernel drops the lock when the process ends, however it ends) and writes its PID to
`<id>.pid` beside it. `RegulationRuns.start` starts a run unless a live one holds the lock; two
starts that race both start a process, and the one that finds the lock held exits at once, so
two runs never work on one regulation together. Every run appends to `run/regulations.log`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from mallard.paths import DataPaths
from mallard.regulations import RegulationStore

LOG_NAME = "regulations.log"
# The lock name of the run that takes the unfinished regulations (not a regulation id's shape
# of UUID, so it names no regulation).
BACKLOG = "unfinished"
# Regulation ids are UUID-shaped (mallard.ids.new_id); anything else never names a file.
_ID = re.compile(r"^[0-9A-Za-z-]{1,64}$")


def say(regulation_id: str, what: str) -> None:
    """A line of a run's output (the runs' log for runs the server starts): time, regulation,
    what happened."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"{stamp} regulation {regulation_id}: {what}", flush=True)


def runs_dir(paths: DataPaths) -> Path:
    return paths.run_dir / "regulations"


def log_path(paths: DataPaths) -> Path:
    return paths.run_dir / LOG_NAME


def pid_path(paths: DataPaths, regulation_id: str) -> Path:
    return runs_dir(paths) / f"{_checked(regulation_id)}.pid"


def _lock_path(paths: DataPaths, regulation_id: str) -> Path:
    return runs_dir(paths) / f"{_checked(regulation_id)}.lock"


def _checked(regulation_id: str) -> str:
    if not _ID.match(regulation_id):
        raise ValueError(f"not a regulation id: {regulation_id!r}")
    return regulation_id


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding the exclusive lock of `path`, or None while another holds it.
    The lock is taken on the file the path names when it is held: a file unlinked by the run
    that held it before is not locked again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def run_lock(paths: DataPaths, regulation_id: str, wait_s: float = 2.0) -> Iterator[bool]:
    """Within: whether this process holds the regulation's run lock (False: a run is live).
    Tried for up to `wait_s`, so the moment a starter holds it to see whether a run is live
    does not turn a run away. Held, the PID file names this process; both files go when the
    block ends."""
    lock = _lock_path(paths, regulation_id)
    deadline = time.monotonic() + wait_s
    while (fd := _try_lock(lock)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if fd is None:
        yield False
        return
    pid = pid_path(paths, regulation_id)
    try:
        pid.write_text(str(os.getpid()))
        yield True
    finally:
        # Unlinked while still held: a later run locks a new file, never this one.
        pid.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
        os.close(fd)


def running(paths: DataPaths, regulation_id: str) -> bool:
    """Whether a live process holds the regulation's run lock."""
    fd = _try_lock(_lock_path(paths, regulation_id))
    if fd is None:
        return True
    os.close(fd)
    return False


class RegulationRuns:
    """Starts regulations' runs as detached processes of this Python, with `env` added to this
    process's environment (the data dir and DAGSTER_HOME are always set to `paths`')."""

    def __init__(self, paths: DataPaths, env: Mapping[str, str] | None = None) -> None:
        self.paths = paths
        self.env = {
            **os.environ,
            **(env or {}),
            "MALLARD_DATA_DIR": str(paths.root),
            "DAGSTER_HOME": str(paths.dagster_home),
        }

    def command(self, regulation_id: str) -> list[str]:
        """The run of one regulation, or with BACKLOG, of every unfinished one."""
        which = ["--unfinished"] if regulation_id == BACKLOG else [regulation_id]
        return [sys.executable, "-m", "mallard.cli", "regulations", "run", *which]

    def start(self, regulation_id: str) -> int | None:
        """Start the regulation's run (BACKLOG: the run of the unfinished ones); its PID, or
        None when a live run holds its lock."""
        if running(self.paths, regulation_id):
            return None
        self.paths.run_dir.mkdir(parents=True, exist_ok=True)
        with open(log_path(self.paths), "ab") as log:
            proc = subprocess.Popen(
                self.command(regulation_id),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a signal to the server's process group does not stop it.
                start_new_session=True,
            )
        # Waited for on a thread, so no zombie stays once it exits while this process lives.
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
        return proc.pid

    def resume(self, store: RegulationStore) -> dict[str, int]:
        """Carry forward every pending or running regulation whose run is not live: one run
        takes them all in filing order. Regulation id -> the PID of that run; empty when none
        waits, or when a run of the unfinished ones is live already (it takes them as it goes;
        one it has passed is taken by the next resume, which every pass calls)."""
        waiting = [
            reg.regulation_id
            for reg in store.unfinished()
            if not running(self.paths, reg.regulation_id)
        ]
        pid = self.start(BACKLOG) if waiting else None
        return {} if pid is None else dict.fromkeys(waiting, pid)
