"""The record of the last pipeline pass: what `/health`, `mallard pipeline status` and `mallard
up` show, so a failing pipeline is seen where people look, not only in a log.

Every pass writes it as it ends, whoever runs it (the watcher, `mallard pipeline run`, a run
Dagster launches, a regulation's catch-up): one JSON file in the data dir's run folder, replaced
by rename, so a reader sees the whole of one record. It counts the passes that failed in a row,
which the watcher's backoff and its loud line after `LOUD_AFTER` failures read.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from mallard.paths import DataPaths

# After this many failed passes in a row the watcher says so at error level, and `mallard up`
# prints it however quiet it is otherwise.
LOUD_AFTER = 3


@dataclass(frozen=True)
class PassRecord:
    kind: str  # full or served
    launched_by: str
    started_at: str  # ISO 8601, UTC
    ended_at: str
    ok: bool
    error: str | None  # the first failed step, `<step>: <summary>`
    failed_in_a_row: int  # 0 after a pass that succeeded
    pass_number: int  # passes recorded in this data dir, this one included

    @property
    def loud(self) -> bool:
        return self.failed_in_a_row >= LOUD_AFTER

    def line(self) -> str:
        """One line for a terminal."""
        head = (
            f"last pass #{self.pass_number} ({self.kind}, by {self.launched_by})"
            f" ended {self.ended_at}"
        )
        if self.ok:
            return f"{head}: ok"
        return f"{head}: FAILED ({self.failed_in_a_row} in a row): {self.error}"


def read_last_pass(paths: DataPaths) -> PassRecord | None:
    try:
        return PassRecord(**json.loads(paths.last_pass.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def record_pass(
    paths: DataPaths,
    kind: str,
    launched_by: str,
    started: datetime,
    error: str | None,
) -> PassRecord:
    """Write the record of a pass that just ended (error None: it succeeded). Called in the
    writer's turn of the lake, so records are written one at a time."""
    before = read_last_pass(paths)
    record = PassRecord(
        kind=kind,
        launched_by=launched_by,
        started_at=started.astimezone(UTC).isoformat(timespec="milliseconds"),
        ended_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        ok=error is None,
        error=error,
        failed_in_a_row=0 if error is None else (before.failed_in_a_row if before else 0) + 1,
        pass_number=(before.pass_number if before else 0) + 1,
    )
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.last_pass.with_name(f".{paths.last_pass.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=1))
    os.replace(tmp, paths.last_pass)
    return record
