"""The lake of one data dir as a Dagster resource: what the assets, ops and sensors share."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

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

    def build_lock(self) -> AbstractContextManager[None]:
        """One writer of the models at a time (a dbt build or maintenance)."""
        return locks.build_lock(self.paths)

    def watcher_pid(self) -> int | None:
        """The PID of the live pipeline watcher of this data dir, or None if none runs."""
        return locks.watcher_pid(self.paths)
