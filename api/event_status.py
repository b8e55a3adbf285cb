"""`GET {base}/events/{eventId}/status`: how far an event got, and for a command what became of
each of its sends.

An event moves forward only: a write-ahead log segment, a landing file, `lake.raw.messages`,
`lake.marts.events`. The stages are asked furthest first (the answer is the furthest one that
has it); an event that moved on between two of the asks is missed by both, so a miss asks
once more before answering 404. Each ask is bounded:

- the marts and the raw table by eventId and account (eventIds are time-ordered, so the
  files' min/max statistics skip most of the raw table);
- the landing files only of the receive days the eventId's time names (the day before and
  after too, for a clock at midnight), only those the ledger says are not loaded, at most
  MAX_LANDING_FILES of them, newest first, through DuckDB's Parquet statistics;
- the log segments not rolled yet (seconds of traffic each), a byte search before any
  record is decoded.

A call a regulation dropped at the collector is `dropped`, with the list that dropped it as its
`reason` (`suppress`, `no_track`): the regulations store's `dropped_events` holds it once the
roller moved it there, a log segment not rolled yet holds its record before (collector.admission).
Only this endpoint, for a token holder, tells a dropped call from a kept one.

All reads go through the API's Warehouse (a read-only DuckDB on committed snapshots, which the
pipeline's writes never wait for) and a read-only SQLite connection to the outbox.
"""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import msgspec
from litestar import Controller, MediaType, Request, Response, get
from litestar.params import FromPath

from api.params import only
from api.schemas import responses
from api.service import Warehouse, freshness_headers, iso
from collector.admission import is_dropped_record
from collector.messages import Tenant
from collector.routes import TENANT, TENANT_PATH
from collector.wal import OPEN_SUFFIX, SEALED_SUFFIX, read_records
from mallard.errors import NotFound, refuse_large_bodies
from mallard.paths import DataPaths
from mallard.regulations import RegulationStore
from mallard.schemas import StoredHead
from mallard.warehouse import LAKE

PROCESSED, LOADED, RECEIVED, FAILED = "processed", "loaded", "received", "failed"
DROPPED = "dropped"
# Unloaded landing files one request reads at most (a backlog bigger than that is a pipeline
# that has stopped; its newest files are the likeliest to hold a just-accepted event).
MAX_LANDING_FILES = 200
# Log segments one request reads at most (each is a couple of seconds of one collector).
MAX_SEGMENTS = 64

# What a failed send's reason means, when the provider gave no error text of its own.
REASONS = {
    "customer_not_identified": "the command's customer has no userId",
    "unknown_asset": "the command's assetId names no asset now",
    "invalid_asset": "the command's asset does not load (`mallard assets check` says why)",
    "render_error": "the asset did not render for this customer",
    "bounced": "the mail server refused the address",
    "provider_error": "the provider refused the send",
    "provider_unavailable": "the provider stayed unavailable through the retries",
    "token_disabled": "the push provider said the device token is gone",
    "no_address": "the customer has no address or device for the channel",
    "preferences": "the customer's marketing preferences do not allow this send",
    "suppressed": "the address bounced before and is suppressed",
}


def reason_text(reason: str | None, error: str | None) -> str:
    """A send's error: the provider's own text, else what its reason means."""
    return error or REASONS.get(reason or "", reason or "the send failed")


_encode = msgspec.json.Encoder().encode
_decode_head = msgspec.json.Decoder(StoredHead)


class StatusError(msgspec.Struct):
    code: str
    message: str


class SendStatus(msgspec.Struct):
    sendId: str  # noqa: N815
    channel: str
    status: str
    reason: str | None
    attempts: int
    at: str
    error: str | None = None  # why, for a skipped or failed send or one waiting to retry


class EventStatus(msgspec.Struct):
    eventId: str  # noqa: N815
    status: str
    errors: list[StatusError]
    sends: list[SendStatus]
    # A dropped call only: the regulation's list that dropped it, suppress or no_track.
    reason: str | None = None


