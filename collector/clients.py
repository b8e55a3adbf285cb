"""Ingestion for real clients, authenticated by writeKey.

- Tag and mobile: `POST {events_url}/cdp/events/std/{t,p,i,s,g,a,b,m}` and `.../mobile/batch`.
- Segment drop-in: `POST /v1/{identify,track,page,screen,group,alias,batch}`, so Segment's and
  RudderStack's server SDKs work by changing only their host.

The writeKey comes from the body or as the HTTP Basic user (what the SDKs and the tag send).
Bodies are JSON whatever their content type (the tag sends text/plain) and may be gzip
(RudderStack's SDK). Validation and stamping are the ones of the server routes
(collector.messages), and so is the admission of regulated subjects' calls (collector.admission);
only the envelope differs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import MediaType, Request, Response, post

from collector.admission import records
from collector.messages import CALL_KINDS, Tenant, iso, stamp, validate
from collector.routes import decode_json, decode_object, parse_batch
from collector.schemas import (
    BATCH_OK_EXAMPLE,
    CLIENT_BATCH_EXAMPLE,
    CLIENT_ERRORS,
    CLIENT_EXAMPLES,
    OK_EXAMPLE,
    WRITE_KEY,
    Ack,
    ClientBatch,
    ClientCall,
    IngestOk,
)
from collector.service import Collector
from mallard.auth import limit, limit_unauthenticated
from mallard.errors import Forbidden, InvalidRequest, PayloadTooLarge, RateLimited
from mallard.openapi import NoValidationError, answers, operation_id_per_path, request_body
from mallard.settings import Limits
from mallard.tenancy import ControlStore

STD = "/cdp/events/std"
# The tag's one-letter paths (analytics-next posts to `{apiHost}/{type[0]}`); `t` takes any type.
TAG_PATHS = {
    f"{STD}/t": None,
    f"{STD}/p": "page",
    f"{STD}/i": "identify",
    f"{STD}/s": "screen",
    f"{STD}/g": "group",
    f"{STD}/a": "alias",
}
SEGMENT_PATHS = {f"/v1/{kind}": kind for kind in CALL_KINDS}

_encode = msgspec.json.Encoder().encode


class _Envelope(msgspec.Struct):
    """The root keys a batch carries besides its items."""

    writeKey: Any = None  # noqa: N815
    sentAt: Any = None  # noqa: N815


_decode_envelope = msgspec.json.Decoder(_Envelope)


def _ok(body: dict[str, Any]) -> Response[bytes]:
    # Exactly 200 with JSON: some SDKs treat any other 2xx as a failure.
    return Response(_encode(body), status_code=200, media_type=MediaType.JSON)


def inflate(body: bytes, encoding: str | None, limits: Limits) -> bytes:
    """The body, gunzipped if so encoded; the size limit holds after decompression too."""
    if not encoding or encoding.strip().lower() == "identity":
        return body
    if encoding.strip().lower() not in ("gzip", "x-gzip"):
        raise InvalidRequest(f"unsupported content-encoding {encoding!r}; send gzip or none")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        # Bounded output: a small gzip body cannot expand past the limit (zip bomb).
        out = inflater.decompress(body, limits.max_body_bytes + 1)
    except zlib.error as e:
        raise InvalidRequest(f"body is not valid gzip: {e}") from None
    if len(out) > limits.max_body_bytes or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"the decompressed body exceeds {limits.max_body_bytes} bytes")
    if not inflater.eof:
        raise InvalidRequest("body is truncated gzip")
    return out


async def read_body(request: Request[Any, Any, Any]) -> bytes:
    limits: Limits = request.app.state.settings.limits
    return inflate(await request.body(), request.headers.get("content-encoding"), limits)


def basic_user(request: Request[Any, Any, Any]) -> str | None:
    """The user of an `Authorization: Basic` header (the SDKs put the writeKey there)."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[0] or None


def tenant_for(request: Request[Any, Any, Any], body_key: Any) -> Tenant:
    """The account and brand of the writeKey (body first, else Basic user), rate limited."""
    key = body_key if isinstance(body_key, str) and body_key else basic_user(request)
    if not key:
        limit_unauthenticated(request)
        raise Forbidden("a writeKey is required: in the body or as the HTTP Basic user")
    control: ControlStore = request.app.state.control
    source = control.resolve_write_key(key)
    if source is None:
        limit_unauthenticated(request)  # guessing writeKeys is limited like guessing tokens
        raise Forbidden("invalid writeKey")
    limit(request, "writeKey:" + hashlib.sha256(key.encode()).hexdigest()[:16])
    return Tenant(source.client_id, source.account_id, source.brand_id)


