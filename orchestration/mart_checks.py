"""What the marts' health checks measure, read from one snapshot of the lake and the landing dir:
events against the messages stored, the marts' lag behind the landing files, the duplicates rate.

The expected relations come from the models' own tables, not from their rules restated here:
every stored message the last pass took is an event or an extra copy of one (`marts.duplicates`
counts the copies dedup drops), and what the marts reflect is the window of the pass the
`marts.freshness` row names (`state.pass_manifest`). Regulations keep the relation: a Delete
removes the subject's stored messages, events and duplicates rows alike, and Suppress and NoTrack
drop messages before they are stored. orchestration/defs/checks.py makes them Dagster checks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from mallard import landing
from mallard.paths import DataPaths
from orchestration.warehouse import lake_connection

# The marts lag the landing files when a file landed this long ago is not yet in them. A watcher
# or the sensor starts a pass within seconds of a landing and the backstop schedule every 15
# minutes; a pass at 10M messages takes ~30 s, so 15 minutes means passes are not keeping up.
MAX_LAG_S = 15 * 60
# Client retries (a timeout, an SDK's flush after a crash) resend a few messages in a thousand;
# 5% of all stored messages being extra copies means a client retries in a loop.
MAX_DUPLICATES_RATE = 0.05

_SNAPSHOT = """
    with built as (
        select freshness.pass_id, freshness.built_at, freshness.data_through,
            manifest.loaded_through
        from lake.marts.freshness as freshness
        inner join lake.state.pass_manifest as manifest on freshness.pass_id = manifest.pass_id
    )
    select
        built.pass_id,
        built.built_at,
        built.data_through,
        built.loaded_through,
        (select count(*) from lake.marts.events) as events,
        (select count(*) from lake.raw.messages where loaded_at <= built.loaded_through) as stored,
        (select coalesce(sum(duplicate_count), 0) from lake.marts.duplicates) as extra_copies,
        (
            select list(landing_file) from lake.raw.landing_files
            where loaded_at <= built.loaded_through
        ) as reflected_files
    from built
"""


@dataclass(frozen=True)
class MartsHealth:
    pass_id: int
    built_at: datetime
    data_through: datetime | None  # the newest receipt the marts reflect
    events: int
    stored: int  # messages stored up to the end of the pass's window, copies included
    extra_copies: int  # sum(marts.duplicates.duplicate_count)
    landing_files: int  # complete files in the landing dir
    waiting_files: int  # of them, not yet in the marts (not loaded, or loaded after the pass)
    oldest_waiting_s: float  # how long the longest-waiting of those has been there; 0 if none
    newest_landing: str | None  # the landing file that landed last

    @property
    def expected_events(self) -> int:
        return self.stored - self.extra_copies

    @property
    def events_match(self) -> bool:
        return self.events == self.expected_events

    @property
    def duplicates_rate(self) -> float:
        return self.extra_copies / self.stored if self.stored else 0.0

    @property
    def fresh(self) -> bool:
        return self.oldest_waiting_s <= MAX_LAG_S


def marts_health(paths: DataPaths, now: float | None = None) -> MartsHealth | None:
    """The figures of the last pass that built the marts; None before any did."""
    conn = lake_connection(paths)
    try:
        row = conn.execute(_SNAPSHOT).fetchone()
    finally:
        conn.close()
    if row is None:
        return None
    pass_id, built_at, data_through, _, events, stored, extra, reflected = row
    reflected = set(reflected or [])
    now = time.time() if now is None else now
    # When a file landed: its inode-change time, set by the rename that lands it, or an S3
    # object's time (as orchestration.load.landing_mark reads it).
    landed = {f.name: f.mtime_ns / 1e9 for f in landing.listing(paths)}
    waiting = [t for name, t in landed.items() if name not in reflected]
    return MartsHealth(
        pass_id=int(pass_id),
        built_at=built_at,
        data_through=data_through,
        events=int(events),
        stored=int(stored),
        extra_copies=int(extra),
        landing_files=len(landed),
        waiting_files=len(waiting),
        oldest_waiting_s=max(0.0, now - min(waiting)) if waiting else 0.0,
        newest_landing=max(landed, key=landed.__getitem__) if landed else None,
    )
