"""Stopping child processes that lead process groups of their own (start_new_session=True): a
group holds the child's workers too, so a stop signals the group, not the child alone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, exited and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def terminate_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)


def stop_groups(
    procs: Sequence[subprocess.Popen[bytes]],
    timeout: float,
    terminate: Callable[[subprocess.Popen[bytes]], None] = terminate_group,
) -> None:
    """Ask each running process to stop (`terminate`: SIGTERM to its group), all of them first,
    then wait for each in the same order, up to `timeout` s each: a group still there by then
    is SIGKILLed and waited for."""
    for proc in procs:
        if proc.poll() is None:
            terminate(proc)
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
