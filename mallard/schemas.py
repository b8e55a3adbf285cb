"""Wire and storage shapes shared by the collector, the loader and the API.

A *stored message* is the client's message with the server fields stamped on it:
eventId, messageId, receivedAt, sentAt, timestamp, channel, version, type, and the tenant
ids clientId/accountId/brandId. It is kept whole as JSON; the landing Parquet files and
`raw.messages` also carry the typed columns below, so loads and models need not parse JSON to
route, deduplicate or order.
"""

from __future__ import annotations

import msgspec
import pyarrow as pa

MESSAGE_TYPES = ("identify", "track", "page", "screen", "group", "alias")
CHANNELS = ("server", "browser", "mobile")
STORED_VERSION = "1"  # the `version` field of every stored message

UTC_TS = pa.timestamp("us", tz="UTC")

# Landing Parquet files and lake.raw.messages share these columns, in this order.
LANDING_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("client_id", pa.string(), nullable=False),
        pa.field("account_id", pa.string(), nullable=False),
        pa.field("brand_id", pa.string(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("event", pa.string()),
        pa.field("user_id", pa.string()),
        pa.field("anonymous_id", pa.string()),
        pa.field("timestamp", UTC_TS, nullable=False),  # event time, skew-corrected
        pa.field("received_at", UTC_TS, nullable=False),
        pa.field("sent_at", UTC_TS),
        pa.field("channel", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # the endpoint family that took it
        pa.field("message", pa.string(), nullable=False),  # the whole stored message, JSON
    ]
)


class StoredHead(msgspec.Struct, rename="camel", omit_defaults=True):
    """The typed head of a stored message: decoded cheaply from the JSON to fill the columns.

    Timestamps are ISO-8601 UTC strings with a `Z` suffix, as written by the collector.
    """

    event_id: str
    message_id: str
    client_id: str
    account_id: str
    brand_id: str
    type: str
    timestamp: str
    received_at: str
    channel: str
    source: str = "http"
    event: str | None = None
    user_id: str | None = None
    anonymous_id: str | None = None
    sent_at: str | None = None
