"""The pipeline's builds run niced, so the API's reads on the same machine come first."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


def _after(env: dict[str, str], calls: int) -> tuple[int, int, int]:
    """(niceness, scheduling policy, policy of a process started after) once a process called
    yield_cpu_to_readers `calls` times."""
    code = (
        "import os, subprocess, sys\n"
        # Start from the normal policy whatever the test process's is (a job run on its main
        # thread would leave it SCHED_IDLE, and processes started from it inherit that).
        "try:\n"
        "    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\n"
        "except (AttributeError, PermissionError):\n"
        "    pass\n"
        "start = os.sched_getscheduler(0) if hasattr(os, 'sched_getscheduler') else 0\n"
        "from orchestration.context import yield_cpu_to_readers\n"
        f"for _ in range({calls}): yield_cpu_to_readers()\n"
        "probe = 'import os; print(os.sched_getscheduler(0))'\n"
        "child = subprocess.run([sys.executable, '-c', probe],"
        " capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(os.nice(0), os.sched_getscheduler(0), child, start)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    nice, policy, child, start = out.stdout.split()
    if int(start) != 0:  # SCHED_OTHER
        pytest.skip(f"SKIPPED LOUDLY: the test process's policy {start} cannot be reset to normal")
    return int(nice), int(policy), int(child)


def _nice_after(env: dict[str, str], calls: int) -> int:
    return _after({"MALLARD_PIPELINE_IDLE": "0", **env}, calls)[0]


def test_builds_run_at_the_configured_niceness_once() -> None:
    base = os.nice(0)
    assert _nice_after({"MALLARD_PIPELINE_NICE": str(base + 7)}, 1) == base + 7
    # Called by every asset of a run: the niceness does not climb.
    assert _nice_after({"MALLARD_PIPELINE_NICE": str(base + 7)}, 3) == base + 7
    # Never lowered (that would need privileges, and is not this setting's job).
    assert _nice_after({"MALLARD_PIPELINE_NICE": "0"}, 1) == base


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_builds_run_under_sched_idle_unless_turned_off() -> None:
    """By default a build takes only the CPU reads leave: SCHED_IDLE, inherited by what it
    starts (dbt, and DuckDB's threads in it); MALLARD_PIPELINE_IDLE=0 keeps it niced only."""
    base = os.nice(0)
    nice, policy, child = _after({"MALLARD_PIPELINE_NICE": str(base + 3)}, 2)
    assert (nice, policy, child) == (base + 3, os.SCHED_IDLE, os.SCHED_IDLE)
    nice, policy, child = _after(
        {"MALLARD_PIPELINE_NICE": str(base + 3), "MALLARD_PIPELINE_IDLE": "0"}, 1
    )
    assert (nice, policy, child) == (base + 3, os.SCHED_OTHER, os.SCHED_OTHER)


def test_the_read_index_builder_thread_alone_yields(tmp_path: Path) -> None:
    """The API's background index builds run niced; its request threads keep their priority."""
    from api import service
    from api.service import Warehouse
    from mallard.paths import DataPaths

    seen: list[tuple[int, int]] = []
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    wh = Warehouse(DataPaths(tmp_path), build_nice=main + 5)

    def files_of(self: Warehouse, version: int) -> None:
        seen.append((version, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(service.Warehouse, "_files_of", files_of)
        wh._follow(7)
        deadline = time.monotonic() + 10
        while wh._builder_running and time.monotonic() < deadline:
            time.sleep(0.01)
    assert seen == [(7, main + 5)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main
