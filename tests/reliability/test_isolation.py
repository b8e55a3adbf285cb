"""Isolation: every route of the app x every token scope x another tenant's ids; secrets.

The routes come from the app's own route table: a tenant route (`/track/{clientId}/...`) is
called with each of tenant A's token scopes (client, account, brands, brand) on tenant B's path
with B's ids (refused, 403), and on A's own path with B's ids (B's customer, email, customer id,
event, regulation: not found, or A's own lists); no answer holds anything of B's. Every other
route must be classified below (writeKey, capability or public), so a new route fails here
until someone says how it is isolated. Writes through A's credentials never reach B: B's
profile, events and admission are checked after the matrix.

Secrets (tokens, writeKeys, the SMTP password, the server's HMAC secret) never appear in the
server's log, the pipeline's output, Dagster's run records and event logs, any answer of the
matrix, or the OpenAPI document; and the code compares secrets in constant time.
"""

from __future__ import annotations

import ast
import base64
import json
import re
import secrets
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.harness import REPO, Server, free_port, init_data_dir, mallard, pipeline_pass
from tests.conftest import wait_landed
from tests.reliability.conftest import FIGURES

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

A = {"clientId": "acme", "accountId": "shop", "BRANDID": "SHOP"}
B = {"clientId": "demo", "accountId": "demo", "BRANDID": "DEMO"}
SCOPES = {
    "client": "client:acme",
    "account": "account:acme/shop",
    "brands": "brands:acme/shop",
    "brand": "brand:acme/shop/SHOP",
}
# A regulation is account-wide: a brand-scoped token may not file or read one.
ACCOUNT_WIDE = ("client", "account", "brands")
U = secrets.token_hex(4)
SMTP_PASSWORD = f"smtp-pw-{secrets.token_hex(8)}"

# Routes outside /track/{clientId}/...: how each is isolated. A new route must be added here.
WRITEKEY_ROUTES: set[str] = {
    *(f"/cdp/events/std/{t}" for t in "saptgib"),
    "/cdp/events/std/mobile/batch",
    *(f"/v1/{a}" for a in ("alias", "identify", "page", "group", "screen", "track", "batch")),
}
# Addressed by an unguessable value the server made (subscription id, signed email token): no
# token grants them, and the value names one customer of one tenant.
CAPABILITY_ROUTES = {
    "/cdp/marketing-preferences/{subscriptionId:str}",
    "/content",
    "/content/{sid:str}",
    "/cdp/email/o/{name:str}",
    "/cdp/email/c/{token:str}",
    "/cdp/email/unsubscribe/{token:str}",
}
# Hold no tenant data: health, the OpenAPI document and its UI, the tag and its settings (which
# carry only the writeKey given in the path), and the tag's metrics (stored for no tenant).
PUBLIC_PREFIXES = ("/health", "/schema", "/cdp/analytics", "/cdp/v1/projects/", "/cdp/events/std/m")


def app_routes() -> list[tuple[str, str]]:
    """(method, path template) of every route of the app."""
    from mallard.app import create_app
    from mallard.settings import get_settings

    app = create_app(get_settings().with_data_dir(Path("/tmp/mallard-route-listing")))
    out = []
    for route in app.routes:
        methods: set[str] = set(getattr(route, "methods", ()))
        for method in sorted(methods - {"OPTIONS", "HEAD"}):
            out.append((method, route.path))
    return sorted(set(out))


ROUTES = app_routes()
TENANT_ROUTES = [(m, p) for m, p in ROUTES if p.startswith("/track/{")]


def test_every_route_is_classified() -> None:
    """A route that is neither a tenant route nor classified above fails: say how it is kept
    to its tenant, and test it."""
    unclassified = [
        (m, p)
        for m, p in ROUTES
        if not p.startswith("/track/{")
        and p not in WRITEKEY_ROUTES
        and p not in CAPABILITY_ROUTES
        and not p.startswith(PUBLIC_PREFIXES)
    ]
    assert unclassified == []
    assert len(TENANT_ROUTES) >= 14


