"""Read API routes: events and profiles. Thin: check, read, answer.

One controller on the tenant path: its `tenant` dependency checks the auth-token against the
path's client, account and brand before any handler runs.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import msgspec
from litestar import Controller, MediaType, Request, Response, get
from litestar.params import FromPath

from api.params import (
    ACCOUNT_EVENT_PARAMS,
    DEFAULT_SIZE,
    PROFILE_EVENT_PARAMS,
    PROFILE_LIST_PARAMS,
    PROFILE_PARAMS,
    AsOf,
    End,
    Exclude,
    From,
    Include,
    ScrollId,
    Size,
    Sort,
    Start,
    as_of,
    check_page,
    decode_scroll,
    encode_scroll,
    event_query,
    only,
    profile_id,
)
from api.schemas import (
    TRAITS_EXAMPLE,
    EventPage,
    EventScroll,
    ExternalIds,
    ProfileList,
    ProfilesByEmail,
    responses,
)
from api.service import Snapshot, Warehouse, WouldBlock, freshness_headers, iso
from collector.messages import Tenant
from collector.routes import TENANT, TENANT_PATH
from mallard.errors import InvalidRequest, NotFound, refuse_large_bodies
from mallard.openapi import operation_id_per_path

PROFILE = "/profiles/{profileId:str}"
_encode = msgspec.json.Encoder().encode


def _answer(snap: Snapshot, body: bytes) -> Response[bytes]:
    return Response(body, media_type=MediaType.JSON, headers=freshness_headers(snap))


def _list(snap: Snapshot, records: list[str], scroll: str | None = None) -> Response[bytes]:
    head = b"{" if scroll is None else b'{"scrollId":' + _encode(scroll) + b","
    return _answer(snap, head + b'"data":[' + ",".join(records).encode() + b"]}")


def _warehouse(request: Request[Any, Any, Any]) -> Warehouse:
    wh: Warehouse = request.app.state.warehouse
    return wh


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
    request: Request[Any, Any, Any], tenant: Tenant, profile: str, column: str
) -> Response[bytes]:
    only(request, PROFILE_PARAMS)
    snap, id_type, found = _profile(request, tenant.account_id, profile, column)
    if id_type == "email":
        return _list(snap, [doc for _, doc in found])
    return _answer(snap, found[0][1].encode())


def _traits_as_of(
    request: Request[Any, Any, Any], tenant: Tenant, profile: str, raw: str
) -> Response[bytes]:
    """The traits of the profile as it stood at asOf (traits and metadata alike)."""
    only(request, PROFILE_PARAMS)
    t = as_of(raw)
    assert t is not None
    id_type, value = profile_id(profile)
    wh = _warehouse(request)
    snap = wh.snapshot()
    account = tenant.account_id
    if id_type == "email":
        found = wh.traits_as_of(snap, account, t, email=value)
    elif id_type == "id":
        found = wh.traits_as_of(snap, account, t, [value])
    else:  # a userId's profile is the same customer at every time
        ids = [cid for cid, _ in wh.customers_by(snap, account, id_type, value, "id")]
        found = wh.traits_as_of(snap, account, t, ids) if ids else []
    if not found:
        raise NotFound(f"no profile {profile} as of {raw[:40]}", headers=freshness_headers(snap))
    if id_type == "email":
        return _list(snap, [doc for _, doc in found])
    return _answer(snap, found[0][1].encode())


_BY = (
    "profileId is idType:id with idType userId, email or id (the customer's own id). By userId"
    " or id the object itself; by email {data: [...]}, since several customers may share an"
    " email (matched case-insensitively). With asOf, the traits as they stood at that time:"
    " the same rules over the messages whose event time is at or before it (a visitor not yet"
    " identified then is a profile of its own), 404 for a profile that did not stand then."
)


_META = (
    "The traits plus _subscriptionId, createdBy, firstEvent, lastEvent, audiencesStatic,"
    " lastActivityTime and, once the customer has made a group call, groupId (with asOf, only"
    " the traits as they stood: the rest describes the profile now). " + _BY
)


class ReadApi(Controller):
    """The events and profiles of the tenant in the path."""

    path = TENANT_PATH
    dependencies = TENANT
    # GET handlers never read a body, so Litestar never checks its size: refused here.
    before_request = refuse_large_bodies  # type: ignore[assignment]
    tags = ["Read API"]
    security = [{"authToken": []}]

    @get(
        ["/events", "/events/"],
        operation_id="listEvents",
        sync_to_thread=True,
        summary="Account events, newest first",
        description="Events of this account and brand. Page with from and size;"
        " from + size may reach 10,000. With asOf, the events with event time at or before it,"
        " each with its customer (id, userId, email) as it stood then.",
        responses=responses(EventPage, "{data: [event record]}", not_found=False),
    )
    def list_events(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        include: Include = None,
        exclude: Exclude = None,
        start: Start = None,
        end: End = None,
        sort: Sort = "desc",
        offset: From = 0,
        size: Size = DEFAULT_SIZE,
        as_of_time: AsOf = None,
    ) -> Response[bytes]:
        only(request, ACCOUNT_EVENT_PARAMS)
        q = event_query(include, exclude, start, end, sort, offset, size, as_of_time)
        wh = _warehouse(request)
        snap = wh.snapshot()
        return _list(snap, wh.events(snap, tenant.account_id, tenant.brand_id, q))

    @get(
        "/profiles",
        operation_id="listProfiles",
        sync_to_thread=True,
        summary="All customers, 100 at a time",
        description="First page: from and size. Next pages: scrollId from the previous answer,"
        " until data is empty. A scroll stays on the snapshot of its first page while the"
        " warehouse changes.",
        responses=responses(ProfileList, "{scrollId, data: [traits object]}", not_found=False),
    )
    def list_profiles(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        offset: From = 0,
        size: Size = DEFAULT_SIZE,
        scroll_id: ScrollId = None,
    ) -> Response[bytes]:
        only(request, PROFILE_LIST_PARAMS)
        wh = _warehouse(request)
        after: str | None = None
        if scroll_id:
            state = decode_scroll(scroll_id, "profiles")
            if state.get("a") != tenant.account_id or not isinstance(state.get("k"), str):
                raise InvalidRequest("scrollId is not valid for this list")
            snap, after, offset, size = wh.snapshot(state["v"]), state["k"], 0, state["s"]
        else:
            check_page(offset, size)
            snap = wh.snapshot()
        rows = wh.customer_page(snap, tenant.account_id, after, offset, size)
        last = rows[-1][0] if rows else after
        token = encode_scroll(
            {"t": "profiles", "v": snap.version, "a": tenant.account_id, "k": last or "", "s": size}
        )
        return _list(snap, [r[1] for r in rows], token)

    @get(
        f"{PROFILE}/traits",
        operation_id="getProfileTraits",
        summary="A customer's traits",
        description=_BY,
        responses=responses(
            dict[str, Any] | ProfilesByEmail,
            "traits object, or {data} by email",
            example=TRAITS_EXAMPLE,
        ),
    )
    async def get_traits(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        profileId: FromPath[str],  # noqa: N803
        as_of_time: AsOf = None,
    ) -> Response[bytes]:
        if as_of_time is not None:
            return await anyio.to_thread.run_sync(
                _traits_as_of, request, tenant, profileId, as_of_time
            )
        # By userId or id from the index, on the event loop: no hand-off to a worker thread and
        # back, two fewer wake-ups, which on a busy machine each wait for a core. Anything needing
        # I/O (a new snapshot, no index yet, an email to lower in DuckDB) goes to a worker thread.
        if not profileId.startswith("email:"):
            try:
                with _warehouse(request).memory_only():
                    return _traits_or_meta(request, tenant, profileId, "traits")
            except WouldBlock:
                pass
        return await anyio.to_thread.run_sync(_traits_or_meta, request, tenant, profileId, "traits")

    @get(
        [f"{PROFILE}/meta", f"{PROFILE}/metadata"],
        operation_id=operation_id_per_path("getProfile"),
        summary="A customer's metadata (.../meta and .../metadata are the same)",
        description=_META,
        responses=responses(
            dict[str, Any] | ProfilesByEmail, "metadata object, or {data} by email"
        ),
    )
    async def get_metadata(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        profileId: FromPath[str],  # noqa: N803
        as_of_time: AsOf = None,
    ) -> Response[bytes]:
        # Async, on a worker thread: a sync_to_thread handler on two paths is wrapped twice.
        if as_of_time is not None:  # as of a time: the traits then (the rest is of now)
            return await anyio.to_thread.run_sync(
                _traits_as_of, request, tenant, profileId, as_of_time
            )
        return await anyio.to_thread.run_sync(
            _traits_or_meta, request, tenant, profileId, "metadata"
        )

    @get(
        f"{PROFILE}/external_ids",
        operation_id="getProfileExternalIds",
        sync_to_thread=True,
        summary="A customer's identifiers (userId, anonymousIds, email)",
        description=_BY.split(". By")[0] + ". The answer is {data: [...]} for every idType.",
        responses=responses(ExternalIds, "{data: [external id]}"),
    )
    def get_external_ids(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        profileId: FromPath[str],  # noqa: N803
    ) -> Response[bytes]:
        only(request, frozenset())
        snap, _, found = _profile(request, tenant.account_id, profileId, "id")
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
        summary="A customer's events, at most 100 per page",
        description="The parameters of the events list, plus scrollId to continue. By email, the"
        " events of every customer with that email. Scroll until data is empty.",
        responses=responses(EventScroll, "{scrollId, data: [event record]}"),
    )
    def get_profile_events(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
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
        only(request, PROFILE_EVENT_PARAMS)
        id_type, value = profile_id(profileId)
        wh = _warehouse(request)
        args: dict[str, Any] = {"include": include, "exclude": exclude, "start": start, "end": end}
        if scroll_id:
            state = decode_scroll(scroll_id, "events")
            if state.get("p") != [tenant.account_id, tenant.brand_id, profileId] or not isinstance(
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
        found = wh.customers_by(snap, tenant.account_id, id_type, value, "id")
        if not found:
            raise NotFound(f"no profile {profileId}", headers=freshness_headers(snap))
        records = wh.events(snap, tenant.account_id, tenant.brand_id, q, [cid for cid, _ in found])
        token = encode_scroll(
            {
                "t": "events",
                "v": snap.version,
                "p": [tenant.account_id, tenant.brand_id, profileId],
                "q": {**args, "sort": sort},
                "o": q.offset + len(records),
                "s": q.size,
            }
        )
        return _list(snap, records, token)


ROUTES = [ReadApi]
