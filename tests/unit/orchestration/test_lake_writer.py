"""The lake writer's turn (orchestration/locks.py): one writer of the lake at a time, across
processes and threads, re-entrant on its own thread, released by a process that dies."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from mallard.paths import DataPaths
from orchestration.locks import holds_lake_writer, lake_writer

HOLD = """
import sys, time
from pathlib import Path
from mallard.paths import DataPaths
from orchestration.locks import lake_writer
with lake_writer(DataPaths(Path(sys.argv[1]))):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(root: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def _acquire_in_thread(paths: DataPaths) -> tuple[threading.Thread, threading.Event]:
    got = threading.Event()

    def take() -> None:
        with lake_writer(paths):
            got.set()

    thread = threading.Thread(target=take)
    thread.start()
    return thread, got


def test_reentrant_on_its_thread_and_exclusive_to_other_threads(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    with lake_writer(paths):
        with lake_writer(paths):  # a pass's step takes the pass's turn again
            assert holds_lake_writer(paths)
        assert holds_lake_writer(paths)
        thread, got = _acquire_in_thread(paths)
        assert not got.wait(0.5), "another thread took the turn while this one held it"
    thread.join(10)
    assert got.is_set()
    assert not holds_lake_writer(paths)


def test_one_process_at_a_time_and_a_killed_holder_releases(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    holder = _holder(tmp_path, 60)
    try:
        thread, got = _acquire_in_thread(paths)
        assert not got.wait(1.0), "the turn was taken while another process held it"
        holder.kill()  # as kill -9 leaves a pass: the kernel drops the lock with the process
        holder.wait()
        thread.join(10)
        assert got.is_set()
    finally:
        holder.kill()
        holder.wait()


def test_a_pass_holds_the_turn_until_it_ends(tmp_path: Path) -> None:
    """A second process waits for the first's turn to end, then takes it."""
    holder = _holder(tmp_path, 1.5)
    started = time.monotonic()
    with lake_writer(DataPaths(tmp_path)):
        waited = time.monotonic() - started
    holder.wait()
    assert waited >= 1.0, f"took the turn after {waited:.2f} s, while the holder had it"
