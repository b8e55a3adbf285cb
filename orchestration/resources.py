"""The lake of one data dir as a Dagster resource: what the assets, ops and sensors share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import dagster as dg

from mallard.paths import DataPaths
from orchestration import locks


class LakeResource(dg.ConfigurableResource):
    """The data dir's paths and the locks between the processes that write its lake.
    `build_definitions()` makes one from the data dir; no op reads the environment for it."""

    data_dir: str

    @property
    def paths(self) -> DataPaths:
        return DataPaths(Path(self.data_dir))

    def writer(self) -> AbstractContextManager[None]:
        """The lake writer's turn (orchestration/locks.py): one writer of the lake at a time."""
        return locks.lake_writer(self.paths)

    def watcher_pid(self) -> int | None:
        """The PID of the live pipeline watcher of this data dir, or None if none runs."""
        return locks.watcher_pid(self.paths)


# The resource key of the writer's turn, which the pipeline job's steps require.
WRITER = "writer"


class LakeWriterResource(dg.ConfigurableResource):
    """The lake writer's turn, held from a run's start to its end: what the pipeline job's
    steps require, so a run Dagster launches (the daemon's sensor or schedule, the UI) loads,
    builds and checks what it built with no other writer in between, as `run_pipeline` does
    around the runs it executes (the turn is re-entrant there). The job runs its steps in one
    process (in_process_executor), so the turn spans every step."""

    data_dir: str

    @contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext) -> Iterator[Any]:
        with locks.lake_writer(DataPaths(Path(self.data_dir))):
            yield self
