"""A generation counter: an 8-byte file a store's writers increment after every change and its
readers map, so a reader learns of a change by another process without a system call.

The regulation lists (`regulations.generation`) and the control store (`control.generation`)
use one each; a reader compares the mapped value with the one its cached view was loaded at.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from pathlib import Path


class Generation:
    """The 8-byte counter file every change of a store increments (mapped by readers)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._map: mmap.mmap | None = None

    def _ensure(self) -> None:
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_size < 8:
                    os.pwrite(fd, struct.pack("<Q", 1), 0)
                    os.fsync(fd)
            finally:
                os.close(fd)

    def read(self) -> int:
        if self._map is None:
            self._ensure()
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_READ)
        return int(struct.unpack_from("<Q", self._map, 0)[0])

    def bump(self) -> int:
        self._ensure()
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            value = struct.unpack("<Q", os.pread(fd, 8, 0))[0] + 1
            os.pwrite(fd, struct.pack("<Q", value), 0)
            os.fsync(fd)
            return int(value)
        finally:
            os.close(fd)