@dataclass
class World:
    server: Server
    tokens: dict[str, str]  # A's scopes, and "b" (B's client token)
    write_key_a: str
    write_key_b: str
    b_ids: dict[str, str]  # what B has: userId, email, customer id, event, regulation, ...
    b_before: dict[str, Any]
    answers: list[str] = field(default_factory=list)  # every body the matrix got
    calls: int = 0


def _json(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    d = tmp_path_factory.mktemp("isolation") / "data"
    creds = init_data_dir(d)
    mallard("accounts", "add", "acme", "shop", "--brand", "SHOP", "--brand", "OUTLET", data_dir=d)
    tokens = {
        kind: json.loads(
            mallard("tokens", "create", "--scope", scope, "--json", data_dir=d).stdout
        )["token"]
        for kind, scope in SCOPES.items()
    }
    tokens["b"] = creds["token"]
    wk_a = mallard("writekeys", "create", "acme", "shop", "SHOP", data_dir=d).stdout.strip()
    env = {
        "MALLARD_ROLL_INTERVAL_S": "0.3",
        "MALLARD_RATE_BURST": "1000000",
        "MALLARD_RATE_PER_SECOND": "1000000",
        # A password the dispatcher must use and never write down (nothing listens there).
        "MALLARD_SMTP_URL": f"smtp://mallard:{SMTP_PASSWORD}@127.0.0.1:{free_port()}",
    }
    server = Server(d, free_port(), creds, env=env)
    server.start()
    try:
        b_user, a_user = f"b-user-{U}", f"a-user-{U}"
        hb = {"auth-token": tokens["b"]}
        ha = {"auth-token": tokens["client"]}
        b_base = f"{server.url}/track/demo/demo/DEMO/v1"
        a_base = f"{server.url}/track/acme/shop/SHOP/v1"
        ids = []
        for base, h, user, marker in ((b_base, hb, b_user, "B"), (a_base, ha, a_user, "A")):
            for body in (
                {
                    "userId": user,
                    "event": "identify",
                    "traits": {"email": f"{user}@{marker}.test", "secret": f"{marker}-{U}"},
                },
                {"userId": user, "event": "Bought", "properties": {"marker": f"{marker}-{U}"}},
                # a command: the dispatcher tries SMTP with the password (transactional asset)
                {"userId": user, "event": "send_email", "assetId": "welcome"},
            ):
                action = "identify" if body["event"] == "identify" else "track"
                ids.append(_json(httpx.post(f"{base}/{action}", json=body, headers=h))["eventId"])
        b_event = ids[1]
        wait_landed(d, ids)
        pipeline_pass(d, env)
        b_profile = _json(httpx.get(f"{b_base}/profiles/userId:{b_user}/traits", headers=hb))
        meta = _json(httpx.get(f"{b_base}/profiles/userId:{b_user}/meta", headers=hb))
        reg = _json(
            httpx.post(
                f"{b_base}/regulations",
                json={"regulationType": "TRACK", "subject": {"type": "USER_ID", "ids": [b_user]}},
                headers=hb,
            )
        )
        b_events = _json(httpx.get(f"{b_base}/events/?size=100", headers=hb))["data"]
        b_ids = {
            "userId": b_user,
            "email": f"{b_user}@B.test",
            "id": str(b_profile["id"]),
            "subscription": str(meta["_subscriptionId"]),
            "eventId": b_event,
            "regulationId": str(reg["regulationId"]),
            "trait": f"B-{U}",
        }
        world = World(
            server,
            tokens,
            wk_a,
            creds["writeKey"],
            b_ids,
            {"traits": b_profile, "events": sorted(e["eventId"] for e in b_events)},
        )
        yield world
    finally:
        server.stop()


def fill(template: str, tenant: dict[str, str], b: dict[str, str], id_type: str) -> str:
    values = {
        **tenant,
        "profileId": f"{id_type}:{b[id_type]}",
        "eventId": b["eventId"],
        "regulationId": b["regulationId"],
        "name": "everyone",
        "action": "track",
    }

    def one(m: re.Match[str]) -> str:
        return values.get(m.group(1).split(":")[0], "x")

    return re.sub(r"\{([^}]+)\}", one, template)


def leaks(world: World, text: str, request: str) -> list[str]:
    """B's values in an answer that the request did not itself name."""
    return [v for v in world.b_ids.values() if v in text and v not in request]


CASES = [
    (m, p, scope, mode, id_type)
    for m, p in TENANT_ROUTES
    for scope in SCOPES
    for mode in ("their path", "my path")
    for id_type in (("userId", "email", "id") if "{profileId" in p else ("userId",))
]


@pytest.mark.parametrize(
    ("method", "template", "scope", "mode", "id_type"),
    CASES,
    ids=[f"{m} {p.split('/v1/')[-1]} {s} {mode} {i}" for m, p, s, mode, i in CASES],
)
def test_no_cross_tenant_read_or_write(
    world: World, method: str, template: str, scope: str, mode: str, id_type: str
) -> None:
    tenant = B if mode == "their path" else A
    path = fill(template, tenant, world.b_ids, id_type)
    headers = {"auth-token": world.tokens[scope], "content-type": "application/json"}
    body: Any = None
    if method == "POST":
        if path.endswith("/regulations"):
            # B's user in A's account: filed for A's account only (checked after the matrix).
            body = {
                "regulationType": "SUPPRESS",
                "subject": {"type": "USER_ID", "ids": [world.b_ids["userId"]]},
            }
        else:
            body = {"userId": world.b_ids["userId"], "event": "Cross", "traits": {"x": 1}}
    r = httpx.request(method, world.server.url + path, headers=headers, json=body, timeout=30)
    world.calls += 1
    world.answers.append(r.text)
    request = path + json.dumps(body)
    assert leaks(world, r.text, request) == [], f"{path}: {r.status_code} {r.text[:300]}"
    regulations = "/v1/regulations" in path
    if mode == "their path":
        assert r.status_code == 403, r.text
        return
    if regulations and scope not in ACCOUNT_WIDE:
        assert r.status_code == 403, r.text
        return
    if method == "POST":
        assert r.status_code == 200, r.text
        return
    names_b = any(f"{{{p}" in template for p in ("profileId", "eventId", "regulationId", "name"))
    if not names_b:
        # A's own lists: 200, and nothing of B's (checked above).
        assert r.status_code == 200, r.text
    else:
        # B's profile, event, regulation or its download, seen from A: not found.
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "not_found", r.text


def test_writekey_routes_store_for_the_key_s_tenant_only(world: World) -> None:
    """A's writeKey with a body that names B's tenant (root and context) stores for A."""
    from tests.conftest import landed_event_ids  # noqa: F401  (same landing files)

    basic = base64.b64encode(f"{world.write_key_a}:".encode()).decode()
    marker = f"wk-cross-{U}"
    ids = []
    kinds = dict(s="screen", a="alias", p="page", t="track", g="group", i="identify", b="batch")
    for route in sorted(WRITEKEY_ROUTES):
        last = route.rsplit("/", 1)[-1]
        kind = kinds.get(last, last)
        item: dict[str, Any] = {
            "type": "track" if kind == "batch" else kind,
            "userId": marker,
            "event": "Cross",
            "traits": {"x": 1},
            "groupId": "g",
            "previousId": "p",
            "name": "n",
            "context": {"clientId": "demo", "accountId": "demo", "brandId": "DEMO"},
            "clientId": "demo",
            "accountId": "demo",
            "brandId": "DEMO",
        }
        body: dict[str, Any] = {"batch": [item]} if kind == "batch" else item
        r = httpx.post(
            world.server.url + route,
            json=body,
            headers={"authorization": f"Basic {basic}"},
            timeout=30,
        )
        assert r.status_code == 200, (route, r.text)
        got = r.json()
        ids += [i for i in got.get("eventIds", [got.get("eventId")]) if i]
    wait_landed(world.server.data_dir, ids)
    import pyarrow.parquet as pq

    tenants = set()
    for f in world.server.data_dir.glob("landing/date=*/*.parquet"):
        t = pq.read_table(f, columns=["event_id", "client_id", "account_id", "brand_id"])
        for row in t.to_pylist():
            if row["event_id"] in set(ids):
                tenants.add((row["client_id"], row["account_id"], row["brand_id"]))
    assert tenants == {("acme", "shop", "SHOP")}, tenants


def test_b_untouched_after_the_matrix(world: World) -> None:
    """After every write of the matrix (tracks and identifies of B's userId in A's account, a
    suppression of it filed for A): B's profile and events are as before, and B's user is
    still admitted in B's account."""
    server = world.server
    hb = {"auth-token": world.tokens["b"]}
    b_base = f"{server.url}/track/demo/demo/DEMO/v1"
    r = httpx.post(
        f"{b_base}/track", json={"userId": world.b_ids["userId"], "event": "Still"}, headers=hb
    )
    assert r.status_code == 200 and r.json()["eventId"], r.text  # not suppressed in B
    wait_landed(server.data_dir, [r.json()["eventId"]])
    pipeline_pass(server.data_dir, server.env)
    traits = _json(
        httpx.get(f"{b_base}/profiles/userId:{world.b_ids['userId']}/traits", headers=hb)
    )
    assert traits == world.b_before["traits"]
    events = _json(httpx.get(f"{b_base}/events/?size=100", headers=hb))["data"]
    assert sorted(e["eventId"] for e in events) == sorted(
        [*world.b_before["events"], r.json()["eventId"]]
    )
    FIGURES.notes.append(
        f"isolation: {len(TENANT_ROUTES)} tenant routes x {len(SCOPES)} scopes x 2 modes"
        f" ({world.calls} calls) with B's ids: 0 of B's values in any answer; B's profile and"
        f" events unchanged, B's user still admitted"
    )


# --- secrets ----------------------------------------------------------------------------------


def _secrets(world: World) -> dict[str, str]:
    from mallard.paths import DataPaths
    from mallard.secret import ensure_secret

    out = {f"token {k}": v for k, v in world.tokens.items()}
    out |= {"writeKey A": world.write_key_a, "writeKey B": world.write_key_b}
    out |= {"SMTP password": SMTP_PASSWORD}
    out["HMAC secret"] = ensure_secret(DataPaths(world.server.data_dir))
    return out


def test_secrets_never_in_logs_answers_run_records_or_the_openapi(world: World) -> None:
    server = world.server
    found: list[str] = []
    texts: dict[str, bytes] = {"answers of the matrix": "\n".join(world.answers).encode()}
    texts["OpenAPI document"] = httpx.get(f"{server.url}/schema/openapi.json").content
    # Error bodies that echo what they refuse: a bad token, a bad writeKey.
    for headers in ({"auth-token": "x" + world.tokens["client"]},):
        r = httpx.get(f"{server.base}/events/", headers=headers)
        texts["401 body"] = r.content
    # Every file of the data dir but the stores that must hold a secret: the server secret's own
    # file, and the control store (writeKey values are kept to be shown on the preferences
    # resource; tokens only as hashes).
    allowed = {
        "secret.key",
        "control.sqlite",
        "control.sqlite-wal",
        "control.sqlite-shm",
        "demo-credentials.json",
    }
    files = 0
    for f in server.data_dir.rglob("*"):
        if not f.is_file() or f.is_symlink() or f.name in allowed:
            continue
        files += 1
        texts[str(f.relative_to(server.data_dir))] = f.read_bytes()
    dagster = [k for k in texts if "dagster" in k]
    assert dagster, "no Dagster run records found in the data dir"
    for where, data in texts.items():
        for what, value in _secrets(world).items():
            if what.startswith("writeKey") and where == "answers of the matrix":
                continue  # the preferences resource returns the writeKey (INTERFACE 2.6)
            if value.encode() in data:
                found.append(f"{what} in {where}")
    assert found == [], "\n".join(found)
    FIGURES.notes.append(
        f"secrets: {len(_secrets(world))} secrets searched in {files} files of the data dir"
        f" (server log, pipeline logs, {len(dagster)} Dagster files), the matrix's answers and"
        f" the OpenAPI document: none found"
    )


def test_the_smtp_password_was_really_used(world: World) -> None:
    """The dispatcher tried the SMTP server with it (else the search above proves little): the
    welcome emails were attempted and failed to connect, and the error kept names no password."""
    from mallard.paths import DataPaths

    with sqlite3.connect(DataPaths(world.server.data_dir).outbox_db) as c:
        rows = c.execute("select channel, attempts, last_error from sends").fetchall()
    emails = [r for r in rows if r[0] == "email"]
    assert emails and all(r[1] >= 1 for r in emails), rows
    assert all(SMTP_PASSWORD not in str(r[2]) for r in rows), rows


# --- constant-time comparison ----------------------------------------------------------------

# Names of secret values (a file's "signature" or an asset key are not secrets).
SECRET_NAMES = re.compile(
    r"(secret|token|password|passwd|digest|hmac|write_?key|auth_?key|api_?key|\bmac\b|\btag\b)",
    re.I,
)


def test_secrets_are_compared_in_constant_time() -> None:
    """No `==`/`!=` between a secret-named value and another in the request path's code; a
    token is looked up by its SHA-256 (a timing difference tells a hash prefix, not the
    secret), and signed values are checked with hmac.compare_digest."""
    offenders = []
    for pkg in ("mallard", "api", "collector", "orchestration"):
        for f in (REPO / pkg).rglob("*.py"):
            tree = ast.parse(f.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Compare):
                    continue
                if not any(isinstance(o, ast.Eq | ast.NotEq) for o in node.ops):
                    continue
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Constant) for s in sides):
                    continue  # against a literal: not a secret
                names = [ast.unparse(s) for s in sides]
                if all(SECRET_NAMES.search(n) for n in names):
                    offenders.append(f"{f.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == [], "\n".join(offenders)
    import inspect

    from mallard import tenancy

    source = inspect.getsource(tenancy.ControlStore.access)
    assert "_hash(secret)" in source, "tokens are to be looked up by their hash"
    from orchestration.delivery import email

    assert "compare_digest" in inspect.getsource(email)


# --- revocation on a running server ------------------------------------------------------------


def test_revocation_applies_on_a_server_idle_for_more_than_2_s(tmp_path: Path) -> None:
    """The request path's lookups are cached (ControlStore._snapshot, reloaded when the control
    store's generation counter moves): a revocation by another process after the server has
    been idle more than 2 s must still take effect at once. tests/integration/test_revocation.py
    checks the request that follows the revocation within milliseconds."""
    d = tmp_path / "data"
    creds = init_data_dir(d)
    server = Server(d, free_port(), creds, env={"MALLARD_RATE_BURST": "100000"})
    server.start()
    try:
        from tests.integration.test_revocation import (
            TRACK,
            revocable_credentials,
            use_until_cached,
        )

        token_id, wk, h, basic = revocable_credentials(d)
        track = TRACK
        use_until_cached(httpx, server, h, basic)
        import time

        time.sleep(2.5)  # idle (the once-a-second recheck of the snapshot is due again)
        assert httpx.post(f"{server.base}/track", json=track, headers=h).status_code == 200
        mallard("tokens", "revoke", token_id, data_dir=d)
        mallard("writekeys", "revoke", wk, data_dir=d)
        time.sleep(2.5)  # idle again: the cache must not outlive the revocation
        r = httpx.post(f"{server.base}/track", json=track, headers=h)
        assert r.status_code == 403 and r.json()["success"] is False, r.text
        r = httpx.get(f"{server.base}/events/", headers=h)
        assert r.status_code == 401 and r.json()["error"]["code"] == "authentication_error"
        r = httpx.post(f"{server.url}/v1/track", json=track, headers=basic)
        assert r.status_code == 403, r.text
        # The demo token is not affected.
        assert server.post("track", track).status_code == 200
    finally:
        server.stop()
