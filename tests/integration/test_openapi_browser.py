"""/schema renders in headless chromium with every request off loopback refused: Swagger UI and
its assets come from the server itself, and the page shows the document's operations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from tests.browser import chromium
from tests.conftest import Server, free_port, init_data_dir

pytestmark = pytest.mark.integration

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("openapi-ui") / "data"
    srv = Server(data, free_port(), init_data_dir(data))
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("path", ["/schema", "/schema/swagger"])
def test_the_schema_page_renders_offline(server: Server, path: str) -> None:
    doc = httpx.get(f"{server.url}/schema/openapi.json", timeout=30).json()
    operations = [o for item in doc["paths"].values() for o in item.values() if isinstance(o, dict)]
    refused: list[str] = []
    loaded: dict[str, int] = {}

    def only_loopback(route: Any) -> None:
        if urlparse(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with chromium() as browser:
        page = browser.new_page()
        page.route("**/*", only_loopback)
        page.on("response", lambda r: loaded.__setitem__(urlparse(r.url).path, r.status))
        page.goto(server.url + path)
        page.wait_for_selector(".opblock-summary", timeout=30_000)
        rendered = page.locator(".opblock-summary").count()
        text = page.inner_text("body")
        authorize = page.locator("button.authorize").count()

    assert refused == [], f"/schema tried to load from outside the server: {refused}"
    assets = {p: s for p, s in loaded.items() if p.startswith("/schema/assets/")}
    assert {p.rsplit("/", 1)[1] for p in assets} >= {
        "swagger-ui-bundle.js",
        "swagger-ui-standalone-preset.js",
        "swagger-ui.css",
    }, loaded
    assert set(assets.values()) == {200}, assets
    # Every operation of the document is on the page, with its summary.
    assert rendered == len(operations), (rendered, len(operations))
    for summary in (
        "Ingest identify/track/page/screen/batch",
        "Account events, newest first",
        "A customer's traits",
        "Segment HTTP API batch",
        "Update preferences",
    ):
        assert summary in text, summary
    for tag in ("Server ingestion", "Read API", "Marketing preferences"):
        assert tag in text, tag
    assert authorize == 1  # the auth-token and writeKey schemes can be entered once
