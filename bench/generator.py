"""Reproducible synthetic traffic: customers, anonymous visitors who later identify, an
identify/track/page/screen mix with realistic properties, client retries (duplicates), late
and clock-skewed events. Streams in chunks, so 10M events never sit in memory at once.

`client_messages()` yields what an SDK would send; `landing_batches()` yields pyarrow tables in
the landing-file schema (what the collector would have written), for pipeline benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pyarrow as pa

from mallard.schemas import LANDING_SCHEMA, STORED_VERSION

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


@dataclass
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

    def client_messages(self) -> Iterator[dict[str, Any]]:
        """Messages in receipt order, each with a `_receivedAt` hint for landing generation."""
        rng = random.Random(self.seed)
        step = timedelta(days=self.span_days) / max(self.events, 1)
        identified: set[int] = set()
        sent = 0
        i = 0
        while sent < self.events:
            received = self.start + step * i
            i += 1
            c = rng.randrange(self.customers)
            anon_id = f"anon-{self.seed}-{c}"
            user_id = f"user-{c}"
            never = c < self.customers * self.never_identified_share
            browsing_anonymously = never or (
                c not in identified and rng.random() < self.anonymous_share
            )
            kind = rng.choices(["identify", "track", "page", "screen"], [10, 60, 25, 5])[0]
            if never and kind == "identify":
                kind = "page"
            if not browsing_anonymously and c not in identified:
                kind = "identify"
            msg: dict[str, Any] = {"type": kind, "messageId": f"m-{self.seed}-{i}"}
            if browsing_anonymously:
                msg["anonymousId"] = anon_id
            else:
                msg["userId"] = user_id
                if kind == "identify":
                    msg["anonymousId"] = anon_id
                    identified.add(c)
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

    def landing_batches(self, rows_per_batch: int = 100_000) -> Iterator[pa.Table]:
        """The stream as landing-file tables (server fields stamped as the collector would)."""
        cols: dict[str, list[Any]] = {f.name: [] for f in LANDING_SCHEMA}
        for n, msg in enumerate(self.client_messages(), start=1):
            received: datetime = msg.pop("_receivedAt")
            ts = datetime.fromisoformat(msg["timestamp"].replace("Z", "+00:00"))
            if "sentAt" in msg:
                sent_at = datetime.fromisoformat(msg["sentAt"].replace("Z", "+00:00"))
                ts = received - (sent_at - ts)
            else:
                sent_at = None
            ms = int(received.timestamp() * 1000)
            event_id = f"{ms:012x}-bench-{self.seed}-{n:010d}"
            stored = {
                **msg,
                "eventId": event_id,
                "clientId": self.client_id,
                "accountId": self.account_id,
                "brandId": self.brand_id,
                "receivedAt": _iso(received),
                "timestamp": _iso(ts),
                "channel": "server",
                "version": STORED_VERSION,
            }
            if sent_at is not None:
                stored["sentAt"] = _iso(sent_at)
            for k, v in (
                ("event_id", event_id),
                ("message_id", msg["messageId"]),
                ("client_id", self.client_id),
                ("account_id", self.account_id),
                ("brand_id", self.brand_id),
                ("type", msg["type"]),
                ("event", msg.get("event")),
                ("user_id", msg.get("userId")),
                ("anonymous_id", msg.get("anonymousId")),
                ("timestamp", ts),
                ("received_at", received),
                ("sent_at", sent_at),
                ("channel", "server"),
                ("source", "http"),
                ("message", _enc.encode(stored).decode()),
            ):
                cols[k].append(v)
            if len(cols["event_id"]) >= rows_per_batch:
                yield pa.table(cols, schema=LANDING_SCHEMA)
                cols = {f.name: [] for f in LANDING_SCHEMA}
        if cols["event_id"]:
            yield pa.table(cols, schema=LANDING_SCHEMA)
