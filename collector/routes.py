"""Server ingestion routes: POST /track/{clientId}/{accountId}/{BRANDID}/v1/{action}.

Also the tenant of such a path as a dependency, for these routes and the read API's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Controller, MediaType, Request, Response, post
from litestar.di import Provide
from litestar.params import Parameter

from collector.admission import admitted, answer_ids
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
from mallard.openapi import OneOfTheBodies, answers, request_body

SERVER_ACTIONS = ("identify", "track", "page", "screen", "batch")
TENANT_PATH = "/track/{clientId:str}/{accountId:str}/{BRANDID:str}/v1"


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


def _ok(body: dict[str, Any]) -> Response[bytes]:
    return Response(_encode(body), media_type=MediaType.JSON)


def decode_object(body: bytes) -> dict[str, Any]:
    try:
        msg = _decode_any.decode(body)
    except msgspec.DecodeError as e:
        raise InvalidRequest(f"body is not valid JSON: {e}") from None
    if not isinstance(msg, dict):
        raise InvalidRequest("body must be a JSON object")
    return msg


def parse_batch(
    body: bytes,
    max_item_bytes: int,
    prepare: Callable[[str, dict[str, Any]], None] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(kind, item) per batch item, batch context merged in (item keys win); all or nothing.

    prepare(kind, item), if given, adapts an item in place before it is validated.
    """
    try:
        parsed = _decode_batch.decode(body)
    except msgspec.ValidationError as e:
        raise InvalidRequest(f'"batch" is required and must be an array: {e}') from None
    except msgspec.DecodeError as e:
        raise InvalidRequest(f"body is not valid JSON: {e}") from None
    if not parsed.batch:
        raise InvalidRequest('"batch" must not be empty')
    items = []
    for i, raw in enumerate(parsed.batch):
        if len(raw) > max_item_bytes:
            raise PayloadTooLarge(f"batch[{i}] is {len(raw)} bytes; the limit is {max_item_bytes}")
        item = _decode_any.decode(raw)
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
        "/{action:str}",
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
        # The tenant by a direct call, not the TENANT dependency the read API takes: on this hot
        # path Litestar's dependency resolution cost ~7% of single-message throughput.
        p = request.path_params
        tenant = authorized_tenant(request, p["clientId"], p["accountId"], p["BRANDID"])
        if action not in SERVER_ACTIONS:
            raise NotFound(f"unknown action {action!r}; use one of {', '.join(SERVER_ACTIONS)}")
        collector: Collector = request.app.state.collector
        limits = request.app.state.settings.limits
        body = await request.body()
        received = datetime.now(UTC)
        ip = request.client.host if request.client else None
        if action == "batch":
            items = parse_batch(body, limits.max_call_bytes)
        else:
            if len(body) > limits.max_call_bytes:
                raise PayloadTooLarge(f"a call is limited to {limits.max_call_bytes} bytes")
            msg = decode_object(body)
            validate(action, msg)
            items = [(action, msg)]
        keep = await collector.admission.admit(tenant, "server", items)
        stored = [
            stamp(
                kind,
                item,
                tenant,
                channel="server",
                source="http",
                received=received,
                request_ip=ip,
            )
            for kind, item in admitted(items, keep)
        ]
        if stored:
            await collector.accept(stored)
        ids = answer_ids(keep, [s["eventId"] for s in stored])
        if action == "batch":
            return _ok({"success": True, "eventId": ids[0], "eventIds": ids})
        return _ok({"success": True, "eventId": ids[0]})


ROUTES = [Ingest]
