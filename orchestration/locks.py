"""The locks between processes that write the lake: one loader, and one writer of the models."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from mallard.paths import DataPaths


@contextmanager
def _file_lock(paths: DataPaths, name: str) -> Iterator[None]:
    paths.lake_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.lake_dir / name, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_lock(paths: DataPaths) -> AbstractContextManager[None]:
    """One loader at a time: two concurrent appends of the same file would both commit."""
    return _file_lock(paths, ".load.lock")


def build_lock(paths: DataPaths) -> AbstractContextManager[None]:
    """One writer of the models at a time (a dbt build or maintenance): two would conflict on
    commit."""
    return _file_lock(paths, ".build.lock")
