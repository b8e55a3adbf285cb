"""Every writeKey route x every kind of writeKey: status and body.

The routes are every POST route of the app under /cdp/events/ and /v1/, so a new one cannot be
left out. The sibling test_auth_matrix.py does the same for `auth-token` routes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from tests.conftest import Server, free_port, init_data_dir, mallard, wait_landed

# Tag metrics carry no writeKey (analytics.js sends none) and are always accepted.
NO_KEY_ROUTES = {"/cdp/events/std/m"}
EVENT = {"userId": "wk-matrix", "anonymousId": "wk-anon"}
BODIES: dict[str, dict[str, Any]] = {
    "t": {**EVENT, "type": "track", "event": "Matrix Checked"},
    "p": {**EVENT, "type": "page", "name": "Matrix"},
    "i": {**EVENT, "type": "identify", "traits": {"plan": "pro"}},
    "s": {**EVENT, "type": "screen", "name": "Matrix"},
    "g": {**EVENT, "type": "group", "groupId": "g-1"},
    "a": {**EVENT, "type": "alias", "previousId": "wk-anon"},
    "identify": {**EVENT, "traits": {"plan": "pro"}},
    "track": {**EVENT, "event": "Matrix Checked"},
    "page": {**EVENT, "name": "Matrix"},
    "screen": {**EVENT, "name": "Matrix"},
    "group": {**EVENT, "groupId": "g-1"},
    "alias": {**EVENT, "previousId": "wk-anon"},
    "batch": {"batch": [{**EVENT, "type": "track", "event": "Matrix Checked"}]},
    "b": {"batch": [{**EVENT, "type": "track", "event": "Matrix Checked"}]},
    "m": {"series": []},
}


def write_key_routes() -> list[str]:
    from mallard.app import create_app
    from mallard.settings import get_settings

    app = create_app(get_settings().with_data_dir(Path("/tmp/mallard-route-listing")))
    paths = {
        route.path
        for route in app.routes
        if route.path.startswith(("/cdp/events/", "/v1/"))
        and "POST" in getattr(route, "methods", set())
    }
    assert not any("{" in p for p in paths), "a writeKey route with a path parameter"
    return sorted(paths)


ROUTES = write_key_routes()


def test_matrix_covers_the_client_routes() -> None:
    for path in ("/cdp/events/std/t", "/cdp/events/std/mobile/batch", "/v1/batch", "/v1/alias"):
        assert path in ROUTES


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    d = tmp_path_factory.mktemp("wkmatrix") / "data"
    creds = init_data_dir(d)
    mallard("accounts", "add", "acme", "shop", "--brand", "SHOP", "--brand", "OUTLET", data_dir=d)
    keys: dict[str, str] = {}
    keys["rotated"] = mallard("writekeys", "create", "acme", "shop", "SHOP", data_dir=d).stdout
    keys["valid"] = mallard("writekeys", "rotate", "acme", "shop", "SHOP", data_dir=d).stdout
    keys["revoked"] = mallard("writekeys", "create", "acme", "shop", "OUTLET", data_dir=d).stdout
    keys = {k: v.strip() for k, v in keys.items()}
    mallard("writekeys", "revoke", keys["revoked"], data_dir=d)
    keys["unknown"] = "wk_00000000_not-a-key"
    server = Server(d, free_port(), creds, env={"MALLARD_RATE_BURST": "100000"})
    server.start()
    yield server, keys
    server.stop()


# How the key travels: in the body (the tag, mobile) or as the Basic user (the SDKs).
CREDENTIALS = [
    ("valid", "body"),
    ("valid", "basic"),
    ("rotated", "body"),
    ("rotated", "basic"),
    ("revoked", "body"),
    ("revoked", "basic"),
    ("unknown", "body"),
    ("unknown", "basic"),
    ("none", ""),
]


@pytest.mark.parametrize(("credential", "carrier"), CREDENTIALS)
@pytest.mark.parametrize("path", ROUTES)
def test_route_by_write_key(
    srv: tuple[Server, dict[str, str]], path: str, credential: str, carrier: str
) -> None:
    server, keys = srv
    body = dict(BODIES[path.rsplit("/", 1)[-1]])
    headers = {"content-type": "text/plain"}
    if credential != "none":
        key = keys[credential]
        if carrier == "body":
            body["writeKey"] = key
        else:
            headers["authorization"] = "Basic " + base64.b64encode(f"{key}:".encode()).decode()
    r = httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=30)
    assert r.headers["content-type"].startswith("application/json")
    if credential == "valid" or path in NO_KEY_ROUTES:
        assert r.status_code == 200, r.text
        assert r.json()["success"] is True
        return
    assert r.status_code == 403, r.text
    assert r.json()["success"] is False and "writeKey" in r.json()["message"]
    for k in keys.values():
        assert k not in r.text


def test_valid_key_writes_to_its_brand(srv: tuple[Server, dict[str, str]]) -> None:
    """Runs after the matrix: what the valid key sent landed under acme/shop/SHOP only."""
    server, keys = srv
    r = httpx.post(
        server.url + "/v1/track",
        json={"userId": "wk-tenant", "event": "Where"},
        auth=(keys["valid"], ""),
        timeout=30,
    )
    event_id = r.json()["eventId"]
    wait_landed(server.data_dir, [event_id])
    rows = [
        row
        for f in (server.data_dir / "landing").glob("date=*/*.parquet")
        for row in pq.read_table(
            f, columns=["event_id", "client_id", "account_id", "brand_id"]
        ).to_pylist()
    ]
    tenants = {(r["client_id"], r["account_id"], r["brand_id"]) for r in rows}
    assert tenants == {("acme", "shop", "SHOP")}
    assert event_id in {r["event_id"] for r in rows}
