"""PLACEHOLDER until the read API lands: warehouse reads for the API."""

from __future__ import annotations

from mallard.paths import DataPaths


class Warehouse:
    def __init__(self, paths: DataPaths) -> None:
        self.paths = paths

    def close(self) -> None:
        pass
