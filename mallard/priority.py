"""Background work yields the CPU to the API's reads on a shared machine."""

from __future__ import annotations

import os
import threading


def yield_cpu(nice: int, idle: bool = False) -> None:
    """Run the calling thread at niceness `nice` (never lowering it), and with `idle` under
    Linux's SCHED_IDLE policy. On Linux both are a thread's: the threads and processes it starts
    inherit them (DuckDB's workers, dbt), the process's other threads (the API's request threads)
    keep theirs.

    A niced thread still runs out its time slice when a read wakes up (~1-4 ms under EEVDF); a
    SCHED_IDLE one is preempted at once by any normal thread that wakes. At 10M events, one pass
    of 100k events under 2 connections of reads: traits p99 outside the read
    index's updates 5.88 ms at nice 10, 4.86 ms under SCHED_IDLE; the pass 107 vs 112 s. Its
    cost: on a machine kept busy by reads and ingest, the pass gets only what they leave."""
    tid = threading.get_native_id()
    if nice > os.getpriority(os.PRIO_PROCESS, tid):
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    if idle and hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) != os.SCHED_IDLE:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
