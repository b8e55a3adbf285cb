"""The website tag: Segment's analytics.js (vendored), its lazy chunks, and its source settings.

The standalone build derives its CDN from `analytics._cdn` (set by the README snippet) or from
an https script src; it fetches `{cdn}/v1/projects/{writeKey}/settings` and loads chunks from
`{cdn}/analytics-next/bundles/`. With `{cdn}` = `{events_url}/cdp` every request of a page stays
on this server: the settings name no integration but Segment.io (pointed at /cdp/events/std),
no remote plugins and no middleware, so the tag never loads code or sends data elsewhere.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
from litestar import MediaType, Request, Response, get
from litestar.params import FromPath

from mallard.errors import NotFound
from mallard.openapi import NoValidationError, answers
from mallard.tenancy import ControlStore

ANALYTICS_NEXT_VERSION = "1.84.3"  # scripts/vendor-analytics.sh reproduces the vendored files
STATIC_DIR = Path(__file__).parent / "static" / "analytics-next" / ANALYTICS_NEXT_VERSION
EVENTS_PATH = "/cdp/events/std"
JS = "application/javascript; charset=utf-8"
# The build sets `window.analyticsWriteKey` to this placeholder, which Segment's CDN replaces
# with the key of the URL: then the script works even without the snippet's `_writeKey`.
_PLACEHOLDER = b'"__WRITE_KEY__"'
_SAFE_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}")
# Chunk names carry a content hash, so they never change; the entry script and settings may.
_IMMUTABLE = {"cache-control": "public, max-age=31536000, immutable"}
_SHORT = {"cache-control": "public, max-age=300"}

_encode = msgspec.json.Encoder().encode


def _documented(
    body: Any, description: str, media_type: str, missing: str | None = None
) -> dict[str, Any]:
    """The documented answers of a tag route: its file or settings, or a 404 if it can miss."""
    errors = {404: (f"not_found: {missing}", missing)} if missing else {}
    out = answers(body, description, errors, "read")
    out[200].media_type = media_type
    return {"responses": out, "operation_class": NoValidationError}


@cache
def _assets() -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in STATIC_DIR.glob("*.js")}
    if "standalone.js" not in files:
        raise RuntimeError(f"analytics.js is not vendored in {STATIC_DIR}")
    return files


def origin(request: Request[Any, Any, Any]) -> tuple[str, str]:
    """(protocol, host[:port]) the browser used to reach us, behind a proxy too."""
    proto = request.headers.get("x-forwarded-proto") or request.url.scheme
    host = request.headers.get("x-forwarded-host") or request.headers.get("host")
    if not host:
        host = request.url.netloc
    return ("https" if proto.split(",")[0].strip() == "https" else "http"), host


def source_settings(write_key: str, protocol: str, host: str) -> dict[str, Any]:
    """The settings object analytics.js expects from its CDN, aimed at this server."""
    api_host = f"{host}{EVENTS_PATH}"
    return {
        "integrations": {
            "Segment.io": {
                "apiKey": write_key,
                "apiHost": api_host,
                "protocol": protocol,
                "unbundledIntegrations": [],
                "addBundledMetadata": True,
                "maybeBundledConfigIds": {},
                "versionSettings": {"version": "4.4.7", "componentTypes": ["browser"]},
            }
        },
        "plan": {
            "track": {"__default": {"enabled": True, "integrations": {}}},
            "identify": {"__default": {"enabled": True}},
            "group": {"__default": {"enabled": True}},
        },
        "edgeFunction": {},
        "analyticsNextEnabled": True,
        "middlewareSettings": {},
        "enabledMiddleware": {},
        # analytics-next sends metrics over https whatever these settings say (only load
        # options can change that protocol), so over plain http they are turned off rather
        # than sent to an address that does not answer.
        "metrics": {
            "sampleRate": 0.1 if protocol == "https" else 0,
            "host": api_host,
            "flushTimer": 30000,
        },
        "legacyVideoPluginsEnabled": False,
        "remotePlugins": [],
    }


@get(
    "/cdp/analytics.js/v1/{writeKey:str}/analytics.min.js",
    operation_id="tagScript",
    summary="analytics.js (Segment analytics-next standalone build)",
    sync_to_thread=False,
    **_documented(str, "The script, with the writeKey of the path", JS),
)
def tag_script(writeKey: FromPath[str]) -> Response[bytes]:  # noqa: N803
    body = _assets()["standalone.js"]
    if _SAFE_KEY.fullmatch(writeKey):
        body = body.replace(_PLACEHOLDER, f'"{writeKey}"'.encode(), 1)
    return Response(body, media_type=JS, headers=_SHORT)


@get(
    "/cdp/analytics-next/bundles/{name:str}",
    operation_id="tagChunk",
    summary="A lazily loaded chunk of analytics.js",
    sync_to_thread=False,
    **_documented(str, "The chunk; its name carries its content hash", JS, "no such chunk"),
)
def tag_chunk(name: FromPath[str]) -> Response[bytes]:
    body = _assets().get(name) if name != "standalone.js" else None
    if body is None:
        raise NotFound(f"no analytics.js chunk {name!r}")
    return Response(body, media_type=JS, headers=_IMMUTABLE)


@get(
    "/cdp/v1/projects/{writeKey:str}/settings",
    operation_id="tagSettings",
    summary="Source settings for analytics.js",
    sync_to_thread=False,
    **_documented(
        dict[str, Any],
        "Settings that keep every request of the tag on this server",
        MediaType.JSON,
        "unknown writeKey",
    ),
)
def tag_settings(request: Request[Any, Any, Any], writeKey: FromPath[str]) -> Response[bytes]:  # noqa: N803
    control: ControlStore = request.app.state.control
    if control.resolve_write_key(writeKey) is None:
        raise NotFound("unknown writeKey")
    protocol, host = origin(request)
    # The answer depends on these headers: a shared cache must not serve one host's settings
    # (where the tag sends its data) to a request for another.
    headers = {**_SHORT, "vary": "host, x-forwarded-host, x-forwarded-proto"}
    return Response(
        _encode(source_settings(writeKey, protocol, host)),
        media_type=MediaType.JSON,
        headers=headers,
    )


ROUTES = [tag_script, tag_chunk, tag_settings]
