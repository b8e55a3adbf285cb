from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from api.preferences import (
    Change,
    Subscriber,
    Update,
    changes_of,
    latest,
    parse_update,
    resource,
    update_message,
)
from api.preferences_journal import PreferencesJournal
from collector.messages import Tenant, stamp
from mallard.errors import InvalidRequest
from mallard.preferences import Category, Choices

CHOICES = Choices(
    ("email", "sms"), (Category("weekly_news", "Weekly News"), Category("offers", "Offers"))
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _sub(user_id: str | None = "u1", state: list[Change] | None = None) -> Subscriber:
    return Subscriber("ab" * 32, "c1", "demo", "demo", "DEMO", user_id, "anon-1", state or [])


def test_latest_orders_by_event_time_then_receipt_then_message_id() -> None:
    later = T0 + timedelta(seconds=1)
    changes = [
        Change("channel", "email", True, later, T0, "m1"),
        Change("channel", "email", False, T0, later + timedelta(hours=1), "m2"),  # arrived last
        Change("channel", "sms", True, T0, T0, "m1"),
        Change("channel", "sms", False, T0, later, "m0"),  # same time, later receipt
        Change("category", "offers", True, T0, T0, "a"),
        Change("category", "offers", False, T0, T0, "b"),  # full tie: messageId
    ]
    assert latest(changes) == {
        ("channel", "email"): True,
        ("channel", "sms"): False,
        ("category", "offers"): False,
    }
    # The rule is a maximum: any split and re-merge gives the same answer (the overlay).
    assert latest(changes[3:] + changes[:3]) == latest(changes)


def test_resource_applies_opt_in_channels_and_opt_out_categories() -> None:
    res = resource(_sub(), CHOICES, {("channel", "sms"): True, ("category", "offers"): False}, "wk")
    assert res == {
        "writeKey": "wk",
        "customerId": "c1",
        "channels": [
            {"channel": "email", "name": "Email", "subscribed": False},
            {"channel": "sms", "name": "SMS", "subscribed": True},
        ],
        "categories": [
            {"category": "Weekly News", "name": "weekly_news", "subscribed": True},
            {"category": "Offers", "name": "offers", "subscribed": False},
        ],
        "unsubscribeAll": False,
    }


def test_parse_update_accepts_every_field() -> None:
    body = {
        "channels": [{"channel": "email", "subscribed": True}],
        "categories": [{"category": "offers", "subscribed": False}],
        "unsubscribeAll": False,
        "unsubscribeReason": "",
    }
    assert parse_update(json.dumps(body).encode(), CHOICES) == Update(
        {"email": True}, {"offers": False}, False, ""
    )


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"channels": [{"channel": "push", "subscribed": True}]}, "push"),
        ({"categories": [{"category": "news", "subscribed": True}]}, "news"),
        ({"channels": [{"channel": "email", "subscribed": True, "x": 1}]}, '"x"'),
        ({"unsubscribeReason": "x" * 2001, "unsubscribeAll": True}, "2000"),
        ({"unsubscribeReason": "only a reason"}, "nothing to update"),
    ],
)
def test_parse_update_refuses(body: object, needle: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_update(json.dumps(body).encode(), CHOICES)
    assert needle in e.value.message


def test_unsubscribe_all_spells_out_every_channel_and_category() -> None:
    msg = update_message(_sub(), CHOICES, Update({}, {}, True, "bye"), "CAMP")
    assert msg["event"] == "unsubscribed" and msg["userId"] == "u1"
    props = msg["properties"]
    assert {c["channel"] for c in props["channels"]} == {
        "email",
        "sms",
        "whatsapp",
        "facebook",
        "push",
    }
    assert props["categories"] == [
        {"category": "weekly_news", "subscribed": False},
        {"category": "offers", "subscribed": False},
    ]
    assert not [c for c in props["channels"] if c["subscribed"]]
    assert (props["unsubscribeAll"], props["reason"], props["assetId"]) == (True, "bye", "CAMP")


def test_opting_in_ends_unsubscribe_all_and_opting_out_leaves_it() -> None:
    on = update_message(_sub(), CHOICES, Update({"email": True}, {}, None, None), None)
    assert on["event"] == "preferences_updated" and on["properties"]["unsubscribeAll"] is False
    off = update_message(_sub(), CHOICES, Update({"email": False}, {}, None, None), None)
    assert "unsubscribeAll" not in off["properties"] and "assetId" not in off["properties"]


def test_anonymous_customer_is_addressed_by_anonymous_id() -> None:
    msg = update_message(_sub(user_id=None), CHOICES, Update({"sms": True}, {}, None, None), None)
    assert msg["anonymousId"] == "anon-1" and "userId" not in msg


def test_changes_of_a_stored_message_carry_its_ordering() -> None:
    msg = update_message(
        _sub(), CHOICES, Update({"email": True}, {"offers": False}, None, None), None
    )
    stored = stamp(
        "track",
        msg,
        Tenant("demo", "demo", "DEMO"),
        channel="server",
        source="preferences",
        received=T0,
        request_ip=None,
    )
    got = changes_of(stored)
    assert {(c.kind, c.key, c.value) for c in got} == {
        ("channel", "email", True),
        ("category", "offers", False),
        ("unsubscribe_all", "", False),
    }
    assert {(c.event_time, c.received_at, c.message_id) for c in got} == {
        (T0, T0, stored["messageId"])
    }


def test_journal_serves_changes_until_a_snapshot_has_them(tmp_path: Path) -> None:
    journal = PreferencesJournal(tmp_path / "j.sqlite")
    change = Change("channel", "email", True, T0, T0, "m1")
    journal.add("c1", "e1", [change])
    journal.add("c1", "e2", [Change("channel", "sms", True, T0, T0, "m2")])
    assert journal.pending("c2", 5) == {}
    assert journal.pending("c1", 5) == {
        "e1": [change],
        "e2": [Change("channel", "sms", True, T0, T0, "m2")],
    }
    journal.mark_loaded(["e1"], 7)
    assert set(journal.pending("c1", 7)) == {"e2"}
    # A reader still on an older snapshot keeps seeing it.
    assert set(journal.pending("c1", 6)) == {"e1", "e2"}
