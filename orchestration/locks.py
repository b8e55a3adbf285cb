"""The locks between processes: one writer of the lake, one regulation's run, and one pipeline
watcher per data dir.

Every commit to the lake (a load, a dbt build, a health check's read of what the build wrote,
compaction, maintenance, a Delete's purge) happens inside `lake_writer`. DuckLake keeps a
catalog read transaction open from a transaction's first read to its commit, and a second
writer that committed meanwhile fails the first one's commit (or, on some paths, both commit
work that assumed the other's absence): so the lake has exactly one writer at a time, whoever
runs it. The lock is held for a whole pass (orchestration/pipeline.py `run_pipeline`, and the
pipeline job's `LakeWriterResource` for runs Dagster launches), so a pass's window, its load,
its models and the checks of what it built see no other writer.

The writer's turn says who holds it: `lake/.writer.holder` beside the lock names the holder's
PID, what it is doing and since when, written as the turn is taken and removed as it ends
(`writer_holder` reads it; `mallard pipeline status` and `/health` show it). A process that has
waited `WAIT_SAID_S` for the turn logs who it waits for, and again every `WAIT_SAID_S`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from mallard.distributed import storage
from mallard.paths import DataPaths

log = logging.getLogger(__name__)

# How long a process waits for the writer's turn before it logs who holds it. A pass takes
# seconds, a full one on a busy host a minute or two: a wait past this is worth a line.
WAIT_SAID_S = 60.0


@contextmanager
def _file_lock(paths: DataPaths, name: str, waiting: str | None = None) -> Iterator[None]:
    """The exclusive lock `name` in the lake dir (and on PostgreSQL, its advisory twin). With
    `waiting` (what the caller waits to do), a wait longer than WAIT_SAID_S is logged."""
    paths.lake_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.lake_dir / name, "w") as f:
        _flock_exclusive(f, paths, waiting)
        try:
            with _catalog_lock(name, paths, waiting):
                yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _flock_exclusive(f: IO[str], paths: DataPaths, waiting: str | None) -> None:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with _said_while_waiting(paths, waiting):
            fcntl.flock(f, fcntl.LOCK_EX)


@contextmanager
def _catalog_lock(name: str, paths: DataPaths, waiting: str | None) -> Iterator[None]:
    """With the lake's catalog on PostgreSQL, the same lock as a PostgreSQL advisory lock too,
    so writers on other machines (a regulation's run started by another API replica) wait
    for it; a process that dies releases it with its session, as the kernel does a flock."""
    where = storage()
    if not where.on_postgres:
        yield
        return
    key = int.from_bytes(hashlib.sha256(f"mallard:{name}".encode()).digest()[:8], signed=True)
    conn = where.catalog_connect()
    try:
        with conn.cursor() as cur, _said_while_waiting(paths, waiting):
            cur.execute("select pg_advisory_lock(%s)", (key,))
        yield
    finally:
        conn.close()  # ends the session, which releases its advisory locks


@contextmanager
def _said_while_waiting(paths: DataPaths, waiting: str | None) -> Iterator[None]:
    """While the block waits for the writer's turn: every WAIT_SAID_S, a warning of how long
    `waiting` has waited and who holds the turn (from a thread of its own; the block itself
    sleeps in the kernel)."""
    if waiting is None:
        yield
        return
    done = threading.Event()
    began = time.monotonic()

    def say() -> None:
        while not done.wait(WAIT_SAID_S):
            holder = writer_holder(paths)
            log.warning(
                "%s (pid %d) has waited %.0f s for the lake writer's turn, held by %s",
                waiting,
                os.getpid(),
                time.monotonic() - began,
                holder.line() if holder else "a writer that left no record (another machine?)",
            )

    threading.Thread(target=say, name="lake-writer-wait", daemon=True).start()
    try:
        yield
    finally:
        done.set()


class _Reentry:
    """How deep the calling thread is in the writer's turn of each lake (by lock file): a pass
    holds the turn and the steps it runs take it again (the load, the build, compaction), so
    only the outermost acquisition takes the file lock."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.locks: dict[Path, threading.RLock] = {}
        self.depth: dict[Path, int] = {}

    def lock_for(self, path: Path) -> threading.RLock:
        with self.guard:
            return self.locks.setdefault(path, threading.RLock())


_REENTRY = _Reentry()
WRITER_LOCK = ".writer.lock"
# Beside the lock: who holds the writer's turn (WriterHolder), while it is held.
WRITER_HOLDER = ".writer.holder"


@dataclass(frozen=True)
class WriterHolder:
    """Who holds the lake writer's turn: its PID, what it is doing, since when."""

    pid: int
    doing: str  # "pass (watcher)", "compaction", "purge of regulation <id>", ...
    since: str  # ISO 8601, UTC

    def held_s(self) -> float:
        return (datetime.now(UTC) - datetime.fromisoformat(self.since)).total_seconds()

    def line(self) -> str:
        return f"pid {self.pid} ({self.doing}) for {self.held_s():.0f} s, since {self.since}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "held_s": round(self.held_s(), 1)}


def _write_holder(paths: DataPaths, doing: str) -> None:
    holder = WriterHolder(os.getpid(), doing, datetime.now(UTC).isoformat(timespec="milliseconds"))
    tmp = paths.lake_dir / f"{WRITER_HOLDER}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(asdict(holder)))
        os.replace(tmp, paths.lake_dir / WRITER_HOLDER)
    except OSError:  # the record is for people; the turn is held all the same
        log.exception("the lake writer's holder record was not written")


def _remove_holder(paths: DataPaths) -> None:
    try:
        (paths.lake_dir / WRITER_HOLDER).unlink(missing_ok=True)
    except OSError:
        log.exception("the lake writer's holder record was not removed")


def writer_holder(paths: DataPaths) -> WriterHolder | None:
    """Who holds the writer's turn of this lake now; None while no process of this machine
    holds it (a record left by a holder that was killed names no one) or in the moment
    between a holder's taking the turn and writing its record."""
    try:
        f = open(paths.lake_dir / WRITER_LOCK)  # noqa: SIM115 - closed below, after the probe
    except FileNotFoundError:
        return None
    with f:
        try:  # a shared lock for a moment: granted only while no one holds the turn
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return WriterHolder(**json.loads((paths.lake_dir / WRITER_HOLDER).read_text()))
            except (FileNotFoundError, ValueError, TypeError):
                return None
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


@contextmanager
def lake_writer(paths: DataPaths, doing: str = "a write") -> Iterator[None]:
    """The writer's turn of the lake: one process, and in it one thread, commits to the lake at
    a time. Re-entrant on the thread that holds it; other threads of the process wait as other
    processes do. Released when the process dies (a flock; a PostgreSQL session lock in the
    distributed topology), so a killed pass leaves no stale turn. `doing` is what the holder
    record says the turn is for (the outermost acquisition's)."""
    key = paths.lake_dir / WRITER_LOCK
    local = _REENTRY.lock_for(key)
    if not local.acquire(blocking=False):  # another thread of this process has the turn
        with _said_while_waiting(paths, doing):
            local.acquire()
    try:
        if _REENTRY.depth.get(key, 0):
            _REENTRY.depth[key] += 1
            try:
                yield
            finally:
                _REENTRY.depth[key] -= 1
            return
        with _file_lock(paths, WRITER_LOCK, waiting=doing):
            _REENTRY.depth[key] = 1
            _write_holder(paths, doing)
            try:
                yield
            finally:
                _REENTRY.depth[key] = 0
                _remove_holder(paths)
    finally:
        local.release()


def holds_lake_writer(paths: DataPaths) -> bool:
    """Whether the calling thread holds the writer's turn of this lake."""
    key = paths.lake_dir / WRITER_LOCK
    local = _REENTRY.lock_for(key)
    if not local.acquire(blocking=False):
        return False
    try:
        return _REENTRY.depth.get(key, 0) > 0
    finally:
        local.release()


def regulations_lock(paths: DataPaths) -> AbstractContextManager[None]:
    """One regulation's job at a time: a Delete purges the lake, the landing files and the
    catalog in several steps; a second regulation waits for the first to finish."""
    return _file_lock(paths, ".regulations.lock")


class WatcherRunning(RuntimeError):
    """Another `mallard pipeline run --watch` already runs the passes of this data dir."""


def _watcher_file(paths: DataPaths) -> Path:
    return paths.run_dir / "pipeline-watch.lock"


@contextmanager
def watcher_lock(paths: DataPaths, wait_s: float = 2.0) -> Iterator[None]:
    """Held by the pipeline watcher (`mallard pipeline run --watch`) for as long as it runs, with
    its PID in the file. While it is held, the daemon's sensors and schedule leave passes and
    compaction to the watcher (`watcher_pid`). The kernel drops the lock when the process ends,
    however it ends: a killed watcher leaves no stale claim. Raises WatcherRunning if another
    process holds it (a probe holds it shared for a moment: retried for wait_s)."""
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    with open(_watcher_file(paths), "a+") as f:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    f.seek(0)
                    raise WatcherRunning(
                        "another `mallard pipeline run --watch` "
                        f"(pid {f.read().strip() or '?'}) already runs the passes of {paths.root}"
                    ) from None
                time.sleep(0.05)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def watcher_pid(paths: DataPaths) -> int | None:
    """The PID of the live pipeline watcher of this data dir (-1 in the moment after it took
    the lock and before it wrote its PID), or None if none runs."""
    try:
        f = open(_watcher_file(paths))  # noqa: SIM115 - closed below, after the probe
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = f.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(f, fcntl.LOCK_UN)
        return None
