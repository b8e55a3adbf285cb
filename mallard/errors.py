"""One exception hierarchy, and the one function that maps it to each interface's error body.

Ingestion (`/track/.../v1/{identify,...}`, `/cdp/events/...`, `/v1/...`) answers
`{success:false, message}`; the read APIs answer `{error:{code, message}}`.
IngestErrorBody and ErrorBody describe those two bodies for the OpenAPI document.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Request

Family = Literal["ingest", "read"]


class MallardError(Exception):
    status = 500
    code = "internal_server_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidRequest(MallardError):
    """A bad parameter or body (400)."""

    status = 400
    code = "invalid_request_error"


class ValidationFailed(MallardError):
    """A field failed validation, e.g. a profile id not `idType:id` (400)."""

    status = 400
    code = "validation_error"


class Unauthenticated(MallardError):
    """No valid secret (401 on the read API; 403 on ingestion)."""

    status = 401
    code = "authentication_error"


class Forbidden(MallardError):
    """A token not authorised for the account or brand (403)."""

    status = 403
    code = "authentication_error"


class NotFound(MallardError):
    status = 404
    code = "not_found"


class Gone(MallardError):
    """A resource that existed and is no longer served, e.g. an expired download (410)."""

    status = 410
    code = "not_found"


class MethodNotAllowed(MallardError):
    status = 405
    code = "invalid_request_error"


class PayloadTooLarge(MallardError):
    status = 413
    code = "invalid_request_error"


def body_too_large(limit: int) -> PayloadTooLarge:
    """The one message for a request body over the server's limit, whoever refuses it."""
    return PayloadTooLarge(f"the request body exceeds the limit of {limit} bytes")


async def refuse_large_bodies(request: Request[Any, Any, Any]) -> None:
    """A before_request hook: a body declared over the limit is refused before the handler runs.
    Litestar checks request_max_body_size only when a handler reads the body, and a GET handler
    never does; routes that read their body (ingestion) leave the check to Litestar and pay
    nothing per request."""
    length = request.headers.get("content-length")
    limit: int = request.app.state.settings.limits.max_body_bytes
    if length is not None and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)


class RateLimited(MallardError):
    status = 429
    code = "rate_limit_error"


class Unavailable(MallardError):
    """The write-ahead log cannot be written (disk full, I/O error) or the warehouse is down."""

    status = 503
    code = "internal_server_error"


def family_of(path: str, method: str = "POST") -> Family:
    """Which error body a path gets: ingestion writes answer like ingestion, reads like the API."""
    if path.startswith("/cdp/marketing-preferences/"):
        # Its reads and its writes are addressed like a resource, not ingested like calls.
        return "read"
    if path.startswith("/cdp/events/") or path.startswith("/v1/"):
        return "ingest"
    if path.startswith("/track/") and method.upper() == "POST":
        # POST .../v1/regulations files a request of the read API's family; every other POST
        # under the tenant path is an ingestion call.
        return "read" if path.rstrip("/").split("/")[6:] == ["regulations"] else "ingest"
    return "read"


def error_body(exc: MallardError, family: Family) -> tuple[int, dict[str, Any]]:
    """The status and JSON body for an error, in the shape of the interface family."""
    status = exc.status
    if family == "ingest":
        # Ingestion refuses a missing or unknown token with 403, not 401.
        if isinstance(exc, Unauthenticated):
            status = 403
        return status, {"success": False, "message": exc.message}
    return status, {"error": {"code": exc.code, "message": exc.message}}


class IngestErrorBody(msgspec.Struct):
    """Every ingestion error."""

    success: Literal[False]
    message: str


class ErrorDetail(msgspec.Struct):
    code: Literal[
        "authentication_error",
        "invalid_request_error",
        "rate_limit_error",
        "validation_error",
        "not_found",
        "internal_server_error",
    ]
    message: str


class ErrorBody(msgspec.Struct):
    """Every read API error."""

    error: ErrorDetail