async def _accept(
    request: Request[Any, Any, Any],
    tenant: Tenant,
    items: list[tuple[str, dict[str, Any]]],
    *,
    channel: str,
    source: str,
) -> list[str]:
    """The eventIds of the answer, one per item, once every item is durable (a call a
    regulation drops as its record: collector.admission)."""
    collector: Collector = request.app.state.collector
    drops = await collector.admission.admit(tenant, channel, items)
    received = datetime.now(UTC)
    ip = request.client.host if request.client else None
    stamped = [
        stamp(kind, item, tenant, channel=channel, source=source, received=received, request_ip=ip)
        for kind, item in items
    ]
    await collector.accept(records(stamped, drops))
    return [s["eventId"] for s in stamped]


def _single(body: bytes, path_kind: str | None, limits: Limits) -> tuple[str, dict[str, Any]]:
    if len(body) > limits.max_call_bytes:
        raise PayloadTooLarge(f"a call is limited to {limits.max_call_bytes} bytes")
    msg = decode_object(body)
    sent_type = msg.get("type")
    if path_kind is None:
        kind = "track" if sent_type is None else sent_type
        if kind not in CALL_KINDS:
            raise InvalidRequest(f'"type" must be one of {", ".join(CALL_KINDS)}')
    else:
        kind = path_kind
        if sent_type is not None and sent_type != kind:
            raise InvalidRequest(f'"type" is {sent_type!r} but this endpoint takes {kind}')
    return kind, msg


def adapt(kind: str, msg: dict[str, Any]) -> None:
    """Client dialects, mapped in place to the stored shape before validation.

    - RudderStack's SDKs send identify traits only as `context.traits`.
    - Mobile track items may name the action in `name` (the mobile call lists no `event`).
    """
    if kind == "identify" and msg.get("traits") is None:
        context = msg.get("context")
        if isinstance(context, dict) and isinstance(context.get("traits"), dict):
            msg["traits"] = dict(context["traits"])
    elif kind == "track" and msg.get("event") is None and isinstance(msg.get("name"), str):
        msg["event"] = msg["name"]


def _batch(body: bytes, limits: Limits) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """(writeKey, items) of a batch body; the batch's sentAt applies to items without one."""
    envelope = decode_json(body, _decode_envelope)
    items = parse_batch(body, limits, adapt)
    if envelope.sentAt is not None:
        for _, item in items:
            item.setdefault("sentAt", envelope.sentAt)
    return envelope.writeKey, items


async def _one_call(
    request: Request[Any, Any, Any], kinds: Mapping[str, str | None], *, source: str
) -> Response[bytes]:
    """One call of the tag (`t` takes any type) or of Segment's HTTP API, by path."""
    limits: Limits = request.app.state.settings.limits
    kind, msg = _single(await read_body(request), kinds[request.url.path], limits)
    tenant = tenant_for(request, msg.get("writeKey"))
    adapt(kind, msg)
    validate(kind, msg, require_event=False)
    if source == "segment":
        channel = "server"
    else:
        # Mobile apps may post single events to the tag paths too; they say so in `channel`.
        channel = "mobile" if msg.get("channel") == "mobile" else "browser"
    ids = await _accept(request, tenant, [(kind, msg)], channel=channel, source=source)
    return _ok({"success": True, "eventId": ids[0]})


_ONE = "One call; the path names its type (t takes any type, track if none)."
_MANY = "Calls in the order they happened; all are accepted or none."
# What every client route documents: the writeKey in the body or as the Basic user, the answers.
_KEYED: list[dict[str, list[str]]] = [{"writeKey": []}]
_ANSWER_ONE = answers(IngestOk, "{success: true, eventId}", CLIENT_ERRORS, "ingest", OK_EXAMPLE)
_ANSWER_MANY = answers(
    IngestOk, "{success: true, eventId, eventIds}", CLIENT_ERRORS, "ingest", BATCH_OK_EXAMPLE
)
_KEYED_EXAMPLES = {kind: {**call, "writeKey": WRITE_KEY} for kind, call in CLIENT_EXAMPLES.items()}


