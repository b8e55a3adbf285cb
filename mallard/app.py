"""create_app(): the one ASGI app serving every address of the interface on one port.

`/track/...` (ingestion and read API), `/cdp/...` (tag, mobile, preferences), `/v1/...`
(Segment drop-in), `/health` and `/schema` (the OpenAPI document and Swagger UI, served from
vendored files so it renders offline). Wires routes, shared state, error mapping and lifespan.

This module and mallard/cli.py are the composition root: the only modules of mallard/ that
import api/, collector/ and orchestration/ (everything else in mallard/ is imported by them).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from litestar import Litestar, MediaType, Request, Response, Router, get
from litestar.datastructures import CacheControlHeader
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import Components, Reference, SecurityScheme
from litestar.static_files import create_static_files_router
from litestar.status_codes import HTTP_413_REQUEST_ENTITY_TOO_LARGE, HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import Message, Scope

from mallard.body_deadline import BodyDeadline
from mallard.config import apply_tenants
from mallard.errors import MallardError, body_too_large, error_body, family_of
from mallard.ids import new_id
from mallard.passes import read_last_pass
from mallard.paths import DataPaths
from mallard.ratelimit import RateLimiter
from mallard.regulation_runs import RegulationRuns
from mallard.regulations import RegulationStore
from mallard.settings import Settings, get_settings
from mallard.tenancy import ControlStore
from orchestration.locks import writer_holder

log = logging.getLogger(__name__)

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
    if isinstance(exc, HTTPException) and exc.status_code == HTTP_413_REQUEST_ENTITY_TOO_LARGE:
        # Litestar's own refusal of a body over request_max_body_size, read while streaming.
        exc = body_too_large(request.app.state.settings.limits.max_body_bytes)
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


# scripts/vendor-openapi-ui.sh reproduces the vendored files; /schema loads nothing else.
SWAGGER_UI_VERSION = "5.35.0"
SWAGGER_UI_DIR = Path(__file__).parents[1] / "collector" / "static" / "swagger-ui-dist"
SWAGGER_UI_URL = f"/schema/assets/swagger-ui-dist/{SWAGGER_UI_VERSION}"


def openapi_config() -> tuple[OpenAPIConfig, Router]:
    """The OpenAPI document's settings and the router serving Swagger UI's vendored files.

    Swagger UI rather than Redoc: it sends requests from the page (an auth-token entered once
    under Authorize), which is what a new user tries first.
    """
    ui = SwaggerRenderPlugin(
        js_url=f"{SWAGGER_UI_URL}/swagger-ui-bundle.js",
        css_url=f"{SWAGGER_UI_URL}/swagger-ui.css",
        standalone_preset_js_url=f"{SWAGGER_UI_URL}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{SWAGGER_UI_URL}/favicon-32x32.png'>",
        path=["/", "/swagger"],
    )
    schemes: dict[str, SecurityScheme | Reference] = {
        "authToken": SecurityScheme(
            type="apiKey",
            name="auth-token",
            security_scheme_in="header",
            description="Server ingestion and the read API (mallard tokens create).",
        ),
        "writeKey": SecurityScheme(
            type="http",
            scheme="basic",
            description="Tag, mobile and Segment routes: the writeKey as the Basic user, or"
            ' "writeKey" in the body.',
        ),
    }
    config = OpenAPIConfig(
        title="Mallard",
        version="1",
        description="Ingestion, read API and marketing preferences of a self-hosted CDP.",
        path="/schema",
        render_plugins=[ui],
        components=Components(security_schemes=schemes),
    )
    assets = create_static_files_router(
        path=SWAGGER_UI_URL,
        directories=[SWAGGER_UI_DIR / SWAGGER_UI_VERSION],
        name="swagger-ui",
        # The version is in the path, so a file there never changes.
        cache_control=CacheControlHeader(public=True, max_age=31536000),
    )
    return config, assets


@get("/health", operation_id="health", include_in_schema=False, sync_to_thread=False)
def health(request: Request) -> dict[str, Any]:
    warehouse = getattr(request.app.state, "warehouse", None)
    return {
        "status": "ok",
        "dataDir": str(request.app.state.paths.root),
        # Which collector (which worker of `mallard serve --workers N`) answered.
        "collectorId": request.app.state.settings.collector_id,
        "readIndex": warehouse.index_status() if warehouse is not None else None,
        # The last pipeline pass, whoever ran it: kind, when, ok or failed and why.
        "lastPass": asdict(last) if (last := read_last_pass(request.app.state.paths)) else None,
        # Who holds the lake writer's turn (a pass, compaction, a Delete's purge) and for how
        # long; null while no one does.
        "lakeWriter": h.to_json() if (h := writer_holder(request.app.state.paths)) else None,
    }


def resume_regulations(store: RegulationStore, runs: RegulationRuns) -> None:
    """Start again the runs of regulations left pending or running with no live run (the
    server or a run was stopped), on a thread: start-up does not wait for them."""

    def run() -> None:
        try:
            started = runs.resume(store)
        except Exception:
            log.exception("regulations: unfinished runs not started again")
            return
        for regulation_id, pid in started.items():
            log.warning("regulation %s: run started again (pid %d)", regulation_id, pid)

    threading.Thread(target=run, name="resume-regulations", daemon=True).start()


def create_app(settings: Settings | None = None) -> Litestar:
    from api.audiences import ROUTES as AUDIENCE_ROUTES
    from api.email_links import ROUTES as EMAIL_ROUTES
    from api.event_status import ROUTES as STATUS_ROUTES
    from api.middleware import add_freshness
    from api.preferences_routes import ROUTES as PREFERENCE_ROUTES
    from api.regulations import ROUTES as REGULATION_ROUTES
    from api.routes import ROUTES as API_ROUTES
    from api.service import Warehouse
    from collector.clients import ROUTES as CLIENT_ROUTES
    from collector.cors import BrowserCors
    from collector.routes import ROUTES as COLLECTOR_ROUTES
    from collector.routes import install_fast_ingest
    from collector.service import Collector
    from collector.tag import ROUTES as TAG_ROUTES
    from orchestration.environment import TELEMETRY_OFF

    settings = settings or get_settings()
    paths = DataPaths(settings.data_dir)
    openapi, openapi_assets = openapi_config()

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
        app.state.regulations = RegulationStore(paths)
        app.state.regulation_runs = RegulationRuns(paths, TELEMETRY_OFF)
        resume_regulations(app.state.regulations, app.state.regulation_runs)
        # What start-up made (the framework, routes, the OpenAPI shapes) lives as long as the
        # server: frozen, the collector's full collections no longer walk it, and their pauses
        # stay out of the acks' tail latency.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await app.state.collector.stop()
            app.state.warehouse.close()
            app.state.regulations.close()

    app = Litestar(
        route_handlers=[
            health,
            *COLLECTOR_ROUTES,
            *CLIENT_ROUTES,
            *TAG_ROUTES,
            *API_ROUTES,
            *AUDIENCE_ROUTES,
            *STATUS_ROUTES,
            *PREFERENCE_ROUTES,
            *EMAIL_ROUTES,
            *REGULATION_ROUTES,
            openapi_assets,
        ],
        lifespan=[lifespan],
        exception_handlers={Exception: _json_error},
        before_send=[add_request_id, add_freshness],
        request_max_body_size=settings.limits.max_body_bytes,
        openapi_config=openapi,
        debug=False,
    )
    # Server ingestion answered in front of the router (collector/routes.py FastIngest).
    install_fast_ingest(app)
    # Outermost, so CORS reaches the router's own 404/405 answers and every error.
    app.asgi_handler = BrowserCors(BodyDeadline(app.asgi_handler, settings.limits.body_timeout_s))
    app.state.settings = settings
    app.state.paths = paths
    app.state.control = ControlStore(paths.control_db)
    apply_tenants(app.state.control)
    app.state.rate_limiter = RateLimiter(
        settings.limits.rate_per_second, settings.limits.rate_burst
    )
    return app
