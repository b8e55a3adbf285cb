"""The collector: recovers, owns the write-ahead log, the roller and the admission of regulated
subjects' calls, and accepts messages."""

from __future__ import annotations

import logging
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import msgspec

from collector.admission import Admission
from collector.roller import Roller, recover
from collector.wal import (
    SEALED_SUFFIX,
    WalUnavailable,
    WriteAheadLog,
    encode_frames,
    list_segments,
)
from mallard.commands import command_catalog
from mallard.errors import Unavailable
from mallard.paths import DataPaths
from mallard.regulations import AdmissionLists
from mallard.settings import Settings

_encoder = msgspec.json.Encoder()
log = logging.getLogger(__name__)
# How long a load of the regulation lists retries before the calls waiting for it get 503: long
# enough for a busy file, short enough that a sender is answered soon while they are unreadable.
LISTS_RETRY_S = 1.0


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
            on_seal=self._roll,
        )
        self.admission = Admission(AdmissionLists(paths, retry_s=LISTS_RETRY_S))

    def _roll(self, sealed: Path) -> None:
        """The log's on_seal (on its writer thread): hand the segment to the roller. A roller
        killed (its pool broken) is started again and given every sealed segment still in the
        log; before, the BrokenProcessPool ended the writer thread and every later call waited
        forever without an answer."""
        try:
            self.roller.submit(sealed)
        except BrokenProcessPool:
            log.error("the roller process died; starting it again")
            self.roller.close()
            self.roller.start()
            for segment in list_segments(self.wal_dir):
                if segment.suffix == SEALED_SUFFIX:
                    self.roller.submit(segment)

    async def start(self) -> None:
        # The lists load before any call is admitted. If they cannot be read the server still
        # starts, and every call answers 503 until they can (fail closed).
        try:
            await self.admission.current()
        except Unavailable:
            log.error("the regulation lists cannot be read: ingestion answers 503 until they can")
        # The asset and journey ids commands are checked against, loaded before any call.
        command_catalog().refresh(force=True)
        next_seq = recover(self.wal_dir, self.paths, self.collector_id)
        self.roller.start()
        self.wal.start(next_seq)

    async def stop(self) -> None:
        """Drain: sync what is pending, seal, and land everything before exiting."""
        self.wal.close()
        self.roller.close()

    async def accept(self, records: list[Any]) -> None:
        """Returns once every record (a stored message, or a dropped call's record:
        collector.admission) is durable; Unavailable if the log cannot be written."""
        try:
            await self.wal.append_frames_async(encode_frames(records, _encoder))
        except WalUnavailable as e:
            # The log tries a fresh segment once a second (WriteAheadLog._retry).
            raise Unavailable(
                "the collector cannot write its log; retry later", headers={"Retry-After": "1"}
            ) from e
