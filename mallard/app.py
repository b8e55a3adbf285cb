"""create_app(): the one ASGI app serving every address of the interface on one port.

`/track/...` (ingestion and read API), `/cdp/...` (tag, mobile, preferences), `/v1/...`
(Segment drop-in) and `/health`. Wires routes, shared state, error mapping and lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, MediaType, Request, Response, get
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import Message, Scope

from mallard.config import apply_tenants
from mallard.errors import MallardError, error_body, family_of
from mallard.ids import new_id
from mallard.paths import DataPaths
from mallard.ratelimit import RateLimiter
from mallard.settings import Settings, get_settings
from mallard.tenancy import ControlStore

# Framework errors keep their status; this gives them the code of our hierarchy.
_HTTP_CODES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "authentication_error",
    404: "not_found",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def _detail(exc: HTTPException) -> str:
    """The framework's message, with the parameter checks that failed (e.g. size: Expected
    `int` <= 100) rather than only "Validation failed for GET ..."."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    problems = [
        f"{e.get('key')}: {e.get('message')}" for e in extra if isinstance(e, dict) and e.get("key")
    ]
    return "; ".join(problems) if problems else str(exc.detail)


def _json_error(request: Request, exc: Exception) -> Response[Any]:
    family = family_of(request.url.path, request.method)
    if isinstance(exc, MallardError):
        status, body = error_body(exc, family)
        headers = exc.headers
    elif isinstance(exc, HTTPException):
        err = MallardError(_detail(exc))
        err.status, err.code = (
            exc.status_code,
            _HTTP_CODES.get(exc.status_code, "internal_server_error"),
        )
        status, body = error_body(err, family)
        headers = dict(exc.headers or {})
    else:
        request.logger.exception("unhandled error on %s", request.url.path)
        status, body = error_body(MallardError("internal server error"), family)
        status, headers = HTTP_500_INTERNAL_SERVER_ERROR, {}
    return Response(body, status_code=status, headers=headers, media_type=MediaType.JSON)


async def add_request_id(message: Message, scope: Scope) -> None:
    """Every HTTP response carries x-mallard-RequestId, framework 404/405 included (a hook, not
    a middleware, because route middleware never sees unmatched paths)."""
    if message["type"] == "http.response.start":
        message["headers"] = [
            *message.get("headers", []),
            (b"x-mallard-RequestId", new_id().encode()),
        ]


@get("/health", operation_id="health", include_in_schema=False, sync_to_thread=False)
def health(request: Request) -> dict[str, Any]:
    warehouse = getattr(request.app.state, "warehouse", None)
    return {
        "status": "ok",
        "dataDir": str(request.app.state.paths.root),
        "readIndex": warehouse.index_status() if warehouse is not None else None,
    }


def create_app(settings: Settings | None = None) -> Litestar:
    from api.middleware import add_freshness
    from api.preferences_routes import ROUTES as PREFERENCE_ROUTES
    from api.routes import ROUTES as API_ROUTES
    from api.service import Warehouse
    from collector.clients import ROUTES as CLIENT_ROUTES
    from collector.cors import BrowserCors
    from collector.routes import ROUTES as COLLECTOR_ROUTES
    from collector.service import Collector
    from collector.tag import ROUTES as TAG_ROUTES

    settings = settings or get_settings()
    paths = DataPaths(settings.data_dir)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.collector = Collector(settings, paths)
        await app.state.collector.start()
        app.state.warehouse = Warehouse(
            paths,
            build_nice=settings.pipeline_nice,
            pages_process=settings.pages_process,
            pages_idle=settings.pipeline_idle,
        )
        app.state.warehouse.warm()
        try:
            yield
        finally:
            await app.state.collector.stop()
            app.state.warehouse.close()

    app = Litestar(
        route_handlers=[
            health,
            *COLLECTOR_ROUTES,
            *CLIENT_ROUTES,
            *TAG_ROUTES,
            *API_ROUTES,
            *PREFERENCE_ROUTES,
        ],
        lifespan=[lifespan],
        exception_handlers={Exception: _json_error},
        before_send=[add_request_id, add_freshness],
        request_max_body_size=settings.limits.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Mallard", version="1", path="/schema"),
        debug=False,
    )
    # Outermost, so CORS reaches the router's own 404/405 answers and every error.
    app.asgi_handler = BrowserCors(app.asgi_handler)
    app.state.settings = settings
    app.state.paths = paths
    app.state.control = ControlStore(paths.control_db)
    apply_tenants(app.state.control)
    app.state.rate_limiter = RateLimiter(
        settings.limits.rate_per_second, settings.limits.rate_burst
    )
    return app
