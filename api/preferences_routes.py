"""Marketing-preferences routes and the hosted page. Thin: parse, call, answer.

`GET|POST /cdp/marketing-preferences/{subscriptionId}` (JSON) and `GET|POST /content?s=ID` or
`/content/{ID}` (the page; the query name is MALLARD_PREFS_QUERY_PARAM). The subscription id is
the only key: every route is rate limited per client address like the other endpoints, and an
unknown id is a plain 404. The `prefs` dependency applies that limit and hands each handler the
preferences service.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from litestar import Controller, MediaType, Request, Response, get, post
from litestar.di import Provide
from litestar.params import FromPath, Parameter
from litestar.types import ControllerRouterHandler

from api.preferences import (
    Preferences,
    Subscriber,
    Update,
    changes_of,
    check_asset_id,
    parse_update,
)
from api.preferences_journal import PreferencesJournal
from api.preferences_page import HEADERS, not_found, render
from api.schemas import (
    PREFERENCES_ERRORS,
    PREFERENCES_EXAMPLE,
    UPDATE_EXAMPLES,
    PreferencesResource,
    PreferencesUpdate,
)
from api.service import Snapshot
from mallard.auth import limit
from mallard.errors import InvalidRequest, NotFound, refuse_large_bodies
from mallard.openapi import answers, request_body
from mallard.preferences import Choices, PreferencesConfigFile

API = "/cdp/marketing-preferences"
_encode = msgspec.json.Encoder().encode
_init_lock = threading.Lock()


class _Context:
    def __init__(self, request: Request[Any, Any, Any]) -> None:
        state = request.app.state
        self.prefs = Preferences(
            state.warehouse, PreferencesJournal(state.paths.preferences_journal)
        )
        self.config = PreferencesConfigFile()
        self.config.get()  # a malformed file fails loudly on first use, not silently

    def choices(self, sub: Subscriber) -> Choices:
        return self.config.get().for_brand(sub.client_id, sub.account_id, sub.brand_id)


def _ctx(request: Request[Any, Any, Any]) -> _Context:
    ctx = getattr(request.app.state, "preferences", None)
    if ctx is None:
        with _init_lock:
            ctx = getattr(request.app.state, "preferences", None)
            if ctx is None:
                ctx = request.app.state.preferences = _Context(request)
    return ctx


def _ip(request: Request[Any, Any, Any]) -> str | None:
    return request.client.host if request.client else None


def limited_context(request: Request[Any, Any, Any]) -> _Context:
    """The preferences service, once the caller's address is within its rate limit."""
    limit(request, f"prefs:{_ip(request) or '-'}")
    return _ctx(request)


PREFS = {"prefs": Provide(limited_context, sync_to_thread=False)}


def _json(body: dict[str, Any]) -> Response[bytes]:
    return Response(_encode(body), media_type=MediaType.JSON, headers={"cache-control": "no-store"})


def _read(request: Request[Any, Any, Any], ctx: _Context, subscription_id: str) -> dict[str, Any]:
    return ctx.prefs.read(subscription_id, ctx.choices, request.app.state.control)


async def _write(
    request: Request[Any, Any, Any],
    ctx: _Context,
    subscription_id: str,
    make_update: Callable[[Choices], Update],
    asset_id: str | None,
) -> dict[str, Any]:
    """Validate, make the message durable through the collector, journal it, read back."""

    def prepare() -> tuple[Snapshot, Subscriber, Choices, Update]:
        snap = ctx.prefs.snapshot()
        sub = ctx.prefs.subscriber(snap, subscription_id)
        choices = ctx.choices(sub)
        return snap, sub, choices, make_update(choices)

    snap, sub, choices, update = await asyncio.to_thread(prepare)
    stored = ctx.prefs.stamped(sub, choices, update, asset_id, _ip(request))
    await request.app.state.collector.accept([stored])

    def finish() -> dict[str, Any]:
        ctx.prefs.journal.add(sub.customer_id, stored["eventId"], changes_of(stored))
        return ctx.prefs.answer(snap, sub, choices, request.app.state.control)

    return await asyncio.to_thread(finish)


async def unsubscribe_all(
    request: Request[Any, Any, Any], ctx: _Context, subscription_id: str, asset_id: str | None
) -> dict[str, Any]:
    """Unsubscribe-all, the update the page's button makes (an email's one-click
    List-Unsubscribe POST, api/email_links.py, makes it too)."""
    unsubscribe = Update({}, {}, True, None)
    return await _write(request, ctx, subscription_id, lambda _c: unsubscribe, asset_id)


SubscriptionId = Annotated[
    str, Parameter(description="The customer's _subscriptionId (merge tag in messages).")
]
AssetId = Annotated[
    str | None,
    Parameter(
        query="assetId",
        description="The campaign asset the change is attributed to (utm_campaign of the link).",
    ),
]
_ANSWERS = answers(
    PreferencesResource,
    "The preferences resource",
    PREFERENCES_ERRORS,
    "read",
    PREFERENCES_EXAMPLE,
)


