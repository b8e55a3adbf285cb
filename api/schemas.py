"""Wire shapes of the read API (INTERFACE.md 2.8, 2.9, 7), for the OpenAPI document.

The bodies themselves are assembled as JSON by the marts (one definition of each record);
these structs only describe them.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar.openapi.datastructures import ResponseSpec


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
    """One event (INTERFACE.md 2.8)."""

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


class ErrorDetail(msgspec.Struct):
    code: str
    message: str


class ErrorBody(msgspec.Struct):
    """Every read API error (INTERFACE.md 7)."""

    error: ErrorDetail


_ERRORS = {
    400: "validation_error (a profile id not idType:id) or invalid_request_error (bad parameter)",
    401: "authentication_error: missing or unknown auth-token",
    403: "authentication_error: token not authorised for this account or brand",
    404: "not_found: no such customer, profile or route",
    429: "rate_limit_error: too many requests; retry after the Retry-After header's seconds",
    500: "internal_server_error",
    503: "internal_server_error: the warehouse is busy or unavailable; retry",
}


def responses(ok: Any, description: str, *, not_found: bool = True) -> dict[int, ResponseSpec]:
    """The documented answers of a read route: its success body and every error of section 7."""
    out = {200: ResponseSpec(data_container=ok, description=description)}
    for status, text in _ERRORS.items():
        if status == 404 and not not_found:
            continue
        out[status] = ResponseSpec(data_container=ErrorBody, description=text)
    return out
