"""Wire shapes of the read API, for the OpenAPI document.

The bodies themselves are assembled as JSON by the marts (one definition of each record);
these structs only describe them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar.openapi.datastructures import ResponseSpec

from mallard.openapi import answers


class RawData(msgspec.Struct):
    userId: str | None  # noqa: N815
    anonymousId: str | None  # noqa: N815
    action: str
    event: str | None
    context: dict[str, Any]
    properties: dict[str, Any]
    timestamp: str
    sendType: str | None  # noqa: N815


class EventRecord(msgspec.Struct):
    """One event."""

    id: str
    customerId: str  # noqa: N815
    userId: str | None  # noqa: N815
    externalId: str | None  # noqa: N815
    email: str | None
    eventId: str  # noqa: N815
    eventTime: str  # noqa: N815
    receivedTime: str  # noqa: N815
    eventAction: str  # noqa: N815
    clientId: str  # noqa: N815
    accountId: str  # noqa: N815
    brandId: str  # noqa: N815
    source: str | None
    rawData: RawData  # noqa: N815


class EventPage(msgspec.Struct):
    data: list[EventRecord]


class EventScroll(msgspec.Struct):
    scrollId: str  # noqa: N815
    data: list[EventRecord]


class ProfileList(msgspec.Struct):
    """Customers' traits objects; `data` is empty once the list is exhausted."""

    scrollId: str  # noqa: N815
    data: list[dict[str, Any]]


class ProfilesByEmail(msgspec.Struct):
    """By email: every customer with that email (several may share one)."""

    data: list[dict[str, Any]]


class ExternalId(msgspec.Struct):
    customerId: str  # noqa: N815
    type: str
    id: str
    firstSeen: str  # noqa: N815
    lastSeen: str  # noqa: N815


class ExternalIds(msgspec.Struct):
    data: list[ExternalId]


class Channel(msgspec.Struct):
    channel: str
    name: str
    subscribed: bool


class Category(msgspec.Struct):
    category: str
    name: Annotated[str, msgspec.Meta(description="The value to send in an update.")]
    subscribed: bool


class PreferencesResource(msgspec.Struct):
    """A customer's marketing preferences: channels opt-in, categories
    opt-out."""

    writeKey: str  # noqa: N815
    customerId: str  # noqa: N815
    channels: list[Channel]
    categories: list[Category]
    unsubscribeAll: bool  # noqa: N815


class ChannelChoice(msgspec.Struct):
    channel: str
    subscribed: bool


class CategoryChoice(msgspec.Struct):
    category: Annotated[str, msgspec.Meta(description="A category's name, underscore form.")]
    subscribed: bool


class PreferencesUpdate(msgspec.Struct, kw_only=True):
    """What to change; what is not listed stays."""

    categories: list[CategoryChoice] | None = None
    channels: list[ChannelChoice] | None = None
    unsubscribeAll: bool | None = None  # noqa: N815
    unsubscribeReason: Annotated[  # noqa: N815
        str | None, msgspec.Meta(description="Free text recorded against the customer.")
    ] = None


PREFERENCES_EXAMPLE = {
    "writeKey": "wk_live_3n8Qe2",
    "customerId": "01a2190b-046e-7000-a58c-1263000030f7",
    "channels": [
        {"channel": "email", "name": "Email", "subscribed": True},
        {"channel": "sms", "name": "SMS", "subscribed": False},
    ],
    "categories": [{"category": "Newsletter", "name": "newsletter", "subscribed": True}],
    "unsubscribeAll": False,
}
UPDATE_EXAMPLES = {
    "choose": {
        "channels": [{"channel": "sms", "subscribed": True}],
        "categories": [{"category": "newsletter", "subscribed": False}],
    },
    "unsubscribe from everything": {
        "categories": [],
        "channels": [],
        "unsubscribeAll": True,
        "unsubscribeReason": "too many emails",
    },
}
TRAITS_EXAMPLE = {"email": "ada@example.com", "firstName": "Ada", "plan": "pro"}

# (meaning, starting with the error code; an example message) per status.
_BAD = (
    "invalid_request_error (a bad parameter) or validation_error (a profile id not idType:id)",
    "unknown query parameter sise; this route takes from, scrollId, size",
)
_LIMITED = (
    "rate_limit_error: too many requests; retry after the Retry-After header's seconds",
    "rate limit exceeded",
)
_FAILED = ("internal_server_error", "internal server error")
_BUSY = (
    "internal_server_error: the warehouse is busy or unavailable; retry",
    "the warehouse is busy; retry",
)
_ERRORS = {
    400: _BAD,
    401: ("authentication_error: missing or unknown auth-token", "missing auth-token header"),
    403: (
        "authentication_error: token not authorised for this account or brand",
        "token not authorised for demo/demo/DEMO",
    ),
    404: ("not_found: no such customer, profile or route", "no profile userId:u-404"),
    413: (
        "invalid_request_error: a body over the server's limit",
        "the request body exceeds the limit of 1048576 bytes",
    ),
    429: _LIMITED,
    500: _FAILED,
    503: _BUSY,
}
READ_ERRORS = _ERRORS
PREFERENCES_ERRORS = {
    400: ("invalid_request_error: a bad update body or assetId", 'unknown field "channel"'),
    404: ("not_found: no customer has this subscription id", "unknown subscription id"),
    413: _ERRORS[413],
    429: _LIMITED,
    500: _FAILED,
    503: _BUSY,
}


def responses(
    ok: Any, description: str, *, not_found: bool = True, example: Any = None
) -> dict[int, ResponseSpec]:
    """The documented answers of a read route: its success body and every error of section 7."""
    errors = {s: e for s, e in _ERRORS.items() if not_found or s != 404}
    return answers(ok, description, errors, "read", example)
