"""Every tenant route x every kind of credential: status and body.

The routes come from the app itself, so a new route cannot be left out of the matrix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server, free_port, init_data_dir, mallard

TENANT = {"clientId": "acme", "accountId": "shop", "BRANDID": "SHOP"}
# A concrete value for every other path parameter a tenant route may have.
OTHER_PARAMS = {
    "action": "track",
    "profileId": "userId:nobody",
    "endpoint": "traits",
    "eventId": "01a2e4c0-0000-7000-8000-000000000000",
    "regulationId": "r-1",
}
BODIES = {
    "identify": {"userId": "m-1", "event": "identify", "traits": {"plan": "pro"}},
    "track": {"userId": "m-1", "event": "Matrix Checked"},
    "page": {"userId": "m-1", "event": "page"},
    "screen": {"userId": "m-1", "name": "Home"},
    "batch": {"batch": [{"type": "track", "userId": "m-1", "event": "Matrix Checked"}]},
    # Refused by its type (400) once the token is let through: no regulation is filed.
    "regulations": {"regulationType": "MATRIX", "subject": {"type": "USER_ID", "ids": ["m-1"]}},
}


def tenant_routes() -> list[tuple[str, str]]:
    """(method, concrete path) of every app route under /track/{client}/{account}/{BRAND}."""
    from mallard.app import create_app
    from mallard.settings import get_settings

    app = create_app(get_settings().with_data_dir(Path("/tmp/mallard-route-listing")))
    out = []
    for route in app.routes:
        if not route.path.startswith("/track/{"):
            continue
        for method in sorted(getattr(route, "methods", set()) - {"OPTIONS", "HEAD"}):
            # A route taking {action} stands for every action the collector accepts.
            actions = list(BODIES) if "{action" in route.path else [""]
            for action in actions:

                def fill(m: re.Match[str], action: str = action) -> str:
                    name = m.group(1).split(":")[0]
                    if name == "action":
                        return action
                    return TENANT.get(name) or OTHER_PARAMS.get(name) or "x"

                out.append((method, re.sub(r"\{([^}]+)\}", fill, route.path)))
    return sorted(set(out))


ROUTES = tenant_routes()


def test_matrix_covers_ingestion_and_read_routes() -> None:
    paths = [p for _, p in ROUTES]
    for action in BODIES:
        assert any(p.endswith(f"/v1/{action}") for p in paths), action
    assert any("/v1/events" in p for p in paths)
    assert any("/v1/profiles" in p for p in paths)
    assert any("/v1/regulations" in p for p in paths)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    d = tmp_path_factory.mktemp("matrix") / "data"
    creds = init_data_dir(d)
    mallard("accounts", "add", "acme", "shop", "--brand", "SHOP", "--brand", "OUTLET", data_dir=d)
    tokens = {}
    for kind, scope in [
        ("client", "client:acme"),
        ("account", "account:acme/shop"),
        ("brands", "brands:acme/shop"),
        ("brand", "brand:acme/shop/SHOP"),
        ("other_brand", "brand:acme/shop/OUTLET"),
        ("other_client", "client:demo"),
        ("revoked", "client:acme"),
    ]:
        out = json.loads(mallard("tokens", "create", "--scope", scope, "--json", data_dir=d).stdout)
        tokens[kind] = out["token"]
        if kind == "revoked":
            mallard("tokens", "revoke", out["tokenId"], data_dir=d)
    tokens["unknown"] = "mlt_00000000_not-a-token"
    server = Server(d, free_port(), creds, env={"MALLARD_RATE_BURST": "100000"})
    server.start()
    yield server, tokens
    server.stop()


ALLOWED = ("client", "account", "brands", "brand")
DENIED = ("other_brand", "other_client")
# A regulation is account-wide: a token scoped to one brand may not file or read one.
ACCOUNT_WIDE = ("client", "account", "brands")
UNAUTHENTICATED = ("revoked", "unknown", "none")
EVENT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _error(body: object) -> str:
    """The code of a read-API error body, after checking its whole shape."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message"} and error["message"], body
    return str(error["code"])


