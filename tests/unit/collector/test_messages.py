"""Stamping of server fields."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from collector.messages import Tenant, batch_item_kind, parse_time, stamp, validate
from mallard.errors import InvalidRequest

T = Tenant("c", "a", "A")
RECEIVED = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def _stamp(
    msg: dict[str, Any], channel: str = "server", ip: str | None = "10.0.0.9", kind: str = "track"
) -> dict[str, Any]:
    return stamp(kind, msg, T, channel=channel, source="http", received=RECEIVED, request_ip=ip)


def test_server_fields() -> None:
    s = _stamp({"userId": "u", "event": "E"})
    assert s["receivedAt"] == "2026-05-01T12:00:00.000Z"
    assert s["timestamp"] == s["receivedAt"]  # absent: receipt time
    assert s["messageId"] == s["eventId"]
    assert (s["clientId"], s["accountId"], s["brandId"]) == ("c", "a", "A")
    assert (s["type"], s["channel"], s["version"]) == ("track", "server", "1")
    assert "ip" not in s["context"]


def test_client_message_id_is_kept() -> None:
    assert _stamp({"userId": "u", "event": "E", "messageId": "m-1"})["messageId"] == "m-1"


def test_clock_skew_is_corrected_with_sent_at() -> None:
    # The client's clock is 1 hour fast: it stamped the event 10 s before sending it.
    s = _stamp(
        {
            "userId": "u",
            "event": "E",
            "timestamp": "2026-05-01T13:00:00Z",
            "sentAt": "2026-05-01T13:00:10Z",
        }
    )
    assert s["timestamp"] == "2026-05-01T11:59:50.000Z"
    assert s["originalTimestamp"] == "2026-05-01T13:00:00Z"
    assert s["sentAt"] == "2026-05-01T13:00:10.000Z"


def test_historical_timestamp_without_sent_at_is_kept() -> None:
    s = _stamp({"userId": "u", "event": "E", "timestamp": "2020-01-02T03:04:05.678+02:00"})
    assert s["timestamp"] == "2020-01-02T01:04:05.678Z"


@pytest.mark.parametrize(
    ("context", "channel", "ip"),
    [
        ({}, "server", None),
        ({"direct": True}, "server", "10.0.0.9"),
        ({"ip": "1.2.3.4", "direct": True}, "server", "1.2.3.4"),
        ({}, "browser", "10.0.0.9"),
        ({}, "mobile", "10.0.0.9"),
        ({"ip": "1.2.3.4"}, "browser", "1.2.3.4"),
    ],
)
def test_ip_rule(context: dict[str, Any], channel: str, ip: str | None) -> None:
    s = _stamp({"userId": "u", "event": "E", "context": context}, channel=channel)
    assert s["context"].get("ip") == ip


def test_write_key_is_never_stored() -> None:
    assert "writeKey" not in _stamp({"userId": "u", "event": "E", "writeKey": "wk_secret"})


@pytest.mark.parametrize(
    ("kind", "msg", "message"),
    [
        ("track", {"event": "E"}, '"userId" or "anonymousId" is required'),
        ("track", {"userId": 5, "event": "E"}, '"userId" must be a non-empty string'),
        ("track", {"userId": "u"}, '"event" is required for track'),
        ("identify", {"userId": "u", "traits": {}}, '"event" must be "identify"'),
        ("identify", {"userId": "u", "event": "identify"}, '"traits" is required for identify'),
        ("page", {"userId": "u"}, '"event" must be "page"'),
        ("screen", {"userId": "u", "name": 3}, '"name" must be a string'),
        (
            "track",
            {"userId": "u", "event": "E", "properties": []},
            '"properties" must be an object',
        ),
        ("track", {"userId": "u", "event": "E", "context": "x"}, '"context" must be an object'),
        (
            "track",
            {"userId": "u", "event": "E", "timestamp": "yesterday"},
            '"timestamp" must be an ISO-8601 date-time',
        ),
        ("track", [], "body must be a JSON object"),
    ],
)
def test_validation_names_field_and_rule(kind: str, msg: Any, message: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        validate(kind, msg)
    assert message in e.value.message


def test_batch_item_kind() -> None:
    assert batch_item_kind({"type": "page"}, 0) == "page"
    assert batch_item_kind({"event": "identify"}, 0) == "identify"
    with pytest.raises(InvalidRequest, match=r"batch\[3\]"):
        batch_item_kind({"event": "Order Completed"}, 3)
    with pytest.raises(InvalidRequest, match=r"batch\[1\]"):
        batch_item_kind({"type": "nope"}, 1)


def test_parse_time_accepts_dates() -> None:
    assert parse_time("2026-01-02", "timestamp") == datetime(2026, 1, 2, tzinfo=UTC)


def test_iso_formats_each_time_and_remembers_only_the_same_object() -> None:
    from datetime import timedelta, timezone

    from collector.messages import iso

    a = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert iso(a) == iso(a) == "2026-05-01T12:00:00.123Z"
    b = a + timedelta(milliseconds=1)
    assert iso(b) == "2026-05-01T12:00:00.124Z"
    # An equal time in another zone is its own object: converted, not the remembered text.
    c = datetime(2026, 5, 1, 14, 0, 0, 124000, tzinfo=timezone(timedelta(hours=2)))
    assert iso(c) == "2026-05-01T12:00:00.124Z"
    assert iso(datetime(2026, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=3)))) == (
        "2026-05-01T11:00:00.000Z"
    )


def test_journey_clock_iso_is_strftimes_text() -> None:
    from mallard import clock

    for ts in (0.0, 1.5, 1_999_999_999.000001, 1_764_237_600.25):
        expected = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert clock.iso(ts) == expected
