"""Audiences API: the audience files and their current members in the path's account, paged like
the profile list (docs/audiences.md). Same auth as the profile routes."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, MediaType, Request, Response, get
from litestar.params import FromPath

from api.params import (
    DEFAULT_SIZE,
    PROFILE_LIST_PARAMS,
    From,
    ScrollId,
    Size,
    check_page,
    decode_scroll,
    encode_scroll,
    only,
)
from api.schemas import responses
from api.service import Warehouse, freshness_headers, iso
from collector.messages import Tenant
from collector.routes import TENANT, TENANT_PATH
from mallard.errors import InvalidRequest, NotFound, refuse_large_bodies

_encode = msgspec.json.Encoder().encode


class Audience(msgspec.Struct):
    """An audience file (config/audiences/<name>.sql) and its members in this account now."""

    name: str
    status: str  # ok: its select ran in the last pass; failed: see error
    error: str | None
    members: int


class AudienceList(msgspec.Struct):
    data: list[Audience]


class AudienceMember(msgspec.Struct):
    """A current member: the customer's id (traits `id`), userId (`externalId`), and when the
    customer entered the audience."""

    id: str
    externalId: str | None  # noqa: N815
    enteredAt: str  # noqa: N815


class AudienceMembers(msgspec.Struct):
    """`data` is empty once the list is exhausted."""

    scrollId: str  # noqa: N815
    data: list[AudienceMember]


def _warehouse(request: Request[Any, Any, Any]) -> Warehouse:
    wh: Warehouse = request.app.state.warehouse
    return wh


class AudiencesApi(Controller):
    """The audiences of the tenant in the path's account."""

    path = TENANT_PATH
    dependencies = TENANT
    before_request = refuse_large_bodies  # type: ignore[assignment]
    tags = ["Read API"]
    security = [{"authToken": []}]

    @get(
        "/audiences",
        operation_id="listAudiences",
        sync_to_thread=True,
        summary="Audiences, with their member counts in this account",
        description="Every audience file the last pass evaluated (config/audiences/<name>.sql).",
        responses=responses(AudienceList, "{data: [audience]}", not_found=False),
    )
    def list_audiences(self, request: Request[Any, Any, Any], tenant: Tenant) -> Response[bytes]:
        only(request, frozenset())
        wh = _warehouse(request)
        snap = wh.snapshot()
        data = [
            Audience(name=r[0], status=r[1], error=r[2], members=int(r[3]))
            for r in wh.audiences(snap, tenant.account_id)
        ]
        return Response(
            _encode(AudienceList(data)),
            media_type=MediaType.JSON,
            headers=freshness_headers(snap),
        )

    @get(
        "/audiences/{name:str}/members",
        operation_id="listAudienceMembers",
        sync_to_thread=True,
        summary="An audience's members in this account, 100 at a time",
        description="First page: from and size. Next pages: scrollId from the previous answer,"
        " until data is empty. A scroll stays on the snapshot of its first page.",
        responses=responses(AudienceMembers, "{scrollId, data: [member]}"),
    )
    def list_members(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        name: FromPath[str],
        offset: From = 0,
        size: Size = DEFAULT_SIZE,
        scroll_id: ScrollId = None,
    ) -> Response[bytes]:
        only(request, PROFILE_LIST_PARAMS)
        wh = _warehouse(request)
        after: str | None = None
        if scroll_id:
            state = decode_scroll(scroll_id, "audience")
            if (
                state.get("a") != tenant.account_id
                or state.get("n") != name
                or not isinstance(state.get("k"), str)
            ):
                raise InvalidRequest("scrollId is not valid for this list")
            snap, after, offset, size = wh.snapshot(state["v"]), state["k"], 0, state["s"]
        else:
            check_page(offset, size)
            snap = wh.snapshot()
        rows = wh.audience_member_page(snap, tenant.account_id, name, after, offset, size)
        if rows is None:
            raise NotFound(f"no audience {name}", headers=freshness_headers(snap))
        last = rows[-1][0] if rows else after
        token = encode_scroll(
            {
                "t": "audience",
                "v": snap.version,
                "a": tenant.account_id,
                "n": name,
                "k": last or "",
                "s": size,
            }
        )
        data = [AudienceMember(id=r[0], externalId=r[1], enteredAt=iso(r[2])) for r in rows]
        return Response(
            _encode(AudienceMembers(token, data)),
            media_type=MediaType.JSON,
            headers=freshness_headers(snap),
        )


ROUTES = [AudiencesApi]
