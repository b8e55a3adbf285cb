"""CORS for the browser-facing addresses only: tag assets, tag settings and /cdp/events.

The read API must not answer cross-origin requests, so this is not Litestar's
app-wide CORSConfig: it wraps the app's outermost handler and acts on these path prefixes only,
which also covers answers the router makes itself (404, 405) and every error.
"""

from __future__ import annotations

from litestar.types import ASGIApp, Message, Receive, Scope, Send

CORS_PREFIXES = ("/cdp/events/", "/cdp/analytics.js/", "/cdp/analytics-next/", "/cdp/v1/projects/")

# analytics.js sends Authorization (Basic writeKey), Content-Type (text/plain) and X-Retry-Count;
# Content-Encoding lets a browser client post gzip bodies.
ALLOW_HEADERS = b"authorization, content-type, content-encoding, x-retry-count"
ALLOW_METHODS = b"GET, POST, OPTIONS"
# Browsers cap this (Chromium at 2 h); a day asks for the most any of them keeps.
MAX_AGE = b"86400"
# Retry-After lets the tag honour 429 back-off; the request id helps support.
EXPOSE_HEADERS = b"Retry-After, x-mallard-RequestId"

_RESPONSE_HEADERS = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-expose-headers", EXPOSE_HEADERS),
]


def wants_cors(path: str) -> bool:
    return path.startswith(CORS_PREFIXES)


class BrowserCors:
    """Answer preflights for the browser paths and add the CORS headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not wants_cors(scope["path"]):
            await self.app(scope, receive, send)
            return
        request_headers = dict(scope["headers"])
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in request_headers:
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [
                        *_RESPONSE_HEADERS,
                        (b"access-control-allow-methods", ALLOW_METHODS),
                        (b"access-control-allow-headers", ALLOW_HEADERS),
                        (b"access-control-max-age", MAX_AGE),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_RESPONSE_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_cors)
