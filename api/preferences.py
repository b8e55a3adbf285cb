"""Marketing preferences by subscription id: read, validate, write.

The state of record is the dbt model `customer_profiles` (read through the view
`customer_preferences`): per key (a channel, a category, unsubscribe-all) the change with the
latest (event time, receipt, messageId) wins, whether it came by this endpoint or by an
identify trait. An update is written as a track message (`preferences_updated`, or
`unsubscribed` for unsubscribe-all) through the collector, durable before the answer, so it
reaches that model like any other message.

Read-your-writes before the next pipeline run: after the log has the message, its per-key
changes go into a small SQLite journal (api/preferences_journal.py) with the same event time,
receipt and messageId the message carries. A read takes the warehouse's winners (the model
keeps each winner's ordering in `state`) and the journal's changes not yet in that snapshot,
and keeps the latest per key. "Latest per key" is a maximum, and a maximum over the union of
two sets is the maximum of their maxima, so the answer equals what the model computes once the
pipeline has loaded those messages. Keeping a change that is already loaded changes nothing (a
maximum is idempotent), which is why marking journal rows loaded is only an optimisation.
Identify calls not yet loaded are not overlaid: only this endpoint's own writes are read back
early.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from api.marts import CUSTOMER_PREFERENCES, EVENTS, at
from api.service import Snapshot, Warehouse
from collector.messages import Tenant, stamp, validate
from collector.routes import decode_object
from mallard.errors import InvalidRequest, NotFound
from mallard.preferences import CHANNELS, Choices
from mallard.tenancy import ControlStore

SUBSCRIPTION_ID = re.compile(r"[0-9a-f]{64}")
UPDATE_FIELDS = ("categories", "channels", "unsubscribeAll", "unsubscribeReason")
MAX_REASON_CHARS = 2000
MAX_ASSET_ID_CHARS = 200
UNSUBSCRIBE_ALL = ("unsubscribe_all", "")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


@dataclass(frozen=True)
class Change:
    """One key set by one message, with the ordering the model's rule uses."""

    kind: str  # channel | category | unsubscribe_all
    key: str
    value: bool
    event_time: datetime
    received_at: datetime
    message_id: str

    def order(self) -> tuple[datetime, datetime, str]:
        return (self.event_time, self.received_at, self.message_id)


def latest(changes: list[Change]) -> dict[tuple[str, str], bool]:
    """Per key the value of the latest change: the model's rule, over warehouse winners and
    journal changes (see the module docstring)."""
    winners: dict[tuple[str, str], Change] = {}
    for c in changes:
        k = (c.kind, c.key)
        if k not in winners or c.order() > winners[k].order():
            winners[k] = c
    return {k: c.value for k, c in winners.items()}


@dataclass(frozen=True)
class Subscriber:
    """A row of marts.customer_preferences."""

    subscription_id: str
    customer_id: str
    client_id: str
    account_id: str
    brand_id: str
    user_id: str | None
    anonymous_id: str | None
    state: list[Change]


def resource(
    sub: Subscriber, choices: Choices, state: dict[tuple[str, str], bool], write_key: str | None
) -> dict[str, Any]:
    """The preferences resource: channels opt-in, categories opt-out."""
    return {
        "writeKey": write_key or "",
        "customerId": sub.customer_id,
        "channels": [
            {"channel": ch, "name": CHANNELS[ch], "subscribed": state.get(("channel", ch), False)}
            for ch in choices.channels
        ],
        "categories": [
            {
                "category": cat.display,
                "name": cat.name,
                "subscribed": state.get(("category", cat.name), True),
            }
            for cat in choices.categories
        ],
        "unsubscribeAll": state.get(UNSUBSCRIBE_ALL, False),
    }


@dataclass(frozen=True)
class Update:
    channels: dict[str, bool]
    categories: dict[str, bool]
    unsubscribe_all: bool | None
    reason: str | None


def _items(body: dict[str, Any], field: str, key: str, allowed: list[str]) -> dict[str, bool]:
    raw = body.get(field)
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise InvalidRequest(f'"{field}" must be an array of {{{key}, subscribed}}')
    out: dict[str, bool] = {}
    for i, item in enumerate(raw):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object {{{key}, subscribed}}")
        extra = sorted(set(item) - {key, "subscribed"})
        if extra:
            raise InvalidRequest(f'{where}: unknown field "{extra[0]}"')
        name = item.get(key)
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{where}.{key} must be a non-empty string")
        if name not in allowed:
            raise InvalidRequest(
                f"{where}: unknown {key} {name!r}; this account has {', '.join(allowed) or 'none'}"
            )
        if not isinstance(item.get("subscribed"), bool):
            raise InvalidRequest(f"{where}.subscribed must be true or false")
        if name in out:
            raise InvalidRequest(f"{where}: {key} {name!r} is listed twice")
        out[name] = item["subscribed"]
    return out