@post(
    list(TAG_PATHS),
    operation_id=operation_id_per_path("tagEvent"),
    summary="One event from the tag or a mobile app (t takes any type)",
    status_code=200,
    dependencies=request_body(ClientCall, _ONE, _KEYED_EXAMPLES),
    responses=_ANSWER_ONE,
    security=_KEYED,
)
async def tag_event(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await _one_call(request, TAG_PATHS, source="tag")


@post(
    f"{STD}/b",
    operation_id="tagBatch",
    summary="A batch from the tag",
    status_code=200,
    dependencies=request_body(ClientBatch, _MANY, {"batch": CLIENT_BATCH_EXAMPLE}),
    responses=_ANSWER_MANY,
    security=_KEYED,
)
async def tag_batch(request: Request[Any, Any, Any]) -> Response[bytes]:
    key, items = _batch(await read_body(request), request.app.state.settings.limits)
    tenant = tenant_for(request, key)
    ids = await _accept(request, tenant, items, channel="browser", source="tag")
    return _ok({"success": True, "eventId": ids[0], "eventIds": ids})


@post(
    f"{STD}/mobile/batch",
    operation_id="mobileBatch",
    summary="A mobile batch {writeKey, batch:[...]}, events in the order they happened",
    status_code=200,
    dependencies=request_body(ClientBatch, _MANY, {"batch": CLIENT_BATCH_EXAMPLE}),
    responses=_ANSWER_MANY,
    security=_KEYED,
)
async def mobile_batch(request: Request[Any, Any, Any]) -> Response[bytes]:
    limits: Limits = request.app.state.settings.limits
    key, items = _batch(await read_body(request), limits)
    tenant = tenant_for(request, key)
    ids = await _accept(request, tenant, items, channel="mobile", source="mobile")
    return _ok({"success": True, "eventId": ids[0], "eventIds": ids})


@post(
    list(SEGMENT_PATHS),
    operation_id=operation_id_per_path("segment"),
    summary="Segment HTTP API: one call, writeKey as the Basic user",
    status_code=200,
    dependencies=request_body(ClientCall, _ONE, CLIENT_EXAMPLES),
    responses=_ANSWER_ONE,
    security=_KEYED,
)
async def segment_call(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await _one_call(request, SEGMENT_PATHS, source="segment")


@post(
    "/v1/batch",
    operation_id="segmentBatch",
    summary="Segment HTTP API batch",
    status_code=200,
    dependencies=request_body(ClientBatch, _MANY, {"batch": CLIENT_BATCH_EXAMPLE}),
    responses=_ANSWER_MANY,
    security=_KEYED,
)
async def segment_batch(request: Request[Any, Any, Any]) -> Response[bytes]:
    key, items = _batch(await read_body(request), request.app.state.settings.limits)
    tenant = tenant_for(request, key)
    ids = await _accept(request, tenant, items, channel="server", source="segment")
    return _ok({"success": True, "eventId": ids[0], "eventIds": ids})


class _MetricsLog:
    """Appends tag metrics to a daily JSON-lines file, apart from events; best effort."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def append(self, request: Request[Any, Any, Any], payload: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        directory = request.app.state.paths.metrics_dir
        line = _encode({"receivedAt": iso(now), **payload}) + b"\n"
        with self._lock:
            directory.mkdir(parents=True, exist_ok=True)
            with open(directory / f"tag-{now:%Y-%m-%d}.jsonl", "ab") as f:
                f.write(line)


_metrics_log = _MetricsLog()


@post(
    f"{STD}/m",
    operation_id="tagMetrics",
    summary="Tag performance metrics",
    status_code=200,
    dependencies=request_body(
        dict[str, Any],
        "analytics.js's metrics batch; kept apart from events, never retried.",
        {"metrics": {"series": [{"type": "Counter", "metric": "analytics_js.invoke", "value": 1}]}},
    ),
    responses=answers(
        Ack,
        "Always {success: true}: bad or excess metrics are dropped.",
        {413: CLIENT_ERRORS[413]},
        "ingest",
    ),
    operation_class=NoValidationError,
)
async def tag_metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Always 200: metrics must never make the tag retry or log. Bad or excess ones are dropped."""
    limits: Limits = request.app.state.settings.limits
    payload: dict[str, Any] | None = None
    try:
        body = await read_body(request)
        limit(request, "metrics:" + (request.client.host if request.client else "?"))
        if len(body) <= limits.max_call_bytes:
            payload = decode_object(body)
    except (InvalidRequest, PayloadTooLarge, RateLimited):
        payload = None
    # A payload carrying an identifier of a regulated subject is dropped, and so is every
    # payload while the lists cannot be read.
    collector: Collector = request.app.state.collector
    if payload is not None and await collector.admission.admits_metrics(payload):
        _metrics_log.append(request, payload)
    return _ok({"success": True})


ROUTES = [tag_event, tag_batch, mobile_batch, segment_call, segment_batch, tag_metrics]
