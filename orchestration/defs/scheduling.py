"""Who starts the work: the pipeline watcher runs the passes, the Dagster daemon is its fallback.

`mallard up` (what `make run` calls) starts a pipeline watcher (`mallard pipeline run --watch`):
one warm process that runs a pass as soon as landing files appear and compacts the tables its
passes fragmented and dispatches what they made due, seconds sooner than a run the daemon
launches in a new process. While it runs (it holds the watcher lock, `orchestration/locks.py`),
the daemon's landing-files sensor, backstop schedule, compaction sensor and dispatch sensor
start nothing, so no two processes build the same models. When no watcher runs (it was never
started, or it ended), they do that work instead: a data dir served by the daemon alone
(`dagster dev`, a deployment without `mallard up`) still gets its passes and its sends.
Nightly maintenance is the daemon's either way: the watcher never runs it.

Every sensor and schedule asks `daemon_stands_back` first.
"""

from __future__ import annotations

from typing import Literal

from orchestration.resources import LakeResource

Work = Literal["pass", "compaction", "dispatch", "nightly maintenance"]
# What the watcher does itself, after each pass.
WATCHER_RUNS: frozenset[Work] = frozenset({"pass", "compaction", "dispatch"})


def daemon_stands_back(lake: LakeResource, work: Work) -> str | None:
    """Why the daemon starts no run of this work now (a sensor's or schedule's skip reason), or
    None if it should."""
    if work not in WATCHER_RUNS:
        return None
    pid = lake.watcher_pid()
    return None if pid is None else f"the pipeline watcher (pid {pid}) runs passes and compaction"
