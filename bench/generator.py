"""Reproducible synthetic traffic: customers, anonymous visitors who later identify, an
identify/track/page/screen mix with realistic properties, client retries (duplicates), late
and clock-skewed events. Streams in chunks, so 10M events never sit in memory at once (the only
per-customer state is one byte per customer).

`client_messages()` yields what an SDK would send; `stored_messages()` the same stamped by the
collector's own `stamp()`, encoded as in its log; `landing_batches()` landing-schema tables built
by the collector's roller (bench/lake.py writes landing files through the roller itself).
`split(n)` cuts the model into n independent parts (disjoint customers, each over the whole time
span), so n processes can generate 10M events in parallel, each like one collector.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pyarrow as pa

from collector.messages import Tenant, stamp
from collector.roller import records_to_tables

EVENTS = [
    "Product Viewed",
    "Product Added",
    "Checkout Started",
    "Order Completed",
    "Logged In",
    "Signed Up",
    "Email Opened",
    "Search Performed",
    "Video Played",
]
PLANS = ["free", "pro", "team", "enterprise"]
CITIES = ["Lisbon", "Berlin", "Austin", "Osaka", "Nairobi", "Lima", "Oslo", "Pune"]
CAMPAIGNS = [
    None,
    None,
    None,
    {"name": "spring", "source": "newsletter", "medium": "email"},
    {"name": "brand", "source": "google", "medium": "cpc"},
]
_enc = msgspec.json.Encoder()


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def event_id(received: datetime, node: int, n: int) -> str:
    """A UUIDv7-shaped eventId, time-ordered by receipt like the collector's (mallard.ids),
    but a function of the model (node) and the stream position: same seed, same ids."""
    ms = int(received.timestamp() * 1000)
    value = (
        (ms & 0xFFFFFFFFFFFF) << 80
        | 0x7 << 76
        | ((n >> 32) & 0xFFF) << 64
        | 0b10 << 62
        | (node & 0x3FFFFFFF) << 32
        | (n & 0xFFFFFFFF)
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True)
class Traffic:
    """A traffic model. Same seed and sizes, same stream."""

    seed: int = 42
    customers: int = 10_000
    events: int = 100_000
    anonymous_share: float = 0.3  # visitors browsing anonymously before they identify
    never_identified_share: float = 0.1  # visitors who never identify
    duplicate_rate: float = 0.01  # client retries: same messageId sent again
    late_rate: float = 0.005  # events whose timestamp is hours to days before receipt
    skew_rate: float = 0.05  # clients with a wrong clock, corrected with sentAt
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    span_days: float = 30.0
    client_id: str = "bench"
    account_id: str = "bench"
    brand_id: str = "BENCH"
    part: int = 0  # this model is part `part` of `parts` (see split)
    parts: int = 1

    def split(self, n: int) -> list[Traffic]:
        """n parts whose union is the traffic: customer c belongs to part c % n; each part has
        its share of the events over the whole span, and its own random stream."""
        if self.parts != 1:
            raise ValueError("split a whole traffic model, not a part")
        return [
            replace(self, part=k, parts=n, events=self.events // n + (k < self.events % n))
            for k in range(n)
        ]

    def client_messages(self) -> Iterator[dict[str, Any]]:
        """Messages in receipt order, each with a `_receivedAt` hint for landing generation."""
        whole = self.parts == 1
        rng = random.Random(self.seed if whole else f"{self.seed}/{self.part}/{self.parts}")
        # Customers of this part: part, part + parts, part + 2 * parts, ... below `customers`.
        mine = max(1, (self.customers - self.part + self.parts - 1) // self.parts)
        step = timedelta(days=self.span_days) / max(self.events, 1)
        identified = bytearray(mine)  # one byte per customer: 10M events, 1M customers, 1 MB
        never_below = self.customers * self.never_identified_share
        ids = f"{self.seed}" if whole else f"{self.seed}-{self.part}"
        sent = 0
        i = 0
        while sent < self.events:
            received = self.start + step * i
            i += 1
            local = rng.randrange(mine)
            c = local * self.parts + self.part
            anon_id = f"anon-{self.seed}-{c}"
            user_id = f"user-{c}"
            never = c < never_below
            browsing_anonymously = never or (
                not identified[local] and rng.random() < self.anonymous_share
            )
            kind = rng.choices(["identify", "track", "page", "screen"], [10, 60, 25, 5])[0]
            if never and kind == "identify":
                kind = "page"
            if not browsing_anonymously and not identified[local]:
                kind = "identify"
            msg: dict[str, Any] = {"type": kind, "messageId": f"m-{ids}-{i}"}
            if browsing_anonymously:
                msg["anonymousId"] = anon_id
            else:
                msg["userId"] = user_id
                if kind == "identify":
                    msg["anonymousId"] = anon_id
                    identified[local] = 1
            ctx: dict[str, Any] = {
                "userAgent": "Mozilla/5.0 (X11; Linux x86_64) Bench/1.0",
                "locale": "en-US",
                "ip": f"10.{c % 250}.{i % 250}.{c % 199}",
            }
            campaign = rng.choice(CAMPAIGNS)
            if campaign:
                ctx["campaign"] = campaign
            msg["context"] = ctx
            if kind == "identify":
                msg["event"] = "identify"
                msg["traits"] = {
                    "email": f"user{c}@example.com",
                    "firstName": f"First{c}",
                    "lastName": f"Last{c % 977}",
                    "plan": rng.choice(PLANS),
                    "address": {"city": rng.choice(CITIES), "country": "PT"},
                    "logins": rng.randrange(1000),
                }
            elif kind == "track":
                msg["event"] = rng.choice(EVENTS)
                msg["properties"] = {
                    "sku": f"sku-{rng.randrange(5000)}",
                    "price": round(rng.random() * 200, 2),
                    "currency": "EUR",
                    "category": rng.choice(CITIES).lower(),
                    "quantity": rng.randrange(1, 5),
                    "note": "x" * rng.randrange(40, 200),
                }
            elif kind == "page":
                msg["event"] = "page"
                msg["properties"] = {
                    "path": f"/p/{rng.randrange(300)}",
                    "title": "Product page",
                    "referrer": "https://search.example/",
                    "search": "",
                }
            else:
                msg["name"] = rng.choice(["Home", "Cart", "Settings"])
                msg["properties"] = {"build": rng.randrange(100)}
            ts = received - timedelta(milliseconds=rng.randrange(50, 3000))
            if rng.random() < self.late_rate:
                ts = received - timedelta(hours=rng.uniform(1, 96))
            if rng.random() < self.skew_rate:
                skew = timedelta(minutes=rng.uniform(-90, 90))
                msg["timestamp"] = _iso(ts + skew)
                msg["sentAt"] = _iso(received - timedelta(milliseconds=20) + skew)
            else:
                msg["timestamp"] = _iso(ts)
            msg["_receivedAt"] = received
            yield msg
            sent += 1
            if sent < self.events and rng.random() < self.duplicate_rate:
                dup = dict(msg)
                dup["_receivedAt"] = received + timedelta(seconds=rng.uniform(1, 600))
                yield dup
                sent += 1

    def stored_messages(self) -> Iterator[bytes]:
        """The stream as the collector stores it: its own `stamp()` (server channel, http
        source), encoded as in its log; the eventId is made from the stream position."""
        tenant = Tenant(self.client_id, self.account_id, self.brand_id)
        node = zlib.crc32(f"{self.seed}/{self.part}/{self.parts}".encode())
        for n, msg in enumerate(self.client_messages()):
            received: datetime = msg.pop("_receivedAt")
            stored = stamp(
                msg["type"],
                msg,
                tenant,
                channel="server",
                source="http",
                received=received,
                request_ip=None,
            )
            stored["eventId"] = event_id(received, node, n)
            yield _enc.encode(stored)

    def landing_batches(self, rows_per_batch: int = 100_000) -> Iterator[pa.Table]:
        """The stream as landing-schema tables of rows_per_batch rows, built by the collector's
        roller (`records_to_tables`) from the stored messages."""
        chunk: list[bytes] = []
        for raw in self.stored_messages():
            chunk.append(raw)
            if len(chunk) >= rows_per_batch:
                yield _concat(records_to_tables(chunk))
                chunk = []
        if chunk:
            yield _concat(records_to_tables(chunk))


def _concat(by_day: dict[str, pa.Table]) -> pa.Table:
    return pa.concat_tables(by_day[d] for d in sorted(by_day))
