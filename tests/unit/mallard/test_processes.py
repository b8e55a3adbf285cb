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


def _stubborn() -> tuple[subprocess.Popen[bytes], int]:
    """A group that ignores SIGTERM, and its grandchild's PID, once both ignore it."""
    stubborn = _group([sys.executable, "-c", STUBBORN])
    assert stubborn.stdout is not None
    return stubborn, int(stubborn.stdout.readline())


def _stop_timed(procs: list[subprocess.Popen[bytes]], timeout: float) -> tuple[float, list[int]]:
    """Seconds stop_groups took, and each process's return code as it left them (None: still
    running); whatever it left running is killed after."""
    try:
        t0 = time.monotonic()
        stop_groups(procs, timeout)
        took = time.monotonic() - t0
        codes = [proc.returncode for proc in procs]
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return took, codes


def test_sigterm_then_sigkill_within_the_timeout() -> None:
    # The SIGKILL path's own cost on this host, now: a stubborn group given no time at all.
    other, _ = _stubborn()
    kill_cost, codes = _stop_timed([other], 0)
    assert codes == [-signal.SIGKILL]
    timeout = 2.0
    cooperative = _group(["sleep", "60"])
    stubborn, grandchild = _stubborn()  # SIGTERM is ignored from here on
    took, codes = _stop_timed([cooperative, stubborn], timeout)
    # stop_groups itself ended both (a code set before the clean-up above kills anything).
    assert codes == [-signal.SIGTERM, -signal.SIGKILL]
    assert _gone(grandchild)  # the whole group, not the child alone
    # SIGKILL comes no sooner than the timeout, and once it has passed, no later than a
    # generous multiple of what killing a stubborn group costs here (waiting a second timeout,
    # or for the group to end by itself, breaks it).
    slack = max(1.0, 20 * kill_cost)
    print(f"stop_groups: {took:.2f} s (timeout {timeout:g} s); the kill alone: {kill_cost:.3f} s")
    assert timeout <= took < timeout + slack, (took, kill_cost)


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
