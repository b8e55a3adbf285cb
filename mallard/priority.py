"""Background work yields the CPU to the API's reads on a shared machine."""

from __future__ import annotations

import os
import threading


def yield_cpu(nice: int) -> None:
    """Run the calling thread at niceness `nice` (never lowering it). On Linux the niceness is a
    thread's: the threads and processes it starts inherit it (DuckDB's workers, dbt), the
    process's other threads (the API's request threads) keep theirs."""
    tid = threading.get_native_id()
    if nice > os.getpriority(os.PRIO_PROCESS, tid):
        os.setpriority(os.PRIO_PROCESS, tid, nice)
