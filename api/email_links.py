"""The addresses an email's links point at: the open pixel, click redirects and RFC 8058
one-click unsubscribe. No auth: each carries a token the server signed
(orchestration/delivery/email.py), and every route is rate limited per client address.

- `GET /cdp/email/o/{token}.gif`: a 1x1 GIF, always; a valid token records `email_opened`.
- `GET /cdp/email/c/{token}`: 302 to the link stored for the send at the token's index, and
  `email_clicked` with its URL; 404 for anything else. The target is never read from the URL.
- `POST /cdp/email/unsubscribe/{token}`: unsubscribe-all through the marketing-preferences
  update (a message through the collector), 200 with no redirect; `GET` of it only shows a
  page whose button makes that POST.

Events go through the collector's durable path as tracks of the customer, after the
regulations' admission, with `sendId`, `assetId`, `sendType`, `commandEventId` (and `url`).
"""

from __future__ import annotations

import asyncio
import base64
import html
from datetime import UTC, datetime
from typing import Any

from litestar import MediaType, Request, Response, get, post
from litestar.types import ControllerRouterHandler

from api.preferences_page import HEADERS, not_found
from api.preferences_routes import limited_context, unsubscribe_all
from collector.messages import Tenant, stamp, validate
from mallard.auth import limit
from mallard.errors import NotFound
from mallard.paths import DataPaths
from mallard.secret import ensure_secret
from orchestration.context import subscription_id
from orchestration.delivery.email import links_for, read_send

BASE = "/cdp/email"
GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
_NO_CACHE = {"cache-control": "no-cache, no-store, must-revalidate", "pragma": "no-cache"}


def _ip(request: Request[Any, Any, Any]) -> str | None:
    return request.client.host if request.client else None


def _limit(request: Request[Any, Any, Any]) -> None:
    limit(request, f"email:{_ip(request) or '-'}")


def _paths(request: Request[Any, Any, Any]) -> DataPaths:
    paths: DataPaths = request.app.state.paths
    return paths


async def record(
    request: Request[Any, Any, Any], send: dict[str, Any], event: str, **extra: Any
) -> str | None:
    """A track of the send's customer through the collector; its eventId, or None when the
    token names no customer or the regulations drop the call."""
    who = {k: send[k] for k in ("userId", "anonymousId") if send.get(k)}
    tenant_ids = [send.get(k) for k in ("clientId", "accountId", "brandId")]
    if not who or not all(isinstance(t, str) and t for t in tenant_ids):
        return None
    props: dict[str, Any] = {
        "sendId": send.get("sendId"),
        "assetId": send.get("assetId"),
        "sendType": "email",
        "commandEventId": send.get("eventId"),
        **extra,
    }
    msg: dict[str, Any] = {**who, "event": event, "properties": props}
    agent = request.headers.get("user-agent")
    if agent:
        msg["context"] = {"userAgent": agent}
    validate("track", msg)
    tenant = Tenant(*tenant_ids)  # type: ignore[arg-type]
    collector = request.app.state.collector
    keep = await collector.admission.admit(tenant, "server", [("track", msg)])
    if keep is not None and not keep[0]:
        return None
    stored = stamp(
        "track",
        msg,
        tenant,
        channel="server",
        source="email",
        received=datetime.now(UTC),
        request_ip=_ip(request),
    )
    await collector.accept([stored])
    return str(stored["eventId"])


@get(f"{BASE}/o/{{name:str}}", operation_id="emailOpened", include_in_schema=False)
async def opened(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    """The pixel answers the same whatever happens: a mail client shows nothing either way."""
    token = name.removesuffix(".gif")
    send = read_send(_paths(request), token, "o")
    if send is not None:
        try:
            _limit(request)
            await record(request, send, "email_opened")
        except Exception:
            request.logger.warning("email open not recorded", exc_info=True)
    return Response(GIF, media_type="image/gif", headers=_NO_CACHE)


@get(f"{BASE}/c/{{token:str}}", operation_id="emailClicked", include_in_schema=False)
async def clicked(request: Request[Any, Any, Any], token: str) -> Response[bytes]:
    _limit(request)
    paths = _paths(request)
    send = read_send(paths, token, "c")
    links = await asyncio.to_thread(links_for, paths, send["sendId"]) if send else None
    if send is None or links is None or not 0 <= send["link"] < len(links):
        raise NotFound("unknown link")
    url = links[send["link"]]
    await record(request, send, "email_clicked", url=url)
    return Response(
        b"",
        status_code=302,
        headers={"location": url, **_NO_CACHE, "referrer-policy": "no-referrer"},
    )


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem}"
    "button{font-size:1rem;padding:.6rem 1.2rem;cursor:pointer}"
)


def _page(title: str, body: str, status: int = 200) -> Response[str]:
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="robots" content="noindex"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head>
<body><main><h1>{html.escape(title)}</h1>{body}</main></body></html>"""
    return Response(page, status_code=status, media_type=MediaType.HTML, headers=HEADERS)


@get(
    f"{BASE}/unsubscribe/{{token:str}}",
    operation_id="emailUnsubscribePage",
    include_in_schema=False,
)
async def unsubscribe_page(request: Request[Any, Any, Any], token: str) -> Response[str]:
    """A confirmation only: a GET (a link scanner's prefetch) changes nothing."""
    _limit(request)
    if read_send(_paths(request), token, "u") is None:
        return Response(not_found(), status_code=404, media_type=MediaType.HTML, headers=HEADERS)
    return _page(
        "Unsubscribe",
        "<p>Stop all marketing messages to you?</p>"
        '<form method="post"><input type="hidden" name="List-Unsubscribe" value="One-Click">'
        "<button type=submit>Unsubscribe</button></form>",
    )


@post(
    f"{BASE}/unsubscribe/{{token:str}}",
    operation_id="emailUnsubscribe",
    status_code=200,
    include_in_schema=False,
)
async def unsubscribe(request: Request[Any, Any, Any], token: str) -> Response[str]:
    """RFC 8058 one-click: the mail client POSTs `List-Unsubscribe=One-Click`; no redirect."""
    paths = _paths(request)
    send = read_send(paths, token, "u")
    ctx = limited_context(request)
    if send is None or not isinstance(send.get("customerId"), str):
        return Response(not_found(), status_code=404, media_type=MediaType.HTML, headers=HEADERS)
    sid = subscription_id(await asyncio.to_thread(ensure_secret, paths), send["customerId"])
    try:
        await unsubscribe_all(request, ctx, sid, send.get("assetId"))
    except NotFound:
        return Response(not_found(), status_code=404, media_type=MediaType.HTML, headers=HEADERS)
    return _page("You are unsubscribed", "<p>You will get no more marketing messages from us.</p>")


ROUTES: list[ControllerRouterHandler] = [opened, clicked, unsubscribe_page, unsubscribe]
