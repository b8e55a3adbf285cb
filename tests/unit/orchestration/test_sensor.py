"""The landing-files sensor: asks for a run when files land, and not while one is in progress;
it, the backstop schedule and the compaction sensor stand back while a pipeline watcher runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from mallard.harness import REPO
from mallard.paths import DataPaths
from orchestration.defs.ingest import backstop_schedule, new_files_sensor
from orchestration.load import landed_since, landing_mark
from orchestration.locks import WatcherRunning, watcher_lock, watcher_pid
from orchestration.resources import LakeResource
from tests.unit.orchestration.test_load import write_landing


def _lake(paths: DataPaths) -> dict[str, Any]:
    return {"lake": LakeResource(data_dir=str(paths.root))}


def _evaluate(instance: dg.DagsterInstance, paths: DataPaths, cursor: str | None = None) -> Any:
    """The sensor's tick (run requests, cursor, skip message)."""
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources=_lake(paths))
    return new_files_sensor().evaluate_tick(ctx)


def test_new_files_request_one_run_and_an_active_run_holds_the_next(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        assert not _evaluate(instance, paths).run_requests  # nothing landed yet

        write_landing(paths, events=50, seed=1, files=1)
        first = _evaluate(instance, paths)
        assert len(first.run_requests) == 1
        # No tests have passed on this project yet: the pass runs all of the job, every test.
        assert first.run_requests[0].asset_check_keys is None
        cursor = first.cursor
        assert not _evaluate(instance, paths, cursor).run_requests  # the same: nothing new

        write_landing(paths, events=50, seed=2, files=1)
        instance.add_run(
            DagsterRun(job_name="pipeline", run_id="r-active", status=dg.DagsterRunStatus.STARTED)
        )
        held = _evaluate(instance, paths, cursor)
        assert not held.run_requests and "r-active" in (held.skip_message or "")

        instance.delete_run("r-active")  # the run is over
        assert len(_evaluate(instance, paths, cursor).run_requests) == 1


def test_a_file_whose_name_sorts_first_still_starts_a_run(tmp_path: Path) -> None:
    """Landing order, not name order: a second collector's file (`t3-...` after `t5-...`) and a
    segment of an earlier day rolled late both land after the last run's cursor."""
    paths = DataPaths(tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        write_landing(paths, events=50, seed=5, files=1)
        cursor = _evaluate(instance, paths).cursor
        assert not _evaluate(instance, paths, cursor).run_requests

        write_landing(paths, events=50, seed=3, files=1)  # sorts before t5-0000
        second = _evaluate(instance, paths, cursor)
        assert len(second.run_requests) == 1
        cursor = second.cursor

        late = paths.landing_partition("2025-12-31")
        late.mkdir(parents=True)
        src = paths.landing_partition("2026-01-01") / "t3-0000.parquet"
        tmp = late / ".c9-0001.parquet.tmp"
        tmp.write_bytes(src.read_bytes())
        tmp.rename(late / "c9-0001.parquet")  # lands as the roller lands files
        assert len(_evaluate(instance, paths, cursor).run_requests) == 1


def test_a_cursor_from_before_landing_marks_counts_as_none(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    assert landing_mark(paths) == "" and not landed_since("", None)
    write_landing(paths, events=10, seed=1, files=1)
    mark = landing_mark(paths)
    assert landed_since(mark, None) and landed_since(mark, "date=2026-01-01/t1-0000.parquet")
    assert not landed_since(mark, mark)


def test_a_live_watcher_holds_the_sensor_and_the_backstop(tmp_path: Path) -> None:
    """While `mallard pipeline run --watch` runs (as `make run` starts it), the daemon starts no
    pass: the watcher runs them in its warm process. Without it, the daemon does. (The
    compaction sensor: test_maintenance.py.)"""
    paths = DataPaths(tmp_path)
    write_landing(paths, events=50, seed=1, files=1)
    schedule = backstop_schedule()
    with dg.DagsterInstance.ephemeral() as instance:

        def evaluations() -> list[Any]:
            context = dg.build_schedule_context(instance=instance, resources=_lake(paths))
            return [_evaluate(instance, paths), schedule.evaluate_tick(context)]

        with watcher_lock(paths):
            assert watcher_pid(paths) == os.getpid()
            for held in evaluations():
                assert not held.run_requests
                assert f"pipeline watcher (pid {os.getpid()})" in (held.skip_message or "")
        assert watcher_pid(paths) is None
        for free in evaluations():
            assert len(free.run_requests or []) == 1, free.skip_message


def test_a_killed_watcher_leaves_no_claim_and_a_second_one_is_refused(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from mallard.paths import DataPaths\n"
            "from orchestration.locks import watcher_lock\n"
            "with watcher_lock(DataPaths(Path(sys.argv[1]))):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(600)\n",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert watcher_pid(paths) == holder.pid
        with pytest.raises(WatcherRunning, match=f"pid {holder.pid}"), watcher_lock(paths, 0.2):
            pass
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own runs
        holder.wait()
    assert watcher_pid(paths) is None
    with watcher_lock(paths):  # the sensors' claim is gone with the process
        assert watcher_pid(paths) == os.getpid()
