"""Validation and server stamping of incoming calls.

Every endpoint family (server HTTP, tag, mobile, Segment drop-in) goes through these two steps:
`validate(kind, msg, ...)` raises InvalidRequest naming the field and the rule, and
`stamp(...)` returns the stored message with the server fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from mallard.commands import check_command
from mallard.errors import InvalidRequest
from mallard.ids import new_id
from mallard.schemas import STORED_VERSION

CALL_KINDS = ("identify", "track", "page", "screen", "group", "alias")
BATCH_KINDS = ("identify", "group", "track", "page", "screen", "alias")
OBJECT_FIELDS = ("traits", "properties", "context")


@dataclass(frozen=True)
class Tenant:
    client_id: str
    account_id: str
    brand_id: str


_last_iso: tuple[datetime | None, str] = (None, "")


def iso(t: datetime) -> str:
    """ISO-8601 UTC with millisecond precision and a `Z`, as every stored timestamp."""
    global _last_iso
    last, text = _last_iso
    if t is last:  # a batch's calls share their receivedAt: formatted once
        return text
    u = t if t.tzinfo is UTC else t.astimezone(UTC)
    # isoformat is C code; strftime was the largest single cost of stamping a batch.
    text = u.isoformat(timespec="milliseconds")[:-6] + "Z"
    _last_iso = (t, text)
    return text


# The form iso() writes. A client timestamp already in it (as SDKs send them) is stored as sent:
# parsed (validated) but not formatted again, and the cache of iso() keeps the request's
# receivedAt (formatting each call's own timestamp there made every call of a batch miss it).
_ISO_FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z", re.ASCII)


def _iso_of(value: str, t: datetime) -> str:
    """iso(t) of a time parsed from `value`, without formatting it when `value` is in its form."""
    if _ISO_FORM.fullmatch(value):
        return value
    u = t if t.tzinfo is UTC else t.astimezone(UTC)
    return u.isoformat(timespec="milliseconds")[:-6] + "Z"


def parse_time(value: Any, field: str, where: str = "") -> datetime:
    if not isinstance(value, str):
        raise InvalidRequest(f'{where}"{field}" must be an ISO-8601 string')
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        try:
            d = date.fromisoformat(value)
        except ValueError:
            raise InvalidRequest(
                f'{where}"{field}" must be an ISO-8601 date-time, got {value[:40]!r}'
            ) from None
        t = datetime(d.year, d.month, d.day)
    if t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    try:
        # 0001-01-01T00:00+01:00 parses but is before the first UTC time (was a 500).
        return t.astimezone(UTC)
    except OverflowError:
        raise InvalidRequest(
            f'{where}"{field}" falls outside the years 1 to 9999 in UTC, got {value[:40]!r}'
        ) from None


def validate(kind: str, msg: Any, *, require_event: bool = True, where: str = "") -> None:
    """Raise InvalidRequest unless msg is a valid call of this kind.

    require_event: the tenant routes require `event` on identify ("identify") and page ("page")
    as the interface's field table says; Segment-compatible routes do not send it.
    """
    if not isinstance(msg, dict):
        raise InvalidRequest(f"{where}body must be a JSON object")
    user_id, anon_id = msg.get("userId"), msg.get("anonymousId")
    if user_id is None and anon_id is None:
        raise InvalidRequest(f'{where}"userId" or "anonymousId" is required')
    for name, value in (("userId", user_id), ("anonymousId", anon_id)):
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidRequest(f'{where}"{name}" must be a non-empty string')
    for name in OBJECT_FIELDS:
        if name in msg and msg[name] is not None and not isinstance(msg[name], dict):
            raise InvalidRequest(f'{where}"{name}" must be an object')
    for name in ("timestamp", "sentAt"):
        if msg.get(name) is not None:
            parse_time(msg[name], name, where)
    if "messageId" in msg and (not isinstance(msg["messageId"], str) or not msg["messageId"]):
        raise InvalidRequest(f'{where}"messageId" must be a non-empty string')
    event = msg.get("event")
    if kind == "identify":
        if require_event and event != "identify":
            raise InvalidRequest(f'{where}"event" must be "identify" for identify')
        if require_event and not isinstance(msg.get("traits"), dict):
            raise InvalidRequest(f'{where}"traits" is required for identify')
    elif kind == "track":
        if not isinstance(event, str) or not event.strip():
            raise InvalidRequest(f'{where}"event" is required for track and must be a string')
        # Commands (send_email, ..., start_journey in any case) must name a known asset/journey.
        check_command(msg, where)
    elif kind == "page":
        if require_event and event != "page":
            raise InvalidRequest(f'{where}"event" must be "page" for page')
    elif kind == "screen":
        if "name" in msg and msg["name"] is not None and not isinstance(msg["name"], str):
            raise InvalidRequest(f'{where}"name" must be a string')
    elif kind == "group":
        if not isinstance(msg.get("groupId"), str | int) or msg.get("groupId") == "":
            raise InvalidRequest(f'{where}"groupId" is required for group')
    elif kind == "alias" and (
        not isinstance(msg.get("previousId"), str) or not msg.get("previousId")
    ):
        raise InvalidRequest(f'{where}"previousId" is required for alias')
    if event is not None and not isinstance(event, str):
        # The roller lands `event` as a string column: any other value stopped the landing of
        # its whole log segment, and every start of the server after it.
        raise InvalidRequest(f'{where}"event" must be a string')


def batch_item_kind(item: Any, index: int) -> str:
    """The method of a batch item: its `type`, or else an `event` naming a method."""
    where = f"batch[{index}]: "
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where}item must be a JSON object")
    kind = item.get("type")
    if kind is None:
        kind = item.get("event")
        if kind not in BATCH_KINDS:
            raise InvalidRequest(
                f'{where}"type" is required (or "event" naming a method: {", ".join(BATCH_KINDS)})'
            )
    elif kind not in BATCH_KINDS:
        raise InvalidRequest(f'{where}"type" must be one of {", ".join(BATCH_KINDS)}')
    return str(kind)


def stamp(
    kind: str,
    msg: dict[str, Any],
    tenant: Tenant,
    *,
    channel: str,
    source: str,
    received: datetime,
    request_ip: str | None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """The stored message: the client's fields plus eventId (event_id, or a new id),
    receivedAt, timestamp, ..."""
    stored = dict(msg)
    stored.pop("writeKey", None)
    received_iso = iso(received)
    ts_raw, sent_raw = msg.get("timestamp"), msg.get("sentAt")
    if ts_raw is not None:
        ts = parse_time(ts_raw, "timestamp")
        stored["originalTimestamp"] = ts_raw
        if sent_raw is not None:
            # Client clock skew: shift the event by the gap between sentAt and receipt.
            try:
                ts = received - (parse_time(sent_raw, "sentAt") - ts)
            except OverflowError:
                raise InvalidRequest(
                    '"timestamp" corrected by "sentAt" falls outside the years 1 to 9999'
                ) from None
            stored["timestamp"] = _iso_of("", ts)
        else:
            stored["timestamp"] = _iso_of(ts_raw, ts)
    else:
        stored["timestamp"] = received_iso
    if sent_raw is not None:
        stored["sentAt"] = _iso_of(sent_raw, parse_time(sent_raw, "sentAt"))
    context = dict(msg.get("context") or {})
    if (
        "ip" not in context
        and request_ip
        and (context.get("direct") is True or channel in ("browser", "mobile"))
    ):
        context["ip"] = request_ip
    stored["context"] = context
    stored["type"] = kind
    stored["eventId"] = event_id or new_id()
    stored["messageId"] = msg.get("messageId") or stored["eventId"]
    stored["receivedAt"] = received_iso
    stored["channel"] = channel
    stored["version"] = STORED_VERSION
    stored["source"] = source
    stored["clientId"], stored["accountId"], stored["brandId"] = (
        tenant.client_id,
        tenant.account_id,
        tenant.brand_id,
    )
    return stored
