"""The API's reads of the marts: events, profiles and identifiers at one snapshot, from its
index when one is built, else from SQL on the lake."""

from __future__ import annotations

import logging
from typing import Any

from api.marts import (
    AUDIENCE_MEMBERS,
    AUDIENCES,
    CUSTOMER_IDENTIFIERS,
    CUSTOMERS,
    EVENTS,
    PROFILES,
    at,
)
from api.pages import PagesLost
from api.params import EventQuery, add_event_filters
from api.service.as_of import AsOfReads
from api.service.serving import Serving
from api.service.snapshot import Snapshot

log = logging.getLogger(__name__)


class Warehouse(AsOfReads, Serving):
    """The marts as the API reads them (Serving: which snapshot, and its index; AsOfReads: the
    answers as of a time)."""

    def events(
        self,
        snap: Snapshot,
        account_id: str,
        brand_id: str,
        q: EventQuery,
        customer_ids: list[str] | None = None,
    ) -> list[str]:
        if q.as_of is not None:
            assert customer_ids is None, "asOf lists the account's events"
            return self.events_as_of(snap, account_id, brand_id, q)
        idx = self.index(snap)
        if idx is not None:
            hashes = None
            if customer_ids is not None:
                hashes = idx.customer_hashes(account_id, customer_ids)
            try:
                return idx.event_records(account_id, brand_id, q, hashes)
            except PagesLost:
                # Its events index is gone with the pages process: answer from SQL now, and
                # index again (in the background on a big lake).
                log.warning("event pages process lost the index of snapshot %d", idx.version)
                self._forget(idx)
        where = ["account_id = ?", "brand_id = ?"]
        params: list[Any] = [account_id, brand_id]
        if customer_ids is not None:
            if not customer_ids:
                return []
            where.append("customer_id in (select unnest(?))")
            params.append(customer_ids)
        add_event_filters(q, where, params)
        order = "desc" if q.sort == "desc" else "asc"
        rows = self._query(
            f"select record from {at(EVENTS, snap.version)}"
            f" where {' and '.join(where)}"
            f" order by event_time {order}, event_id {order} limit ? offset ?",
            [*params, q.size, q.offset],
        )
        return [r[0] for r in rows]

    # --- customers -------------------------------------------------------------------------

    def customers_by(
        self, snap: Snapshot, account_id: str, id_type: str, value: str, column: str
    ) -> list[tuple[str, str]]:
        """(customer_id, traits|metadata JSON) of the customers an idType:id names."""
        if column == "metadata":
            found = self.customers_by(snap, account_id, id_type, value, "id")
            return self._metadata(snap, [cid for cid, _ in found])
        idx = self.index(snap)
        if idx is not None:
            return idx.customers.lookup(account_id, id_type, value)
        key = {"userId": "user_id = ?", "id": "customer_id = ?", "email": "email_lower = lower(?)"}[
            id_type
        ]
        col = {"traits": "traits", "id": "null"}[column]
        rows = self._query(
            f"select customer_id, {col} from {at(PROFILES, snap.version)}"
            f" where account_id = ? and {key} order by customer_id",
            [account_id, value],
        )
        return [(r[0], r[1]) for r in rows]

    def _metadata(self, snap: Snapshot, customer_ids: list[str]) -> list[tuple[str, str]]:
        """The metadata objects of these customers, from the `customers` view (which splices
        firstEvent/lastEvent in). One query per customer: a filter on one customer_id reaches the
        scans of both tables behind the view, an IN list does not (seconds at 10M messages)."""
        out: list[tuple[str, str]] = []
        for cid in customer_ids:
            out += [
                (r[0], r[1])
                for r in self._query(
                    f"select customer_id, metadata from {at(CUSTOMERS, snap.version)}"
                    " where customer_id = ?",
                    [cid],
                )
            ]
        return out

    def customer_page(
        self, snap: Snapshot, account_id: str, after: str | None, offset: int, size: int
    ) -> list[tuple[str, str]]:
        idx = self.index(snap)
        if idx is not None:
            return idx.customers.page(account_id, after, offset, size)
        rows = self._query(
            f"select customer_id, traits from {at(PROFILES, snap.version)}"
            " where account_id = ? and customer_id > ? order by customer_id limit ? offset ?",
            [account_id, after or "", size, offset],
        )
        return [(r[0], r[1]) for r in rows]

    def identifiers(self, snap: Snapshot, customer_ids: list[str]) -> list[tuple[Any, ...]]:
        return self._query(
            "select customer_id, id_type, id_value, first_seen, last_seen"
            f" from {at(CUSTOMER_IDENTIFIERS, snap.version)}"
            " where customer_id in (select unnest(?)) order by id_type, first_seen, id_value",
            [customer_ids],
        )

    # --- audiences ---------------------------------------------------------------------------

    def audiences(self, snap: Snapshot, account_id: str) -> list[tuple[Any, ...]]:
        """(audience, status, error, members in the account) of every audience file."""
        return self._query(
            "select a.audience, a.status, a.error, count(m.customer_id)"
            f" from (from {at(AUDIENCES, snap.version)}) as a"
            f" left join (from {at(AUDIENCE_MEMBERS, snap.version)}) as m"
            " on m.audience = a.audience and m.account_id = ? and m.left_at is null"
            " group by all order by a.audience",
            [account_id],
        )

    def audience_member_page(
        self,
        snap: Snapshot,
        account_id: str,
        audience: str,
        after: str | None,
        offset: int,
        size: int,
    ) -> list[tuple[Any, ...]] | None:
        """(customer_id, user_id, entered_at) of the audience's current members in the account,
        by customer id after `after`; None when no such audience file is known."""
        known = self._query(
            f"select 1 from {at(AUDIENCES, snap.version)} where audience = ?", [audience]
        )
        if not known:
            return None
        return self._query(
            f"select customer_id, user_id, entered_at from {at(AUDIENCE_MEMBERS, snap.version)}"
            " where audience = ? and account_id = ? and left_at is null and customer_id > ?"
            " order by customer_id limit ? offset ?",
            [audience, account_id, after or "", size, offset],
        )
