"""Read API routes: events and profiles (INTERFACE.md 4.3, 4.4). Thin: parse, read, answer."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from litestar import MediaType, Request, Response, get
from litestar.params import FromPath

from api.params import (
    MAX_SIZE,
    decode_scroll,
    encode_scroll,
    event_query,
    page,
    profile_id,
)
from api.service import Snapshot, Warehouse
from mallard.auth import authorize
from mallard.errors import NotFound

BASE = "/track/{clientId:str}/{accountId:str}/{BRANDID:str}/v1"
PROFILE_ENDPOINTS = ("traits", "meta", "metadata", "events", "external_ids")
_encode = msgspec.json.Encoder().encode


def _iso(t: datetime | None) -> str:
    return t.isoformat().replace("+00:00", "Z") if t else ""


def _answer(snap: Snapshot, body: bytes) -> Response[bytes]:
    """JSON body plus how fresh the data behind it is."""
    return Response(
        body,
        media_type=MediaType.JSON,
        headers={
            "x-mallard-data-through": _iso(snap.data_through),
            "x-mallard-built-at": _iso(snap.built_at),
            "x-mallard-snapshot": str(snap.version),
        },
    )


def _list(
    snap: Snapshot, records: list[str], scroll: str | None = None, with_scroll: bool = False
) -> Response[bytes]:
    head = b'{"scrollId":' + _encode(scroll) + b"," if with_scroll else b"{"
    return _answer(snap, head + b'"data":[' + ",".join(records).encode() + b"]}")


def _params(request: Request[Any, Any, Any]) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items()}


@get(
    [f"{BASE}/events", f"{BASE}/events/"],
    operation_id="listEvents",
    sync_to_thread=True,
    summary="Account events, newest first",
    description="Query: include, exclude, start, end, "
    "sort (asc|desc), from, size (1..100). from + size <= 10,000.",
)
def list_events(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],
) -> Response[bytes]:
    authorize(request, clientId, accountId, BRANDID)
    wh: Warehouse = request.app.state.warehouse
    q = event_query(_params(request))
    snap = wh.snapshot()
    return _list(snap, wh.events(snap, accountId, BRANDID, q))


@get(
    f"{BASE}/profiles",
    operation_id="listProfiles",
    sync_to_thread=True,
    summary="All customers, 100 at a time",
    description="First page: from, size. Next pages: "
    "scrollId from the previous answer, until data is empty.",
)
def list_profiles(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],
) -> Response[bytes]:
    authorize(request, clientId, accountId, BRANDID)
    wh: Warehouse = request.app.state.warehouse
    params = _params(request)
    scroll = params.get("scrollId")
    if scroll:
        state = decode_scroll(scroll)
        snap = wh.snapshot(state["v"])
        after, offset, size = str(state.get("k", "")), 0, int(state.get("s", MAX_SIZE))
    else:
        offset, size = page(params)
        snap, after = wh.snapshot(), None
    rows = wh.customer_page(snap, accountId, after, offset, size)
    last = rows[-1][0] if rows else after
    token = encode_scroll({"v": snap.version, "k": last or "", "s": size})
    return _list(snap, [r[1] for r in rows], token, with_scroll=True)


@get(
    f"{BASE}/profiles/{{profileId:str}}/{{endpoint:str}}",
    operation_id="getProfile",
    sync_to_thread=True,
    summary="One profile: traits, meta|metadata, events, external_ids",
    description="profileId is idType:id with idType userId, email or id. By email the answer "
    "is {data:[...]} since several customers may share an email.",
)
def get_profile(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],
    profileId: FromPath[str],
    endpoint: FromPath[str],
) -> Response[bytes]:  # noqa: N803
    authorize(request, clientId, accountId, BRANDID)
    if endpoint not in PROFILE_ENDPOINTS:
        raise NotFound(
            f"unknown profile endpoint {endpoint!r}; use one of {', '.join(PROFILE_ENDPOINTS)}"
        )
    id_type, value = profile_id(profileId)
    wh: Warehouse = request.app.state.warehouse
    params = _params(request)
    if endpoint == "events":
        return _profile_events(wh, accountId, BRANDID, id_type, value, params)
    scroll_snap = wh.snapshot()
    column = {"traits": "traits", "meta": "metadata", "metadata": "metadata", "external_ids": "id"}[
        endpoint
    ]
    found = wh.customers_by(scroll_snap, accountId, id_type, value, column)
    if not found:
        raise NotFound(f"no profile {profileId}")
    if endpoint == "external_ids":
        rows = wh.identifiers(scroll_snap, [cid for cid, _ in found])
        data = [
            {
                "customerId": r[0],
                "type": r[1],
                "id": r[2],
                "firstSeen": _iso(r[3]),
                "lastSeen": _iso(r[4]),
            }
            for r in rows
        ]
        return _answer(scroll_snap, _encode({"data": data}))
    if id_type == "email":
        return _list(scroll_snap, [doc for _, doc in found])
    return _answer(scroll_snap, found[0][1].encode())


def _profile_events(
    wh: Warehouse, account_id: str, brand_id: str, id_type: str, value: str, params: dict[str, str]
) -> Response[bytes]:
    scroll = params.pop("scrollId", None)
    if scroll:
        state = decode_scroll(scroll)
        snap = wh.snapshot(state["v"])
        q = event_query({**state.get("q", {}), "from": "0", "size": str(state.get("s", 100))})
        q = type(q)(**{**q.__dict__, "offset": int(state.get("o", 0))})
        query_params = state.get("q", {})
    else:
        snap = wh.snapshot()
        q = event_query(params)
        query_params = {k: v for k, v in params.items() if k not in ("from", "size")}
    found = wh.customers_by(snap, account_id, id_type, value, "id")
    if not found:
        raise NotFound(f"no profile {id_type}:{value}")
    records = wh.events(snap, account_id, brand_id, q, [cid for cid, _ in found])
    token = encode_scroll(
        {"v": snap.version, "o": q.offset + len(records), "s": q.size, "q": query_params}
    )
    return _list(snap, records, token, with_scroll=True)


ROUTES = [list_events, list_profiles, get_profile]