def parse_update(raw: bytes, choices: Choices) -> Update:
    """The update body, checked against the brand's choices."""
    body = decode_object(raw)
    unknown = sorted(set(body) - set(UPDATE_FIELDS))
    if unknown:
        raise InvalidRequest(f'unknown field "{unknown[0]}"; use {", ".join(UPDATE_FIELDS)}')
    channels = _items(body, "channels", "channel", list(choices.channels))
    categories = _items(body, "categories", "category", [c.name for c in choices.categories])
    unsubscribe_all = body.get("unsubscribeAll")
    if unsubscribe_all is not None and not isinstance(unsubscribe_all, bool):
        raise InvalidRequest('"unsubscribeAll" must be true or false')
    reason = body.get("unsubscribeReason")
    if reason is not None and not isinstance(reason, str):
        raise InvalidRequest('"unsubscribeReason" must be a string')
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise InvalidRequest(f'"unsubscribeReason" is limited to {MAX_REASON_CHARS} characters')
    if unsubscribe_all and (any(channels.values()) or any(categories.values())):
        raise InvalidRequest(
            '"unsubscribeAll": true cannot subscribe to a channel or category in the same update'
        )
    if not channels and not categories and unsubscribe_all is None:
        raise InvalidRequest('nothing to update: send "channels", "categories" or "unsubscribeAll"')
    return Update(channels, categories, unsubscribe_all, reason)


def update_message(
    sub: Subscriber, choices: Choices, update: Update, asset_id: str | None
) -> dict[str, Any]:
    """The track message that records an update, with its whole effect spelled out.

    Unsubscribe-all sets every channel and every configured category to unsubscribed; an
    update that subscribes to something without saying `unsubscribeAll` ends unsubscribe-all
    (opting in again is what the customer asked for). Both are written into the message, so the
    model and the journal read the same explicit changes and no rule is applied twice.
    """
    channels, categories = dict(update.channels), dict(update.categories)
    unsubscribe_all = update.unsubscribe_all
    if unsubscribe_all:
        channels = dict.fromkeys(CHANNELS, False)
        categories = {**dict.fromkeys((c.name for c in choices.categories), False), **categories}
    elif unsubscribe_all is None and (any(channels.values()) or any(categories.values())):
        unsubscribe_all = False
    props: dict[str, Any] = {
        "channels": [{"channel": k, "subscribed": v} for k, v in channels.items()],
        "categories": [{"category": k, "subscribed": v} for k, v in categories.items()],
    }
    if unsubscribe_all is not None:
        props["unsubscribeAll"] = unsubscribe_all
    if update.reason is not None:
        props["reason"] = update.reason
    if asset_id:
        props["assetId"] = asset_id
    msg: dict[str, Any] = {
        "event": "unsubscribed" if update.unsubscribe_all else "preferences_updated",
        "properties": props,
    }
    if sub.user_id:
        msg["userId"] = sub.user_id
    else:
        msg["anonymousId"] = sub.anonymous_id
    return msg


def changes_of(stored: dict[str, Any]) -> list[Change]:
    """The per-key changes a stored update message makes, as int_preference_changes reads them."""
    props = stored["properties"]
    t, r = parse_time(stored["timestamp"]), parse_time(stored["receivedAt"])
    m = stored["messageId"]
    out = [Change("channel", i["channel"], i["subscribed"], t, r, m) for i in props["channels"]]
    out += [
        Change("category", i["category"], i["subscribed"], t, r, m) for i in props["categories"]
    ]
    if "unsubscribeAll" in props:
        out.append(Change(*UNSUBSCRIBE_ALL, props["unsubscribeAll"], t, r, m))
    return out


class Journal(Protocol):
    """Changes this server accepted, until the snapshot a reader uses has them (the SQLite one:
    api/preferences_journal.py, which stores this module's Changes)."""

    def add(self, customer_id: str, event_id: str, changes: list[Change]) -> None: ...

    def pending(self, customer_id: str, version: int) -> dict[str, list[Change]]: ...

    def mark_loaded(self, event_ids: list[str], version: int) -> None: ...


