"""Wire shapes of ingestion, for the OpenAPI document.

The handlers decode the raw body once with msgspec and check it with collector.messages (one set
of rules for every endpoint family); these structs and examples only describe the bodies.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Object = dict[str, Any]

UserId = Annotated[
    str | None,
    Meta(description="A permanent id from your database. userId or anonymousId is required."),
]
AnonymousId = Annotated[
    str | None, Meta(description="Any pseudo-unique id: a session id or a random UUID.")
]
Context = Annotated[
    Object | None,
    Meta(description="ip, locale, userAgent, page, device, campaign, traits."),
]
Timestamp = Annotated[
    str | None,
    Meta(description="When it happened, ISO-8601; the time of receipt when absent."),
]
Properties = Annotated[Object | None, Meta(description="Free-form properties of the event.")]
Traits = Annotated[Object, Meta(description="The traits to set; others stay.")]
WriteKey = Annotated[
    str | None,
    Meta(description="The source's writeKey, here or as the HTTP Basic user."),
]


class _Call(msgspec.Struct, kw_only=True):
    userId: UserId = None  # noqa: N815
    anonymousId: AnonymousId = None  # noqa: N815
    context: Context = None
    timestamp: Timestamp = None
    sentAt: Timestamp = None  # noqa: N815
    messageId: Annotated[  # noqa: N815
        str | None, Meta(description="Your id of the call; a retry with the same id is one call.")
    ] = None


class IdentifyCall(_Call, kw_only=True):
    event: Literal["identify"]
    traits: Traits


class TrackCall(_Call, kw_only=True):
    event: Annotated[
        str, Meta(min_length=1, description="The action, or a command such as start_journey.")
    ]
    properties: Properties = None


class PageCall(_Call, kw_only=True):
    event: Literal["page"]
    name: str | None = None
    properties: Properties = None


class ScreenCall(_Call, kw_only=True):
    name: Annotated[str | None, Meta(description="The screen's name.")] = None
    properties: Properties = None


class BatchCall(msgspec.Struct, kw_only=True):
    batch: Annotated[
        list[Object],
        Meta(
            min_length=1,
            description="identify, group, track, page, screen or alias calls, each naming its"
            ' method in "type" (or in "event"); accepted all or none.',
        ),
    ]
    context: Annotated[Object | None, Meta(description="Merged into each item's context.")] = None


ServerCall = IdentifyCall | TrackCall | PageCall | ScreenCall | BatchCall


class ClientCall(_Call, kw_only=True):
    """A call of Segment's HTTP API or of the tag: its `type` names the method."""

    type: Literal["identify", "track", "page", "screen", "group", "alias"] | None = None
    writeKey: WriteKey = None  # noqa: N815
    event: Annotated[str | None, Meta(description="track: the action.")] = None
    name: Annotated[str | None, Meta(description="page, screen: the name.")] = None
    properties: Properties = None
    traits: Annotated[Object | None, Meta(description="identify, group: the traits.")] = None
    groupId: Annotated[str | None, Meta(description="group: the group's id.")] = None  # noqa: N815
    previousId: Annotated[  # noqa: N815
        str | None, Meta(description="alias: the id the user had before.")
    ] = None
    channel: Annotated[
        str | None, Meta(description='"mobile" from an app posting to the tag paths.')
    ] = None


class ClientBatch(msgspec.Struct, kw_only=True):
    batch: Annotated[
        list[ClientCall], Meta(min_length=1, description="In the order they happened.")
    ]
    writeKey: WriteKey = None  # noqa: N815
    sentAt: Timestamp = None  # noqa: N815
    context: Annotated[Object | None, Meta(description="Merged into each item's context.")] = None


class IngestOk(msgspec.Struct, kw_only=True):
    success: Literal[True]
    eventId: Annotated[  # noqa: N815
        str,
        Meta(
            description="The call's id (a batch's first); GET events/{eventId}/status follows it."
        ),
    ]
    eventIds: Annotated[  # noqa: N815
        list[str] | None,
        Meta(description="A batch only: every call's id, in order."),
    ] = None


class Ack(msgspec.Struct):
    success: Literal[True]


USER = {"userId": "u-1001", "timestamp": "2026-03-01T12:00:00Z"}
SERVER_EXAMPLES: dict[str, Object] = {
    "identify": {
        **USER,
        "event": "identify",
        "traits": {"email": "ada@example.com", "firstName": "Ada", "plan": "pro"},
    },
    "track": {
        **USER,
        "event": "Order Completed",
        "properties": {"orderId": "o-77", "revenue": 42.5, "currency": "EUR"},
    },
    "page": {
        "anonymousId": "3f1c2a9e-6b1d-4f6e-9a57-2c1e8f0b7d11",
        "event": "page",
        "name": "Pricing",
        "properties": {"path": "/pricing", "url": "https://shop.example/pricing"},
    },
    "screen": {**USER, "name": "Basket", "properties": {"items": 3}},
    "batch": {
        "batch": [
            {"event": "identify", "userId": "u-1001", "traits": {"plan": "pro"}},
            {"type": "track", "userId": "u-1001", "event": "Trial Started"},
        ],
        "context": {"library": {"name": "backend", "version": "2.1"}},
    },
}
CLIENT_EXAMPLES: dict[str, Object] = {
    "identify": {"type": "identify", **USER, "traits": {"email": "ada@example.com"}},
    "track": {"type": "track", **USER, "event": "Order Completed", "properties": {"total": 42.5}},
    "page": {"type": "page", "anonymousId": "a-5", "name": "Home", "properties": {"path": "/"}},
    "screen": {"type": "screen", **USER, "name": "Basket"},
    "group": {"type": "group", **USER, "groupId": "acme", "traits": {"name": "Acme"}},
    "alias": {"type": "alias", "userId": "u-1001", "previousId": "a-5"},
}
WRITE_KEY = "wk_live_3n8Qe2"
CLIENT_BATCH_EXAMPLE: Object = {
    "writeKey": WRITE_KEY,
    "sentAt": "2026-03-01T12:00:05Z",
    "batch": [CLIENT_EXAMPLES["screen"], CLIENT_EXAMPLES["track"]],
}
OK_EXAMPLE = {"success": True, "eventId": "01a2190b-046e-7000-a58c-1263000030f7"}
BATCH_OK_EXAMPLE = {
    **OK_EXAMPLE,
    "eventIds": [OK_EXAMPLE["eventId"], "01a2190b-046e-7000-a58c-1263000030f8"],
}

# (what the status means, an example message) per status of an ingestion answer.
_BAD = (
    "Invalid JSON, or a field that breaks its rule; the message names it",
    '"userId" or "anonymousId" is required',
)
_BIG = ("A body over 1 MB, or one call over 32 KB", "a call is limited to 32768 bytes")
_BUSY = ("Too many requests; retry after Retry-After seconds", "rate limit exceeded")
_DOWN = (
    "The write-ahead log cannot be written, or the regulation lists cannot be read; nothing was"
    " accepted, retry",
    "the collector cannot write its log; retry later",
)
_BROKEN = ("An internal failure", "internal server error")
SERVER_ERRORS = {
    400: _BAD,
    403: ("No auth-token, or one not authorised for this account or brand", "invalid auth-token"),
    404: ("An action other than identify, track, page, screen, batch", "unknown action 'trak'"),
    413: _BIG,
    429: _BUSY,
    500: _BROKEN,
    503: _DOWN,
}
CLIENT_ERRORS = {
    400: _BAD,
    403: ("No writeKey, or an unknown one", "invalid writeKey"),
    413: _BIG,
    429: _BUSY,
    500: _BROKEN,
    503: _DOWN,
}