STATUS_EXAMPLE = {
    "eventId": "019ac2b0-5d1e-7000-8a3c-1f2e3d4c5b6a",
    "status": "processed",
    "reason": None,
    "errors": [],
    "sends": [
        {
            "sendId": "5f0c6b1e9a7d4c2b8e3f1a0d9c8b7a65",
            "channel": "email",
            "status": "sent",
            "reason": None,
            "attempts": 1,
            "at": "2026-11-26T21:04:05.120000Z",
            "error": None,
        }
    ],
}


def _time_of(event_id: str) -> datetime | None:
    """When the collector made this eventId (its first 48 bits: ms since the epoch)."""
    try:
        ms = int(event_id.replace("-", "")[:12], 16)
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return None


def in_marts(wh: Warehouse, account_id: str, event_id: str) -> bool:
    rows = wh._query(
        f"select 1 from {LAKE}.marts.events where event_id = ? and account_id = ? limit 1",
        [event_id, account_id],
    )
    return bool(rows)


def in_raw(wh: Warehouse, account_id: str, event_id: str) -> bool:
    rows = wh._query(
        f"select 1 from {LAKE}.raw.messages where event_id = ? and account_id = ? limit 1",
        [event_id, account_id],
    )
    return bool(rows)


def _candidate_landing_files(paths: DataPaths, event_id: str) -> list[Path]:
    """The complete landing files of the days the eventId may have been received on."""
    at = _time_of(event_id)
    if at is None:
        return []
    files: list[Path] = []
    for delta in (-1, 0, 1):
        day = (at + timedelta(days=delta)).strftime("%Y-%m-%d")
        folder = paths.landing_partition(day)
        with contextlib.suppress(FileNotFoundError):
            files += [p for p in folder.iterdir() if p.suffix == ".parquet" and p.name[0] != "."]
    return files


def in_landing(wh: Warehouse, paths: DataPaths, account_id: str, event_id: str) -> bool:
    files = _candidate_landing_files(paths, event_id)
    if not files:
        return False
    names = {str(p.relative_to(paths.landing_dir)): p for p in files}
    loaded = {
        r[0]
        for r in wh._query(
            f"select landing_file from {LAKE}.raw.landing_files"
            " where landing_file in (select unnest(?))",
            [list(names)],
        )
    }
    unloaded = [p for name, p in names.items() if name not in loaded]
    if not unloaded:
        return False

    def newest_first(p: Path) -> int:
        try:
            return -p.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    unloaded = sorted(unloaded, key=newest_first)[:MAX_LANDING_FILES]
    try:
        rows = wh._query(
            "select 1 from read_parquet(?) where event_id = ? and account_id = ? limit 1",
            [[str(p) for p in unloaded], event_id, account_id],
        )
    except duckdb.IOException:  # a file removed meanwhile (loaded and cleaned up): ask again
        return False
    return bool(rows)


def in_log(paths: DataPaths, account_id: str, event_id: str) -> str | None:
    """What a collector's log segment not rolled yet holds of the event: RECEIVED for the
    message, the list's name for a dropped call's record, None for nothing."""
    if not paths.wal_dir.exists():
        return None
    segments: list[Path] = []
    for folder in paths.wal_dir.iterdir():
        if folder.is_dir():
            segments += [p for p in folder.iterdir() if p.suffix in (OPEN_SUFFIX, SEALED_SUFFIX)]
    needle = event_id.encode()
    for segment in sorted(segments, key=lambda p: p.name, reverse=True)[:MAX_SEGMENTS]:
        try:
            if needle not in segment.read_bytes():
                continue
            for raw in read_records(segment):
                if needle not in raw:
                    continue
                if is_dropped_record(raw):
                    _, reason, account, dropped_id, _ = msgspec.json.decode(raw)
                    if dropped_id == event_id and account == account_id:
                        return str(reason)
                    continue
                head = _decode_head.decode(raw)
                if head.event_id == event_id and head.account_id == account_id:
                    return RECEIVED
        except (FileNotFoundError, msgspec.DecodeError):
            continue
    return None


