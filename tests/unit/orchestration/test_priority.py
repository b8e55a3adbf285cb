"""The pipeline's builds run niced, so the API's reads on the same machine come first."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


def _nice_after(env: dict[str, str], calls: int) -> int:
    code = (
        "import os\n"
        "from orchestration.context import yield_cpu_to_readers\n"
        f"for _ in range({calls}): yield_cpu_to_readers()\n"
        "print(os.nice(0))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def test_builds_run_at_the_configured_niceness_once() -> None:
    base = os.nice(0)
    assert _nice_after({"MALLARD_PIPELINE_NICE": str(base + 7)}, 1) == base + 7
    # Called by every asset of a run: the niceness does not climb.
    assert _nice_after({"MALLARD_PIPELINE_NICE": str(base + 7)}, 3) == base + 7
    # Never lowered (that would need privileges, and is not this setting's job).
    assert _nice_after({"MALLARD_PIPELINE_NICE": "0"}, 1) == base


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