@pytest.mark.parametrize("credential", ALLOWED + DENIED + UNAUTHENTICATED)
@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_route_by_credential(
    srv: tuple[Server, dict[str, str]], method: str, path: str, credential: str
) -> None:
    server, tokens = srv
    headers = {"content-type": "application/json"}
    if credential != "none":
        headers["auth-token"] = tokens[credential]
    action = path.rsplit("/", 1)[-1]
    body = BODIES.get(action) if method == "POST" else None
    r = httpx.request(method, server.url + path, headers=headers, json=body, timeout=30)
    regulations = "/v1/regulations" in path
    ingest = method == "POST" and not regulations
    assert r.headers["content-type"].startswith("application/json")
    allowed = ACCOUNT_WIDE if regulations else ALLOWED
    body = r.json()
    if credential in allowed:
        # Each allowed call gets its exact status and the whole shape of its body.
        if regulations and method == "POST":  # a body of an unknown type
            assert r.status_code == 400, r.text
            assert _error(body) == "validation_error", r.text
            assert "regulationType" in body["error"]["message"], r.text
        elif regulations and path.endswith("/regulations"):  # the list: none filed
            assert r.status_code == 200 and body == {"data": []}, r.text
        elif regulations:  # a regulation that does not exist
            assert r.status_code == 404 and _error(body) == "not_found", r.text
        elif ingest:
            assert r.status_code == 200, r.text
            if action == "batch":
                assert set(body) == {"success", "eventId", "eventIds"}, r.text
                assert len(body["eventIds"]) == 1 and EVENT_ID.fullmatch(body["eventIds"][0])
            else:
                assert set(body) == {"success", "eventId"}, r.text
            assert body["success"] is True and EVENT_ID.fullmatch(body["eventId"]), r.text
        elif "/profiles/" in path or path.endswith(("/status", "/members")):
            # an unknown profile, event or audience
            assert r.status_code == 404 and _error(body) == "not_found", r.text
        else:  # a list: a page of the account's data (none built yet)
            assert r.status_code == 200, r.text
            assert body["data"] == [] and set(body) <= {"data", "scrollId"}, r.text
        return
    if ingest:
        assert r.status_code == 403, r.text
        assert set(body) == {"success", "message"} and body["success"] is False, r.text
        assert body["message"], r.text
    else:
        expected = 403 if credential in DENIED or credential in ALLOWED else 401
        assert r.status_code == expected, r.text
        assert _error(body) == "authentication_error", r.text
    # A secret never echoes back.
    for t in tokens.values():
        assert t not in r.text


@pytest.mark.parametrize(
    "path",
    [
        "/track/acme/nope/NOPE/v1/track",
        "/track/acme/shop/NOPE/v1/track",
        "/track/acme/shop/shop/v1/track",
    ],
)
def test_unknown_tenant_is_refused_like_out_of_scope(
    srv: tuple[Server, dict[str, str]], path: str
) -> None:
    server, tokens = srv
    r = httpx.post(
        server.url + path,
        json=BODIES["track"],
        timeout=30,
        headers={"auth-token": tokens["client"]},
    )
    assert r.status_code == 403 and r.json()["success"] is False


def test_secrets_never_reach_logs_or_data(srv: tuple[Server, dict[str, str]]) -> None:
    """Runs after the matrix: no token appears in the server log or any file of the data dir."""
    server, tokens = srv
    secrets = [t for k, t in tokens.items() if k != "unknown"]
    for f in server.data_dir.rglob("*"):
        if not f.is_file() or f.name == "demo-credentials.json" or f.is_symlink():
            continue
        data = f.read_bytes()
        for s in secrets:
            assert s.encode() not in data, f"a token is stored in {f}"
