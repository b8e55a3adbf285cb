"""The lake writer's turn (orchestration/locks.py): one writer of the lake at a time, across
processes and threads, re-entrant on its own thread, released by a process that dies; the record
of who holds it, and the line a long waiter logs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mallard.harness import mallard
from mallard.paths import DataPaths
from orchestration import locks
from orchestration.locks import WRITER_HOLDER, holds_lake_writer, lake_writer, writer_holder

HOLD = """
import sys, time
from pathlib import Path
from mallard.paths import DataPaths
from orchestration.locks import lake_writer
with lake_writer(DataPaths(Path(sys.argv[1])), sys.argv[3]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(root: Path, seconds: float, doing: str = "a write") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), str(seconds), doing],
        stdout=subprocess.PIPE,
        text=True,
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


def test_a_run_dagster_launches_is_recorded_as_the_last_pass(tmp_path: Path) -> None:
    """A run the daemon's sensor or the UI launches goes through the pipeline job's writer
    resource, not run_pipeline: the resource records how it ended, as run_pipeline does."""
    import dagster as dg

    from mallard.passes import read_last_pass
    from orchestration.defs import build_definitions
    from orchestration.defs.ingest import PIPELINE
    from tests.unit.orchestration.test_load import write_landing

    paths = DataPaths(tmp_path)
    (name,) = write_landing(paths, events=20, seed=3, files=1)
    landed = next(paths.landing_dir.rglob(name))
    good = landed.read_bytes()
    landed.write_bytes(b"PAR1 not a parquet file")
    # The load alone, as the UI materializes one asset: no dbt build needed to see the record.
    job = (
        build_definitions(paths.root)
        .resolve_job_def(PIPELINE)
        .get_subset(asset_selection={dg.AssetKey(["raw", "messages"])})
    )
    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        failed = job.execute_in_process(instance=instance, raise_on_error=False)
        assert not failed.success
        record = read_last_pass(paths)
        assert record is not None and not record.ok, record
        assert record.launched_by == "dagster launch" and record.kind == "full"
        assert record.error and record.error.startswith("raw__messages: "), record
        assert "magic bytes" in record.error, record  # DuckDB's words, not Dagster's wrapper
        assert record.failed_in_a_row == 1

        landed.write_bytes(good)
        assert job.execute_in_process(instance=instance, raise_on_error=False).success
    record = read_last_pass(paths)
    assert record is not None and record.ok and record.failed_in_a_row == 0, record
    assert record.pass_number == 2
    assert not holds_lake_writer(paths)


def test_the_holder_is_recorded_while_it_holds_the_turn(tmp_path: Path) -> None:
    """Who holds the turn, what for and since when: in a file beside the lock while it is held,
    shown by `mallard pipeline status`; gone when the turn ends, and a killed holder's record
    names no one."""
    paths = DataPaths(tmp_path)
    record = paths.lake_dir / WRITER_HOLDER
    assert writer_holder(paths) is None
    with lake_writer(paths, "pass (watcher)"):
        with lake_writer(paths, "load"):  # a step of the pass: the pass still holds the turn
            mine = writer_holder(paths)
        assert mine is not None and (mine.pid, mine.doing) == (os.getpid(), "pass (watcher)")
        assert 0 <= mine.held_s() < 60
    assert writer_holder(paths) is None and not record.exists()

    holder = _holder(tmp_path, 60, "compaction")
    try:
        held = writer_holder(paths)
        assert held is not None and (held.pid, held.doing) == (holder.pid, "compaction"), held
        status = mallard("pipeline", "status", "--json", data_dir=tmp_path, check=False)
        writer = json.loads(status.stdout)["lakeWriter"]
        assert (writer["pid"], writer["doing"], writer["since"]) == (
            holder.pid,
            "compaction",
            held.since,
        )
        assert writer["held_s"] >= 0
        text = mallard("pipeline", "status", data_dir=tmp_path, check=False).stdout
        assert f"lake writer: held by pid {holder.pid} (compaction) for " in text, text
        holder.kill()  # as kill -9 leaves compaction: the record stays, the lock goes
        holder.wait()
        assert record.exists() and writer_holder(paths) is None
        text = mallard("pipeline", "status", data_dir=tmp_path, check=False).stdout
        assert "lake writer: free" in text, text
    finally:
        holder.kill()
        holder.wait()


def test_a_long_waiter_says_who_it_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(locks, "WAIT_SAID_S", 0.2)
    paths = DataPaths(tmp_path)
    holder = _holder(tmp_path, 60, "purge of regulation r-1")
    try:
        with caplog.at_level(logging.WARNING, logger="orchestration.locks"):
            got = threading.Event()

            def take() -> None:
                with lake_writer(paths, "pass (watcher)"):
                    got.set()

            waiter = threading.Thread(target=take)
            waiter.start()
            deadline = time.monotonic() + 30
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not got.is_set()
            said = caplog.records[0].getMessage()
            assert said.startswith(f"pass (watcher) (pid {os.getpid()}) has waited "), said
            assert f"held by pid {holder.pid} (purge of regulation r-1) for " in said, said
            holder.kill()
            waiter.join(10)
            assert got.is_set()
    finally:
        holder.kill()
        holder.wait()
