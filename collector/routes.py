"""Server ingestion routes: POST /track/{clientId}/{accountId}/{BRANDID}/v1/{action}.

Also the tenant of such a path as a dependency, for these routes and the read API's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Controller, Litestar, MediaType, Request, Response, post
from litestar._asgi.utils import is_valid_host
from litestar.di import Provide
from litestar.exceptions import InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.handlers import HTTPRouteHandler
from litestar.middleware._internal.exceptions.middleware import ExceptionHandlerMiddleware
from litestar.params import Parameter
from litestar.routes import HTTPRoute
from litestar.types import ASGIApp, HTTPResponseStartEvent, Receive, Scope, Send
from litestar.utils.scope.state import ScopeState

from collector.admission import records
from collector.messages import Tenant, batch_item_kind, stamp, validate
from collector.schemas import (
    OK_EXAMPLE,
    SERVER_ERRORS,
    SERVER_EXAMPLES,
    IngestOk,
    ServerCall,
)
from collector.service import Collector
from mallard.auth import authorize
from mallard.errors import InvalidRequest, NotFound, PayloadTooLarge
from mallard.ids import new_ids
from mallard.openapi import OneOfTheBodies, answers, request_body
from mallard.settings import Limits

SERVER_ACTIONS = ("identify", "track", "page", "screen", "batch")
BATCH_IDS = 16  # from this many calls, their ids are made at once (mallard.ids.new_ids)
TENANT_PATH = "/track/{clientId:str}/{accountId:str}/{BRANDID:str}/v1"
ACTION_PATH = "/{action:str}"
INGEST_PATH = TENANT_PATH + ACTION_PATH


def authorized_tenant(
    request: Request[Any, Any, Any],
    clientId: str,  # noqa: N803
    accountId: str,  # noqa: N803
    BRANDID: str,  # noqa: N803
) -> Tenant:
    """The tenant a TENANT_PATH names, once the auth-token covers it and its rate limit allows."""
    authorize(request, clientId, accountId, BRANDID)
    return Tenant(clientId, accountId, BRANDID)


# On the event loop: the token check reads the control store's in-memory snapshot.
TENANT = {"tenant": Provide(authorized_tenant, sync_to_thread=False)}


class _Batch(msgspec.Struct):
    batch: list[msgspec.Raw]
    context: dict[str, Any] | None = None


_decode_any = msgspec.json.Decoder()
_decode_batch = msgspec.json.Decoder(_Batch)
_encode = msgspec.json.Encoder().encode


def decode_json(
    body: bytes, decoder: msgspec.json.Decoder[Any] = _decode_any, shape: str = ""
) -> Any:
    """The body decoded, or InvalidRequest (400) for any body msgspec refuses: besides its
    DecodeError, a body nested deeper than the interpreter's recursion limit raises RecursionError
    and invalid UTF-8 inside a string UnicodeDecodeError (both were 500s). `shape` words the
    error of a body that is JSON but not of the decoder's type."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        if not shape:
            raise InvalidRequest(f"body is not valid JSON: {e}") from None
        raise InvalidRequest(f"{shape}: {e}") from None
    except msgspec.DecodeError as e:
        raise InvalidRequest(f"body is not valid JSON: {e}") from None
    except RecursionError:
        raise InvalidRequest("body is not valid JSON: nested too deeply") from None
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"body is not valid UTF-8: {e.reason} at byte {e.start}") from None


def decode_object(body: bytes) -> dict[str, Any]:
    msg = decode_json(body)
    if not isinstance(msg, dict):
        raise InvalidRequest("body must be a JSON object")
    return msg


