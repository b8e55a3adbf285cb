"""Event pages from a process of their own: the events half of the read index lives there.

An events page is the API's heaviest read (~2-10 ms of Python, numpy and Parquet decoding);
traits by userId are its lightest (~60 us in memory). In one process the two share a GIL, and a
traits answer waits behind a page for the interpreter. At 10M events, 2 connections of traits and
pages mixed next to a CPU-bound SCHED_IDLE process (as a pipeline pass is), traits p99 is ~40%
longer with pages in the API process than with pages in another process. The events index's
updates (1.5-2.6 s of a pass's index update at 10M) also leave the API process.

The API process (Warehouse, api/service/) still decides what is served: it lists a snapshot's
files, builds the customers index itself while this process builds the events index of the same
snapshot, and asks for a page by the events files' key. A page this process cannot answer (it
died, was restarted, or dropped that index) raises PagesLost: the API answers from SQL and
rebuilds.

Started by PagesProcess only, as main() of this module with arguments ADDRESS NICE IDLE: the
authentication key comes on stdin, and the process exits when its stdin closes (the API process
is gone).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.context import AuthenticationError
from typing import Any

from api.index.ducklake_format import Files
from api.index.events import EventIndex
from api.params import EventQuery
from mallard.priority import yield_cpu
from mallard.warehouse import file_reader

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0
# Like the API process's own index builds: this one's and the one before it (a scroll pinned
# to it may still be reading).
KEEP = 2


class PagesLost(Exception):
    """The pages process cannot answer from that index (gone, restarted, or it dropped it)."""


class PagesProcess:
    """The API side: starts the pages process on first use, and again after it died."""

    def __init__(self, nice: int = 0, idle: bool = False) -> None:
        # Its index builds' niceness, and whether they run under SCHED_IDLE (no GIL of the
        # API's to hold there); its pages run at the API's priority.
        self.nice, self.idle = nice, idle
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._address = ""
        self._authkey = b""
        self._generation = 0  # counts starts: a thread's connection is to one of them
        self._lock = threading.Lock()
        self._local = threading.local()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def build(self, files: Files, previous: Files | None) -> tuple[tuple[int, ...], bool]:
        """Index the events files (updated from the index of previous when it still has it);
        returns each data file's live rows, for the API's check against DuckLake's count, and
        whether the index was updated from previous's (else built from the files)."""
        built: tuple[tuple[int, ...], bool] = self._call("build", files, previous)
        return built

    def page(
        self, files: Files, account_id: str, brand_id: str, q: EventQuery, hashes: list[int] | None
    ) -> list[str]:
        """The records of a page of the events index of these files."""
        records: list[str] = self._call("page", files, account_id, brand_id, q, hashes)
        return records

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            self._generation += 1
            if proc is not None:
                _stop(proc)
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None

    def _call(self, *message: Any) -> Any:
        conn = self._connection()
        try:
            conn.send(message)
            ok, value = conn.recv()
        except (EOFError, OSError) as e:
            self._lost(conn)
            raise PagesLost("the pages process is gone") from e
        if not ok:
            raise value
        return value

    def _connection(self) -> Connection:
        mine = getattr(self._local, "conn", None)
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            generation, address, authkey = self._generation, self._address, self._authkey
        if mine is not None and mine[0] == generation:
            conn: Connection = mine[1]
            return conn
        if mine is not None:
            mine[1].close()
        try:
            conn = Client(address, "AF_UNIX", authkey=authkey)
        except (OSError, EOFError, AuthenticationError) as e:
            raise PagesLost(f"cannot reach the pages process: {e}") from e
        self._local.conn = (generation, conn)
        return conn

    def _lost(self, conn: Connection) -> None:
        self._local.conn = None
        conn.close()

    def _start(self) -> None:
        """Start the process and wait until it listens (called under the lock)."""
        if self._proc is not None:
            log.warning("the pages process exited (%s); starting it again", self._proc.returncode)
            _stop(self._proc)
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="mallard-pages-")
        self._generation += 1
        self._address = os.path.join(self._dir, f"pages-{self._generation}.sock")
        self._authkey = secrets.token_bytes(32)
        proc = subprocess.Popen(
            # Not `-m api.pages`: its exceptions must pickle as api.pages's, not __main__'s.
            [
                sys.executable,
                "-c",
                "from api.pages import main; main()",
                self._address,
                str(self.nice),
                str(int(self.idle)),
            ],
            stdin=subprocess.PIPE,
        )
        assert proc.stdin is not None
        proc.stdin.write(self._authkey.hex().encode() + b"\n")
        proc.stdin.flush()  # stdin stays open: the process exits when it closes
        self._proc = proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(self._address):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise PagesLost(f"the pages process did not start (exit {proc.poll()})")
            time.sleep(0.02)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()  # it exits on its own
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- the pages process ---------------------------------------------------------------------


class _Pages:
    """The events indexes of the newest builds, by files key; builds on a thread at `nice`."""

    def __init__(self, nice: int, idle: bool) -> None:
        self._indexes: dict[Files, EventIndex] = {}
        self._builds = ThreadPoolExecutor(
            1, "events-index", initializer=yield_cpu, initargs=(nice, idle)
        )

    def build(self, files: Files, previous: Files | None) -> tuple[tuple[int, ...], bool]:
        idx = self._indexes.get(files)
        if idx is None:
            base = self._indexes.get(previous) if previous is not None else None
            idx = self._builds.submit(_build, files, base).result()
            kept = list(self._indexes.items())[-(KEEP - 1) :]
            self._indexes = dict(kept) | {files: idx}
        return idx.file_rows, idx.updated

    def page(
        self, files: Files, account_id: str, brand_id: str, q: EventQuery, hashes: list[int] | None
    ) -> list[str]:
        idx = self._indexes.get(files)
        if idx is None:
            raise PagesLost("no events index of these files here")
        return idx.records(idx.page(account_id, brand_id, q, hashes))

    def serve(self, conn: Connection) -> None:
        calls: dict[str, Callable[..., Any]] = {"build": self.build, "page": self.page}
        with conn:
            while True:
                try:
                    name, *args = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: tuple[bool, Any] = (True, calls[name](*args))
                except Exception as e:  # the API raises it in the request
                    log.debug("pages call %s failed", name, exc_info=True)
                    reply = (False, e)
                conn.send(reply)


def _build(files: Files, previous: EventIndex | None) -> EventIndex:
    conn = file_reader()  # the marts' files: local, or on S3
    try:
        return EventIndex(conn, files, previous)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> None:
    address, nice, idle = (argv or sys.argv[1:])[:3]
    authkey = bytes.fromhex(sys.stdin.readline().strip())

    def exit_with_parent() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    pages = _Pages(int(nice), idle == "1")
    with Listener(address, "AF_UNIX", authkey=authkey) as listener:
        while True:
            try:
                conn = listener.accept()
            except (AuthenticationError, OSError, EOFError):
                continue
            threading.Thread(target=pages.serve, args=(conn,), daemon=True).start()
