"""Who starts the work: the pipeline watcher runs the passes, the Dagster daemon is its fallback.

`mallard up` (what `make run` calls) starts a pipeline watcher (`mallard pipeline run --watch`):
one warm process that runs a pass as soon as landing files appear and compacts the tables its
passes fragmented, seconds sooner than a run the daemon launches in a new process. While it runs
(it holds the watcher lock, `orchestration/locks.py`), the daemon's landing-files sensor,
backstop schedule and compaction sensor start nothing, so no two processes build the same
models. When no watcher runs (it was never started, or it ended), they do that work instead: a
data dir served by the daemon alone (`dagster dev`, a deployment without `mallard up`) still
gets its passes. Nightly maintenance is the daemon's either way: the watcher never runs it.

Every sensor and schedule asks `daemon_stands_back` first; a pass, whoever starts it, runs the
job `pass_job` names.
"""

from __future__ import annotations

from typing import Literal

from mallard.paths import DataPaths
from orchestration.resources import LakeResource
from orchestration.window import full_tests_due

# The two jobs of a pass (orchestration/defs/__init__.py): the same assets, and the checks of the
# tests the pass runs, so that no check is left without a result.
PIPELINE = "pipeline"
PIPELINE_EVERY_TEST = "pipeline_every_test"
PASS_JOBS = (PIPELINE, PIPELINE_EVERY_TEST)

Work = Literal["pass", "compaction", "nightly maintenance"]
# What the watcher does itself, after each pass.
WATCHER_RUNS: frozenset[Work] = frozenset({"pass", "compaction"})


def daemon_stands_back(lake: LakeResource, work: Work) -> str | None:
    """Why the daemon starts no run of this work now (a sensor's or schedule's skip reason), or
    None if it should."""
    if work not in WATCHER_RUNS:
        return None
    pid = lake.watcher_pid()
    return None if pid is None else f"the pipeline watcher (pid {pid}) runs passes and compaction"


def pass_job(paths: DataPaths) -> str:
    """The job the next pass runs: every test after the dbt project changed (the first pass of a
    data dir too), else the tests every pass runs (orchestration/window.py)."""
    return PIPELINE_EVERY_TEST if full_tests_due(paths.dbt_target) else PIPELINE