def allows_marketing(
    state: dict[tuple[str, str], bool], channel: str, category: str | None
) -> bool:
    """Whether marketing on this channel and category may go out under the state: the
    channel opted in, the category not opted out, and not unsubscribeAll (the resource's rule)."""
    return (
        state.get(("channel", channel), False)
        and (category is None or state.get(("category", category), True))
        and not state.get(UNSUBSCRIBE_ALL, False)
    )


class Preferences:
    """Reads and writes preferences: the warehouse, the journal and the brand's choices."""

    def __init__(self, warehouse: Warehouse, journal: Journal) -> None:
        self.warehouse = warehouse
        self.journal = journal
        self._checked: dict[str, int] = {}  # customer id -> snapshot last checked for loads

    def snapshot(self) -> Snapshot:
        """The snapshot the read API serves (cached per catalog change, freshness included)."""
        return self.warehouse.snapshot()

    def subscriber(self, snap: Snapshot, subscription_id: str) -> Subscriber:
        """The customer the id addresses; NotFound for anything else (ids are never listed)."""
        if not SUBSCRIPTION_ID.fullmatch(subscription_id):
            raise NotFound("unknown subscription id")
        rows = self.warehouse._query(
            "select customer_id, client_id, account_id, brand_id, user_id, anonymous_id, state"
            f" from {at(CUSTOMER_PREFERENCES, snap.version)}"
            " where subscription_id = ?",
            [subscription_id],
        )
        if not rows:
            raise NotFound("unknown subscription id")
        cid, client, account, brand, user_id, anon_id, state = rows[0]
        changes = [
            Change(
                s["kind"],
                s["key"],
                bool(s["value"]),
                parse_time(s["eventTime"]),
                parse_time(s["receivedAt"]),
                s["messageId"],
            )
            for s in json.loads(state)
        ]
        return Subscriber(subscription_id, cid, client, account, brand, user_id, anon_id, changes)

    def state(self, snap: Snapshot, sub: Subscriber) -> dict[tuple[str, str], bool]:
        """The warehouse's winners overlaid with the journal's changes not in this snapshot."""
        pending = self.journal.pending(sub.customer_id, snap.version)
        # Which pending changes a snapshot has can only change with the snapshot: ask once.
        if pending and self._checked.get(sub.customer_id) != snap.version:
            loaded = self.warehouse._query(
                f"select event_id from {at(EVENTS, snap.version)}"
                " where customer_id = ? and event_id in (select unnest(?))",
                [sub.customer_id, list(pending)],
            )
            if loaded:
                self.journal.mark_loaded([r[0] for r in loaded], snap.version)
            if len(self._checked) > 100_000:
                self._checked.clear()
            self._checked[sub.customer_id] = snap.version
        return latest(sub.state + [c for changes in pending.values() for c in changes])

    def answer(
        self, snap: Snapshot, sub: Subscriber, choices: Choices, control: ControlStore
    ) -> dict[str, Any]:
        key = control.current_write_key(sub.client_id, sub.account_id, sub.brand_id)
        return resource(sub, choices, self.state(snap, sub), key)

    def read(self, subscription_id: str, choices_for: Any, control: ControlStore) -> dict[str, Any]:
        snap = self.snapshot()
        sub = self.subscriber(snap, subscription_id)
        return self.answer(snap, sub, choices_for(sub), control)

    @staticmethod
    def tenant(sub: Subscriber) -> Tenant:
        return Tenant(sub.client_id, sub.account_id, sub.brand_id)

    @staticmethod
    def stamped(
        sub: Subscriber,
        choices: Choices,
        update: Update,
        asset_id: str | None,
        request_ip: str | None,
    ) -> dict[str, Any]:
        msg = update_message(sub, choices, update, asset_id)
        validate("track", msg)
        return stamp(
            "track",
            msg,
            Preferences.tenant(sub),
            channel="server",
            source="preferences",
            received=datetime.now(UTC),
            request_ip=request_ip,
        )


def check_asset_id(asset_id: str | None) -> str | None:
    if asset_id is not None and len(asset_id) > MAX_ASSET_ID_CHARS:
        raise InvalidRequest(f'"assetId" is limited to {MAX_ASSET_ID_CHARS} characters')
    return asset_id or None
