"""Reads as of a time (`asOf`): a profile's traits and the account's events as they stood then,
from the trait_history mart at the request's snapshot.

The mart holds each trait's value per period of event time, per profile as it stood (a visitor
is its own profile until identified); these reads only pick the periods holding at that time and
assemble them. Always SQL on the lake: the index serves the current answers only, which stay as
fast as they were.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from api.marts import EVENTS, TRAIT_HISTORY, at
from api.params import EventQuery, add_event_filters
from api.service.lake import Lake
from api.service.snapshot import Snapshot

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

# The periods holding at the time `?` (given twice).
_HOLDING = "valid_from <= ? and (valid_to is null or valid_to > ?)"


class AsOfReads(Lake):
    """The asOf reads of one Warehouse."""

    def traits_as_of(
        self,
        snap: Snapshot,
        account_id: str,
        as_of: datetime,
        customer_ids: list[str] | None = None,
        email: str | None = None,
    ) -> list[tuple[str, str]]:
        """(customer id then, traits object) of the profiles that stood at `as_of` among these
        ids, or with this email then (case-insensitively); the keys in sorted order."""
        history = at(TRAIT_HISTORY, snap.version)
        if email is not None:
            which = (
                f"customer_id_then in (select customer_id_then from {history}"
                f" where account_id = ? and trait_key = 'email' and {_HOLDING}"
                " and lower(trait_value ->> '$') = lower(?))"
            )
            which_params: list[Any] = [account_id, as_of, as_of, email]
        else:
            which, which_params = "customer_id_then in (select unnest(?))", [customer_ids or []]
        rows = self._query(
            "select customer_id_then, '{' || string_agg(to_json(trait_key)::varchar || ':'"
            " || trait_value::varchar, ',' order by trait_key) || '}'"
            f" from {history} where account_id = ? and {which} and {_HOLDING}"
            " group by customer_id_then order by customer_id_then",
            [account_id, *which_params, as_of, as_of],
        )
        return [(r[0], r[1]) for r in rows]

    def events_as_of(
        self, snap: Snapshot, account_id: str, brand_id: str, q: EventQuery
    ) -> list[str]:
        """A page of the account's events with event time <= q.as_of, each record's customer
        (customerId, userId, externalId, rawData.userId, email) as it stood then: a visitor's
        event before its identification is the visitor's."""
        assert q.as_of is not None
        where = ["account_id = ?", "brand_id = ?", "event_time <= ?"]
        params: list[Any] = [account_id, brand_id, q.as_of]
        add_event_filters(q, where, params)
        order = "desc" if q.sort == "desc" else "asc"
        rows = self._query(
            f"""
            with page as (
                select
                    record, customer_id, event_time, event_id,
                    record ->> '$.rawData.anonymousId' as anonymous_id
                from {at(EVENTS, snap.version)}
                where {" and ".join(where)}
                order by event_time {order}, event_id {order} limit ? offset ?
            ),
            history as (
                select * from {at(TRAIT_HISTORY, snap.version)}
                where account_id = ? and customer_id in (select customer_id from page)
                    and trait_key in ('id', 'externalId', 'email') and {_HOLDING}
            ),
            held as (
                select page.*, coalesce(visitor.customer_id_then, page.customer_id) as then_id
                from page
                left join history as visitor
                    on visitor.trait_key = 'id' and visitor.anonymous_id = page.anonymous_id
                    and visitor.customer_id = page.customer_id
                    and visitor.customer_id_then != visitor.customer_id
            )
            select
                held.record, held.then_id, external.trait_value ->> '$',
                email.trait_value ->> '$'
            from held
            left join history as external
                on external.customer_id_then = held.then_id and external.trait_key = 'externalId'
            left join history as email
                on email.customer_id_then = held.then_id and email.trait_key = 'email'
            order by held.event_time {order}, held.event_id {order}
            """,
            [*params, q.size, q.offset, account_id, q.as_of, q.as_of],
        )
        return [_as_it_stood(*r) for r in rows]


def _as_it_stood(record: str, customer_id: str, user_id: str | None, email: str | None) -> str:
    """The event record with its customer as it stood; the stored text when that is the same."""
    doc = _decode(record)
    then = {"customerId": customer_id, "userId": user_id, "externalId": user_id, "email": email}
    raw = doc.get("rawData") or {}
    if all(doc.get(k) == v for k, v in then.items()) and raw.get("userId") == user_id:
        return record
    doc.update(then)
    if isinstance(raw, dict):
        raw["userId"] = user_id
    return _encode(doc).decode()
