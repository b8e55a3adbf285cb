"""The locks between processes that write the lake: one loader, one writer of the models, and
one pipeline watcher per data dir."""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from mallard.distributed import storage
from mallard.paths import DataPaths


@contextmanager
def _file_lock(paths: DataPaths, name: str) -> Iterator[None]:
    paths.lake_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.lake_dir / name, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            with _catalog_lock(name):
                yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def _catalog_lock(name: str) -> Iterator[None]:
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
        with conn.cursor() as cur:
            cur.execute("select pg_advisory_lock(%s)", (key,))
        yield
    finally:
        conn.close()  # ends the session, which releases its advisory locks


def load_lock(paths: DataPaths) -> AbstractContextManager[None]:
    """One loader at a time: two concurrent appends of the same file would both commit."""
    return _file_lock(paths, ".load.lock")


def build_lock(paths: DataPaths) -> AbstractContextManager[None]:
    """One writer of the models at a time (a dbt build or maintenance): two would conflict on
    commit."""
    return _file_lock(paths, ".build.lock")


def regulations_lock(paths: DataPaths) -> AbstractContextManager[None]:
    """One regulation's job at a time: each runs passes and purges the lake, the landing files
    and the catalog; a second one waits for the first to finish."""
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