def stage(
    wh: Warehouse, store: RegulationStore | None, account_id: str, event_id: str
) -> tuple[str, str | None] | None:
    """The furthest stage the event reached with the list that dropped it (for DROPPED), or
    None when the account has no such event."""
    paths = wh.paths
    for _ in range(2):  # a second time for an event that moved on between two asks
        if store is not None and (reason := store.dropped(account_id, event_id)) is not None:
            return DROPPED, reason
        if in_marts(wh, account_id, event_id):
            return PROCESSED, None
        if in_raw(wh, account_id, event_id):
            return LOADED, None
        if in_landing(wh, paths, account_id, event_id):
            return RECEIVED, None
        logged = in_log(paths, account_id, event_id)
        if logged == RECEIVED:
            return RECEIVED, None
        if logged is not None:
            return DROPPED, logged
    return None


def sends_of(paths: DataPaths, account_id: str, event_id: str) -> list[Any]:
    """The outbox's sends of a command (none for any other event), read-only."""
    from orchestration.delivery.outbox import _COLUMNS, _send

    if not paths.outbox_db.exists():
        return []
    conn = sqlite3.connect(f"file:{paths.outbox_db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            f"select {_COLUMNS} from sends where command_event_id = ? order by send_id",
            (event_id,),
        ).fetchall()
    except sqlite3.OperationalError:  # no sends table yet
        return []
    finally:
        conn.close()
    return [s for s in map(_send, rows) if s.account_id == account_id]


def event_status(
    wh: Warehouse, store: RegulationStore | None, account_id: str, event_id: str
) -> EventStatus | None:
    found = stage(wh, store, account_id, event_id)
    if found is None:
        return None
    status, reason = found
    if status == DROPPED:
        return EventStatus(event_id, status, [], [], reason)
    sends = sends_of(wh.paths, account_id, event_id)
    errors: list[StatusError] = []
    if sends and all(s.status == FAILED for s in sends):
        status = FAILED
        errors = [
            StatusError(s.reason or "failed", reason_text(s.reason, s.last_error)) for s in sends
        ]
    return EventStatus(
        event_id,
        status,
        errors,
        [
            SendStatus(
                s.send_id,
                s.channel,
                s.status,
                s.reason,
                s.attempts,
                iso(datetime.fromtimestamp(s.updated_at, UTC)),
                # Why it did not go (yet): a skip, a failure, a pending retry's last answer.
                reason_text(s.reason, s.last_error)
                if s.status != "sent" and (s.reason or s.last_error)
                else None,
            )
            for s in sends
        ],
    )


class EventStatusApi(Controller):
    """How far an event got, beside the read API (same auth, errors and tag)."""

    path = TENANT_PATH
    dependencies = TENANT
    before_request = refuse_large_bodies  # type: ignore[assignment]
    tags = ["Read API"]
    security = [{"authToken": []}]

    @get(
        "/events/{eventId:str}/status",
        operation_id="getEventStatus",
        sync_to_thread=True,
        summary="What became of an event",
        description="status: received (accepted, not loaded yet), loaded (in the warehouse's raw"
        " messages), processed (in the events the API serves), failed (a command whose sends"
        " all failed; errors say why) or dropped (a Suppress or NoTrack regulation of its user"
        " dropped it at the collector; reason: suppress or no_track, null otherwise; the"
        " sender's answer was that of any accepted call). sends: for a command (send_email,"
        " send_sms, send_push, send_print), each send with its outcome (pending, sending,"
        " sent, skipped, failed) and reason; empty for any other event. 404 for an eventId"
        " this account does not have.",
        responses=responses(
            EventStatus, "{eventId, status, reason, errors, sends}", example=STATUS_EXAMPLE
        ),
    )
    def get_event_status(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        eventId: FromPath[str],  # noqa: N803
    ) -> Response[bytes]:
        only(request, frozenset())
        wh: Warehouse = request.app.state.warehouse
        store: RegulationStore | None = getattr(request.app.state, "regulations", None)
        found = event_status(wh, store, tenant.account_id, eventId)
        headers = freshness_headers(wh.latest) if wh.latest is not None else {}
        if found is None:
            raise NotFound(f"no event {eventId}", headers=headers)
        return Response(_encode(found), media_type=MediaType.JSON, headers=headers)


ROUTES = [EventStatusApi]
