"""Read API routes: events and profiles (INTERFACE.md 4.3, 4.4). Thin: check, read, answer."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import msgspec
from litestar import MediaType, Request, Response, get
from litestar.params import FromPath

from api.params import (
    DEFAULT_SIZE,
    EVENT_PARAMS,
    PROFILE_EVENT_PARAMS,
    PROFILE_LIST_PARAMS,
    End,
    Exclude,
    From,
    Include,
    ScrollId,
    Size,
    Sort,
    Start,
    check_page,
    decode_scroll,
    encode_scroll,
    event_query,
    only,
    profile_id,
)
from api.schemas import (
    EventPage,
    EventScroll,
    ExternalIds,
    ProfileList,
    ProfilesByEmail,
    responses,
)
from api.service import Snapshot, Warehouse, WouldBlock, freshness_headers, iso
from mallard.auth import authorize
from mallard.errors import InvalidRequest, NotFound

BASE = "/track/{clientId:str}/{accountId:str}/{BRANDID:str}/v1"
PROFILE = BASE + "/profiles/{profileId:str}"
_encode = msgspec.json.Encoder().encode
_TAGS = ["Read API"]


def _answer(snap: Snapshot, body: bytes) -> Response[bytes]:
    return Response(body, media_type=MediaType.JSON, headers=freshness_headers(snap))


def _list(snap: Snapshot, records: list[str], scroll: str | None = None) -> Response[bytes]:
    head = b"{" if scroll is None else b'{"scrollId":' + _encode(scroll) + b","
    return _answer(snap, head + b'"data":[' + ",".join(records).encode() + b"]}")


def _warehouse(request: Request[Any, Any, Any]) -> Warehouse:
    wh: Warehouse = request.app.state.warehouse
    return wh


@get(
    [f"{BASE}/events", f"{BASE}/events/"],
    operation_id="listEvents",
    sync_to_thread=True,
    tags=_TAGS,
    summary="Account events, newest first",
    description="Events of this account and brand (INTERFACE.md 4.3). Page with from and size;"
    " from + size may reach 10,000.",
    responses=responses(EventPage, "{data: [event record]}", not_found=False),
)
def list_events(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],  # noqa: N803
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],  # noqa: N803
    include: Include = None,
    exclude: Exclude = None,
    start: Start = None,
    end: End = None,
    sort: Sort = "desc",
    offset: From = 0,
    size: Size = DEFAULT_SIZE,
) -> Response[bytes]:
    authorize(request, clientId, accountId, BRANDID)
    only(request, EVENT_PARAMS)
    q = event_query(include, exclude, start, end, sort, offset, size)
    wh = _warehouse(request)
    snap = wh.snapshot()
    return _list(snap, wh.events(snap, accountId, BRANDID, q))


@get(
    f"{BASE}/profiles",
    operation_id="listProfiles",
    sync_to_thread=True,
    tags=_TAGS,
    summary="All customers, 100 at a time",
    description="First page: from and size. Next pages: scrollId from the previous answer, until"
    " data is empty. A scroll stays on the snapshot of its first page while the warehouse"
    " changes.",
    responses=responses(ProfileList, "{scrollId, data: [traits object]}", not_found=False),
)
def list_profiles(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],  # noqa: N803
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],  # noqa: N803
    offset: From = 0,
    size: Size = DEFAULT_SIZE,
    scroll_id: ScrollId = None,
) -> Response[bytes]:
    authorize(request, clientId, accountId, BRANDID)
    only(request, PROFILE_LIST_PARAMS)
    wh = _warehouse(request)
    after: str | None = None
    if scroll_id:
        state = decode_scroll(scroll_id, "profiles")
        if state.get("a") != accountId or not isinstance(state.get("k"), str):
            raise InvalidRequest("scrollId is not valid for this list")
        snap, after, offset, size = wh.snapshot(state["v"]), state["k"], 0, state["s"]
    else:
        check_page(offset, size)
        snap = wh.snapshot()
    rows = wh.customer_page(snap, accountId, after, offset, size)
    last = rows[-1][0] if rows else after
    token = encode_scroll(
        {"t": "profiles", "v": snap.version, "a": accountId, "k": last or "", "s": size}
    )
    return _list(snap, [r[1] for r in rows], token)


def _profile(
    request: Request[Any, Any, Any], account_id: str, profile: str, column: str
) -> tuple[Snapshot, str, list[tuple[str, str]]]:
    id_type, value = profile_id(profile)
    wh = _warehouse(request)
    snap = wh.snapshot()
    found = wh.customers_by(snap, account_id, id_type, value, column)
    if not found:
        raise NotFound(f"no profile {profile}", headers=freshness_headers(snap))
    return snap, id_type, found


def _traits_or_meta(
    request: Request[Any, Any, Any], ids: tuple[str, str, str], profile: str, column: str
) -> Response[bytes]:
    authorize(request, *ids)
    only(request, frozenset())
    snap, id_type, found = _profile(request, ids[1], profile, column)
    if id_type == "email":
        return _list(snap, [doc for _, doc in found])
    return _answer(snap, found[0][1].encode())


_BY = (
    "profileId is idType:id with idType userId, email or id (the customer's own id). By userId"
    " or id the object itself; by email {data: [...]}, since several customers may share an"
    " email (matched case-insensitively)."
)


@get(
    f"{PROFILE}/traits",
    operation_id="getProfileTraits",
    tags=_TAGS,
    summary="A customer's traits",
    description=_BY,
    responses=responses(dict[str, Any] | ProfilesByEmail, "traits object, or {data} by email"),
)
async def get_traits(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],  # noqa: N803
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],  # noqa: N803
    profileId: FromPath[str],  # noqa: N803
) -> Response[bytes]:
    ids = (clientId, accountId, BRANDID)
    # By userId or id from the index, on the event loop: no hand-off to a worker thread and back,
    # two fewer wake-ups, which on a busy machine each wait for a core. Anything needing I/O
    # (a new snapshot, no index yet, an email to lower in DuckDB) goes to a worker thread.
    if not profileId.startswith("email:"):
        try:
            with _warehouse(request).memory_only():
                return _traits_or_meta(request, ids, profileId, "traits")
        except WouldBlock:
            pass
    return await anyio.to_thread.run_sync(_traits_or_meta, request, ids, profileId, "traits")


_META = (
    "The traits plus _subscriptionId, createdBy, firstEvent, lastEvent, audiencesStatic and"
    " lastActivityTime (INTERFACE.md 2.9). " + _BY
)


@get(
    f"{PROFILE}/meta",
    operation_id="getProfileMeta",
    sync_to_thread=True,
    tags=_TAGS,
    summary="A customer's metadata (same as .../metadata)",
    description=_META,
    responses=responses(dict[str, Any] | ProfilesByEmail, "metadata object, or {data} by email"),
)
def get_meta(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],  # noqa: N803
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],  # noqa: N803
    profileId: FromPath[str],  # noqa: N803
) -> Response[bytes]:
    return _traits_or_meta(request, (clientId, accountId, BRANDID), profileId, "metadata")


# A second handler rather than one handler on two paths: Litestar wraps a sync_to_thread handler
# once per path, and the double wrap answers with an un-awaited coroutine.
@get(
    f"{PROFILE}/metadata",
    operation_id="getProfileMetadata",
    sync_to_thread=True,
    tags=_TAGS,
    summary="A customer's metadata (same as .../meta)",
    description=_META,
    responses=responses(dict[str, Any] | ProfilesByEmail, "metadata object, or {data} by email"),
)
def get_metadata(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],  # noqa: N803
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],  # noqa: N803
    profileId: FromPath[str],  # noqa: N803
) -> Response[bytes]:
    return _traits_or_meta(request, (clientId, accountId, BRANDID), profileId, "metadata")


@get(
    f"{PROFILE}/external_ids",
    operation_id="getProfileExternalIds",
    sync_to_thread=True,
    tags=_TAGS,
    summary="A customer's identifiers (userId, anonymousIds, email)",
    description=_BY.split(". By")[0] + ". The answer is {data: [...]} for every idType.",
    responses=responses(ExternalIds, "{data: [external id]}"),
)
def get_external_ids(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],  # noqa: N803
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],  # noqa: N803
    profileId: FromPath[str],  # noqa: N803
) -> Response[bytes]:
    authorize(request, clientId, accountId, BRANDID)
    only(request, frozenset())
    snap, _, found = _profile(request, accountId, profileId, "id")
    rows = _warehouse(request).identifiers(snap, [cid for cid, _ in found])
    data = [
        {
            "customerId": r[0],
            "type": r[1],
            "id": r[2],
            "firstSeen": iso(r[3]),
            "lastSeen": iso(r[4]),
        }
        for r in rows
    ]
    return _answer(snap, _encode({"data": data}))


@get(
    f"{PROFILE}/events",
    operation_id="getProfileEvents",
    sync_to_thread=True,
    tags=_TAGS,
    summary="A customer's events, at most 100 per page",
    description="The parameters of the events list, plus scrollId to continue. By email, the"
    " events of every customer with that email. Scroll until data is empty.",
    responses=responses(EventScroll, "{scrollId, data: [event record]}"),
)
def get_profile_events(
    request: Request[Any, Any, Any],
    clientId: FromPath[str],  # noqa: N803
    accountId: FromPath[str],  # noqa: N803
    BRANDID: FromPath[str],  # noqa: N803
    profileId: FromPath[str],  # noqa: N803
    include: Include = None,
    exclude: Exclude = None,
    start: Start = None,
    end: End = None,
    sort: Sort = "desc",
    offset: From = 0,
    size: Size = DEFAULT_SIZE,
    scroll_id: ScrollId = None,
) -> Response[bytes]:
    authorize(request, clientId, accountId, BRANDID)
    only(request, PROFILE_EVENT_PARAMS)
    id_type, value = profile_id(profileId)
    wh = _warehouse(request)
    args: dict[str, Any] = {"include": include, "exclude": exclude, "start": start, "end": end}
    if scroll_id:
        state = decode_scroll(scroll_id, "events")
        if state.get("p") != [accountId, BRANDID, profileId] or not isinstance(
            state.get("q"), dict
        ):
            raise InvalidRequest("scrollId is not valid for this list")
        if not isinstance(state.get("o"), int) or state["o"] < 0:
            raise InvalidRequest("scrollId is not valid for this list")
        offset, size = state["o"], state["s"]
        args = {k: state["q"].get(k) for k in ("include", "exclude", "start", "end")}
        sort = state["q"].get("sort", "desc")
        if not all(v is None or isinstance(v, str) for v in [*args.values(), sort]):
            raise InvalidRequest("scrollId is not valid for this list")
        # A scroll may go past the from + size depth bound: that is what it is for.
        q = event_query(**args, sort=sort, size=size)
        q = type(q)(**{**q.__dict__, "offset": offset})
        snap = wh.snapshot(state["v"])
    else:
        q = event_query(**args, sort=sort, offset=offset, size=size)
        snap = wh.snapshot()
    found = wh.customers_by(snap, accountId, id_type, value, "id")
    if not found:
        raise NotFound(f"no profile {profileId}", headers=freshness_headers(snap))
    records = wh.events(snap, accountId, BRANDID, q, [cid for cid, _ in found])
    token = encode_scroll(
        {
            "t": "events",
            "v": snap.version,
            "p": [accountId, BRANDID, profileId],
            "q": {**args, "sort": sort},
            "o": q.offset + len(records),
            "s": q.size,
        }
    )
    return _list(snap, records, token)


ROUTES = [
    list_events,
    list_profiles,
    get_traits,
    get_meta,
    get_metadata,
    get_external_ids,
    get_profile_events,
]