class MarketingPreferences(Controller):
    path = API
    dependencies = PREFS
    # A body over the limit is refused before the subscription id is looked up.
    before_request = refuse_large_bodies  # type: ignore[assignment]
    tags = ["Marketing preferences"]

    @get(
        "/{subscriptionId:str}",
        operation_id="getMarketingPreferences",
        summary="Preferences",
        responses=_ANSWERS,
    )
    async def get_preferences(
        self,
        request: Request[Any, Any, Any],
        prefs: _Context,
        subscriptionId: SubscriptionId,  # noqa: N803
    ) -> Response[bytes]:
        return _json(await asyncio.to_thread(_read, request, prefs, subscriptionId))

    @post(
        "/{subscriptionId:str}",
        operation_id="updateMarketingPreferences",
        status_code=200,
        summary="Update preferences",
        description="Body {categories?, channels?, unsubscribeAll?, unsubscribeReason?}; query "
        "assetId attributes the change to a campaign asset. Answers the updated resource.",
        dependencies=request_body(
            PreferencesUpdate, "What to change; what is not listed stays.", UPDATE_EXAMPLES
        ),
        responses=_ANSWERS,
    )
    async def update_preferences(
        self,
        request: Request[Any, Any, Any],
        prefs: _Context,
        subscriptionId: SubscriptionId,  # noqa: N803
        asset_id: AssetId = None,
    ) -> Response[bytes]:
        asset = check_asset_id(asset_id)
        body = await request.body()
        update = await _write(
            request, prefs, subscriptionId, lambda c: parse_update(body, c), asset
        )
        return _json(update)


# --- the hosted page ------------------------------------------------------------------------


def _page(body: str, status: int = 200) -> Response[str]:
    return Response(body, status_code=status, media_type=MediaType.HTML, headers=HEADERS)


def _page_id(request: Request[Any, Any, Any], path_id: str | None) -> str:
    return path_id or request.query_params.get(request.app.state.settings.prefs_query_param) or ""


def _campaign(request: Request[Any, Any, Any]) -> str | None:
    try:
        return check_asset_id(request.query_params.get("utm_campaign"))
    except InvalidRequest:
        return None


async def _show(
    request: Request[Any, Any, Any], prefs: _Context, path_id: str | None
) -> Response[str]:
    sid = _page_id(request, path_id)
    try:
        res = await asyncio.to_thread(_read, request, prefs, sid)
    except NotFound:
        return _page(not_found(), 404)
    return _page(render(res, sid, _campaign(request)))


@get("/content", operation_id="preferencesPage", include_in_schema=False, dependencies=PREFS)
async def page_by_query(request: Request[Any, Any, Any], prefs: _Context) -> Response[str]:
    return await _show(request, prefs, None)


@get(
    "/content/{sid:str}",
    operation_id="preferencesPageById",
    include_in_schema=False,
    dependencies=PREFS,
)
async def page_by_path(
    request: Request[Any, Any, Any], prefs: _Context, sid: FromPath[str]
) -> Response[str]:
    return await _show(request, prefs, sid)


async def _submit(
    request: Request[Any, Any, Any], prefs: _Context, path_id: str | None
) -> Response[str]:
    """The page's forms without JavaScript: the same update, then the page again."""
    sid = _page_id(request, path_id)
    form = await request.form()
    action = form.get("action")
    make_update: Callable[[Choices], Update]
    if action == "unsubscribe_all":
        reason = str(form.get("reason") or "").strip()
        unsubscribe = Update({}, {}, True, reason or None)
        make_update, done = (lambda _c: unsubscribe), "You are unsubscribed from everything."
    else:
        ticked_channels = set(form.getall("channel", []))
        ticked_categories = set(form.getall("category", []))

        def make_update(choices: Choices) -> Update:
            return Update(
                {ch: ch in ticked_channels for ch in choices.channels},
                {c.name: c.name in ticked_categories for c in choices.categories},
                False,
                None,
            )

        done = "Your preferences are saved."
    try:
        res = await _write(request, prefs, sid, make_update, _campaign(request))
    except NotFound:
        return _page(not_found(), 404)
    return _page(render(res, sid, _campaign(request), message=done))


@post(
    "/content",
    operation_id="preferencesForm",
    status_code=200,
    include_in_schema=False,
    dependencies=PREFS,
)
async def form_by_query(request: Request[Any, Any, Any], prefs: _Context) -> Response[str]:
    return await _submit(request, prefs, None)


@post(
    "/content/{sid:str}",
    operation_id="preferencesFormById",
    status_code=200,
    include_in_schema=False,
    dependencies=PREFS,
)
async def form_by_path(
    request: Request[Any, Any, Any], prefs: _Context, sid: FromPath[str]
) -> Response[str]:
    return await _submit(request, prefs, sid)


ROUTES: list[ControllerRouterHandler] = [
    MarketingPreferences,
    page_by_query,
    page_by_path,
    form_by_query,
    form_by_path,
]
