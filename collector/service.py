"""The collector: recovers, owns the write-ahead log and the roller, and accepts messages."""

from __future__ import annotations

import msgspec

from collector.roller import Roller, recover
from collector.wal import WalUnavailable, WriteAheadLog
from mallard.errors import Unavailable
from mallard.paths import DataPaths
from mallard.settings import Settings

_encode = msgspec.json.Encoder().encode


class Collector:
    def __init__(self, settings: Settings, paths: DataPaths) -> None:
        self.settings = settings
        self.paths = paths
        self.collector_id = settings.collector_id
        self.wal_dir = paths.wal_dir / self.collector_id
        self.roller = Roller(paths, self.collector_id)
        self.wal = WriteAheadLog(
            self.wal_dir,
            roll_interval_s=settings.roll_interval_s,
            roll_max_bytes=settings.roll_max_bytes,
            fsync=settings.fsync,
            on_seal=self.roller.submit,
        )

    async def start(self) -> None:
        next_seq = recover(self.wal_dir, self.paths, self.collector_id)
        self.roller.start()
        self.wal.start(next_seq)

    async def stop(self) -> None:
        """Drain: sync what is pending, seal, and land everything before exiting."""
        self.wal.close()
        self.roller.close()

    async def accept(self, stored: list[dict[str, object]]) -> None:
        """Returns once every message is durable; Unavailable if the log cannot be written."""
        try:
            await self.wal.append_async([_encode(m) for m in stored])
        except WalUnavailable as e:
            raise Unavailable("the collector cannot write its log; retry later") from e
