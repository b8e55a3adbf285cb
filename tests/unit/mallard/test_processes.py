"""stop_groups on real process groups: SIGTERM first, SIGKILL for a group still there."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mallard.processes import stop_groups

# Ignores SIGTERM and starts a child in its group that ignores it too; prints the child's PID
# once both ignore it.
IGNORE = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
STUBBORN = f"""{IGNORE}
import subprocess
child = subprocess.Popen(
    [sys.executable, "-c", "{IGNORE}; print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE
)
child.stdout.readline()
print(child.pid, flush=True)
child.wait()
"""


def _group(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE)


def _gone(pid: int, timeout: float = 10) -> bool:
    """The process has exited (reaped, or a zombie left to whoever reaps orphans here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_then_sigkill_within_the_timeout() -> None:
    cooperative = _group(["sleep", "60"])
    stubborn = _group([sys.executable, "-c", STUBBORN])
    assert stubborn.stdout is not None
    grandchild = int(stubborn.stdout.readline())  # SIGTERM is ignored from here on
    try:
        t0 = time.monotonic()
        stop_groups([cooperative, stubborn], 1.0)
        took = time.monotonic() - t0
    finally:
        for proc in (cooperative, stubborn):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert cooperative.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert _gone(grandchild)  # the whole group, not the child alone
    assert 1.0 <= took < 1.0 + 3


def test_only_running_processes_are_terminated() -> None:
    done = _group(["true"])
    done.wait()
    running = _group(["sleep", "60"])
    asked: list[int] = []

    def terminate(proc: subprocess.Popen[bytes]) -> None:
        asked.append(proc.pid)
        proc.terminate()

    stop_groups([done, running], 5, terminate)
    assert asked == [running.pid]
    assert running.returncode == -signal.SIGTERM