def parse_batch(
    body: bytes,
    limits: Limits,
    prepare: Callable[[str, dict[str, Any]], None] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(kind, item) per batch item, batch context merged in (item keys win); all or nothing.

    prepare(kind, item), if given, adapts an item in place before it is validated.
    """
    parsed = decode_json(body, _decode_batch, '"batch" is required and must be an array')
    if not parsed.batch:
        raise InvalidRequest('"batch" must not be empty')
    max_item_bytes = limits.max_call_bytes
    context_bytes = len(_encode(parsed.context)) if parsed.context else 0
    if context_bytes:
        # The context is copied into every item: a 330 KB batch of 200 empty calls under a
        # 20,000-key context made 60 MB of messages and took the server from 190 to 498 MiB.
        # Counted into each call and into the body, what is stored stays within both limits.
        merged = sum(len(raw) for raw in parsed.batch) + context_bytes * len(parsed.batch)
        if merged > limits.max_body_bytes:
            raise PayloadTooLarge(
                f"the batch's context copied into its {len(parsed.batch)} calls makes {merged}"
                f" bytes; the limit is {limits.max_body_bytes}"
            )
    items = []
    for i, raw in enumerate(parsed.batch):
        if len(raw) + context_bytes > max_item_bytes:
            size = len(raw) + context_bytes
            with_context = " with the batch's context" if context_bytes else ""
            raise PayloadTooLarge(
                f"batch[{i}]{with_context} is {size} bytes; the limit is {max_item_bytes}"
            )
        item = decode_json(raw)
        kind = batch_item_kind(item, i)
        if parsed.context:
            ctx = item.get("context")
            if ctx is not None and not isinstance(ctx, dict):
                raise InvalidRequest(f'batch[{i}]: "context" must be an object')
            item["context"] = {**parsed.context, **(ctx or {})}
        if prepare is not None:
            prepare(kind, item)
        validate(kind, item, require_event=False, where=f"batch[{i}]: ")
        items.append((kind, item))
    return items


_BODIES = (
    "identify: event identify and traits. track: event, the action. page: event page. screen:"
    " name. batch: {batch: [calls], context?}. Each call needs userId or anonymousId; one call"
    " is at most 32 KB."
)


class Ingest(Controller):
    path = TENANT_PATH
    tags = ["Server ingestion"]

    @post(
        ACTION_PATH,
        operation_id="ingest",
        status_code=200,
        summary="Ingest identify/track/page/screen/batch",
        description="Header auth-token. " + _BODIES,
        dependencies=request_body(ServerCall, _BODIES, SERVER_EXAMPLES),
        operation_class=OneOfTheBodies,
        responses=answers(
            IngestOk,
            "Accepted and durable: {success: true, eventId}; a batch also lists eventIds.",
            SERVER_ERRORS,
            "ingest",
            OK_EXAMPLE,
        ),
    )
    async def ingest(
        self,
        request: Request[Any, Any, Any],
        action: Annotated[str, Parameter(description="identify, track, page, screen or batch.")],
    ) -> Response[bytes]:
        # Served by FastIngest on a running server; Litestar's router reaches this only when
        # FastIngest is not installed (an app built without create_app()).
        p = request.path_params
        answer = await ingest(request, p["clientId"], p["accountId"], p["BRANDID"], action)
        return Response(answer, media_type=MediaType.JSON)


async def ingest(
    request: Request[Any, Any, Any], client_id: str, account_id: str, brand_id: str, action: str
) -> bytes:
    """The JSON answer of one server ingestion call, once its messages are durable."""
    # The tenant by a direct call, not the TENANT dependency the read API takes: on this hot
    # path Litestar's dependency resolution cost ~7% of single-message throughput.
    tenant = authorized_tenant(request, client_id, account_id, brand_id)
    if action not in SERVER_ACTIONS:
        raise NotFound(f"unknown action {action!r}; use one of {', '.join(SERVER_ACTIONS)}")
    state = request.app.state
    collector: Collector = state.collector
    limits: Limits = state.settings.limits
    body = await read_body(request)
    received = datetime.now(UTC)
    client = request.scope.get("client")
    ip = client[0] if client else None
    if action == "batch":
        items = parse_batch(body, limits)
    else:
        if len(body) > limits.max_call_bytes:
            raise PayloadTooLarge(f"a call is limited to {limits.max_call_bytes} bytes")
        msg = decode_object(body)
        validate(action, msg)
        items = [(action, msg)]
    drops = await collector.admission.admit(tenant, "server", items)
    # A batch's ids from one reservation (new_id() per call was ~7% of a batch's time). A call a
    # regulation drops is stamped like any other: its id and the work are the same.
    event_ids = new_ids(len(items)).to_pylist() if len(items) >= BATCH_IDS else [None] * len(items)
    stamped = [
        stamp(
            kind,
            item,
            tenant,
            channel="server",
            source="http",
            received=received,
            request_ip=ip,
            event_id=event_id,
        )
        for (kind, item), event_id in zip(items, event_ids, strict=True)
    ]
    await collector.accept(records(stamped, drops))
    ids = [s["eventId"] for s in stamped]
    if action == "batch":
        return _encode({"success": True, "eventId": ids[0], "eventIds": ids})
    return _encode({"success": True, "eventId": ids[0]})


async def read_body(request: Request[Any, Any, Any]) -> bytes:
    """request.body() without Litestar's async generator (~5% of a single message's time):
    the same rules, a content-length over the route's limit or more bytes than it streamed
    refused with RequestEntityTooLarge (413), a client gone before the end of its body an
    InternalServerException."""
    limit = request.route_handler.resolve_request_max_body_size() or math.inf
    length = request.content_length
    if length is not None and length > limit:
        raise RequestEntityTooLarge
    chunks: list[bytes] = []
    total = 0
    while True:
        event = await request.receive()
        if event["type"] == "http.request":
            chunk = event["body"]
            if chunk:
                total += len(chunk)
                if total > limit:
                    raise RequestEntityTooLarge
                chunks.append(chunk)
            if not event.get("more_body", False):
                break
        elif event["type"] == "http.disconnect":
            raise InternalServerException("client disconnected prematurely")
    request.is_connected = False
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_JSON = (b"content-type", b"application/json")


class FastIngest:
    """POST /track/{clientId}/{accountId}/{BRANDID}/v1/{action} answered in front of Litestar's
    router, by the route's own handler object (its body size limit, its exception handlers,
    the same ingest() and answer), without the router's per-request work: the kwargs model,
    the Response object and its ASGI response. Litestar's router, its 20 us per request, was
    the largest cost of a single message after the log (see bench/results/report.md). Every
    other request, and any path this does not recognise, goes to the router unchanged."""

    def __init__(self, router: ASGIApp, handler: HTTPRouteHandler, path_template: str) -> None:
        self.router = router
        self.handler = handler
        self.path_template = path_template
        self.exception_handlers = handler.resolve_exception_handlers()
        self.request_class = handler.resolve_request_class()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            parts = scope["path"].split("/")
            # ["", "track", clientId, accountId, BRANDID, "v1", action]; other shapes (a trailing
            # or doubled slash) go to the router, which normalises them.
            if (
                len(parts) == 7
                and parts[1] == "track"
                and parts[5] == "v1"
                and parts[6] in SERVER_ACTIONS
                and parts[2]
                and parts[3]
                and parts[4]
                and _host_ok(scope)
            ):
                await self._ingest(scope, receive, send, parts)
                return
        await self.router(scope, receive, send)

    async def _ingest(self, scope: Scope, receive: Receive, send: Send, parts: list[str]) -> None:
        # What the router sets before calling a route: errors raised below are answered by the
        # route's exception handlers (ExceptionHandlerMiddleware reads them from the scope).
        ScopeState.from_scope(scope).exception_handlers = self.exception_handlers
        scope["route_handler"] = self.handler
        scope["path_template"] = self.path_template
        scope["path_params"] = {
            "clientId": parts[2],
            "accountId": parts[3],
            "BRANDID": parts[4],
            "action": parts[6],
        }
        request = self.request_class(scope=scope, receive=receive, send=send)
        answer = await ingest(request, parts[2], parts[3], parts[4], parts[6])
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": 200,
            "headers": [_JSON, (b"content-length", str(len(answer)).encode())],
        }
        await send(start)
        await send({"type": "http.response.body", "body": answer, "more_body": False})


def _host_ok(scope: Scope) -> bool:
    """The router's check of the host header (a 400 from the router otherwise)."""
    for name, value in scope["headers"]:
        if name == b"host":
            return is_valid_host(value)
    return True


def install_fast_ingest(app: Litestar) -> None:
    """Put FastIngest between the app's exception handling and its router."""
    route = next(
        r
        for r in app.routes
        if isinstance(r, HTTPRoute) and r.path == f"{INGEST_PATH}" and "POST" in r.methods
    )
    handler, _ = route.route_handler_map["POST"]
    middleware = app.asgi_handler
    if not isinstance(middleware, ExceptionHandlerMiddleware):
        raise TypeError(f"install_fast_ingest before wrapping the app's handler: {middleware!r}")
    middleware.app = FastIngest(middleware.app, handler, route.path_format)


ROUTES = [Ingest]
