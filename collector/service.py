"""PLACEHOLDER until the collector lands: owns the write-ahead log and the roller."""

from __future__ import annotations

from mallard.paths import DataPaths
from mallard.settings import Settings


class Collector:
    def __init__(self, settings: Settings, paths: DataPaths) -> None:
        self.settings, self.paths = settings, paths

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass
