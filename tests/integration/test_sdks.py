"""Real client SDKs and the mobile/tag wire format against a real server:
@segment/analytics-node, segment-analytics-python and rudder-sdk-python change only their host;
mobile batches keep their order; text/plain and gzip bodies; writeKey from the body or Basic
auth; CORS; metrics; limits. One pipeline run serves every read-API assertion.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, Server, free_port, init_data_dir

NODE_DIR = REPO / "tests" / "node"
STD = "/cdp/events/std"
SINGLE_KINDS = ("identify", "track", "page", "screen", "group", "alias")


def basic(key: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{key}:".encode()).decode()}


def run_node_sdk(server: Server, write_key: str, prefix: str) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@segment" / "analytics-node").exists():
        pytest.fail("node or @segment/analytics-node missing: run `make test-deps`")
    proc = subprocess.run(
        [node, str(NODE_DIR / "send_segment.js"), server.url, write_key, prefix],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


def run_python_sdk(client_cls: Any, server: Server, write_key: str, prefix: str) -> None:
    errors: list[str] = []
    client = client_cls(
        write_key=write_key,
        host=server.url,
        sync_mode=True,
        max_retries=2,
        on_error=lambda e, batch: errors.append(repr(e)),
    )
    user = f"{prefix}-user"
    client.identify(user, {"email": f"{prefix}@example.com", "plan": prefix})
    client.track(user, f"{prefix.title()} Tracked", {"n": 1})
    client.page(user, "Docs", f"{prefix.title()} Page", {"p": 1})
    client.screen(user, "App", f"{prefix.title()} Screen")
    client.group(user, f"g-{prefix}", {"name": "Acme"})
    client.alias(f"{prefix}-anon", user)
    client.flush()
    assert not errors, errors


def post_std(server: Server, path: str, body: Any, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{STD}/{path}", content=content, timeout=30, **kw)


@pytest.fixture(scope="module")
def sdk_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from rudderstack.analytics.client import Client as RudderClient
    from segment.analytics.client import Client as SegmentClient

    d = tmp_path_factory.mktemp("sdks") / "data"
    creds = init_data_dir(d)
    server = Server(d, free_port(), creds, env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    server.start()
    wk = creds["writeKey"]
    try:
        node = run_node_sdk(server, wk, "node")
        run_python_sdk(SegmentClient, server, wk, "segpy")
        run_python_sdk(RudderClient, server, wk, "rudder")  # gzip bodies by default

        answers: dict[str, httpx.Response] = {}
        # The Segment HTTP API, one call per path, writeKey as the Basic user.
        for kind in SINGLE_KINDS:
            body: dict[str, Any] = {"userId": "raw-user"}
            body |= {
                "identify": {"traits": {"email": "raw@example.com"}},
                "track": {"event": "Raw Tracked", "messageId": "raw-dup-1"},
                "page": {"name": "Raw Page"},
                "screen": {"name": "Raw Screen"},
                "group": {"groupId": "g-raw"},
                "alias": {"previousId": "raw-anon"},
            }[kind]
            answers[kind] = httpx.post(
                f"{server.url}/v1/{kind}", json=body, headers=basic(wk), timeout=30
            )
        # A client retry: the same messageId again.
        answers["track-again"] = httpx.post(
            f"{server.url}/v1/track",
            json={"userId": "raw-user", "event": "Raw Tracked", "messageId": "raw-dup-1"},
            headers=basic(wk),
            timeout=30,
        )
        # Mobile: no timestamps, so only the order of the batch tells the events apart.
        mobile = [
            {"type": "track", "name": "App Opened", "userId": "mobile-user"},
            {"type": "screen", "name": "Home", "userId": "mobile-user"},
            {"type": "track", "event": "Item Viewed", "userId": "mobile-user"},
            {"type": "screen", "name": "Cart", "userId": "mobile-user"},
            {"type": "track", "event": "Checkout Started", "userId": "mobile-user"},
        ]
        answers["mobile"] = post_std(server, "mobile/batch", {"writeKey": wk, "batch": mobile})
        # The tag's wire format: text/plain JSON, writeKey in the body.
        answers["text"] = post_std(
            server,
            "t",
            {"writeKey": wk, "type": "track", "event": "Text Plain", "anonymousId": "wire-anon"},
            headers={"content-type": "text/plain"},
        )
        # gzip, writeKey as Basic user only.
        answers["gzip"] = post_std(
            server,
            "p",
            gzip.compress(json.dumps({"anonymousId": "wire-anon", "name": "Gzipped"}).encode()),
            headers={"content-encoding": "gzip", **basic(wk)},
        )
        # A tag batch with a batch-level sentAt.
        answers["tag-batch"] = post_std(
            server,
            "b",
            {
                "writeKey": wk,
                "sentAt": "2026-01-01T00:00:10Z",
                "batch": [
                    {
                        "type": "track",
                        "event": "Batched",
                        "anonymousId": "wire-anon",
                        "timestamp": "2026-01-01T00:00:00Z",
                    }
                ],
            },
        )
        server.pipeline()
        yield {"server": server, "creds": creds, "node": node, "answers": answers}
    finally:
        server.stop()


def profile_events(server: Server, user_id: str) -> list[dict[str, Any]]:
    r = server.get(f"profiles/userId:{user_id}/events", params={"size": 100, "sort": "asc"})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def actions(events: list[dict[str, Any]]) -> list[str]:
    return sorted(e["eventAction"] for e in events)


SDK_ACTIONS = ["alias", "group", "identify", "page", "screen"]


@pytest.mark.parametrize(
    ("prefix", "source"),
    [("node", "@segment/analytics-node"), ("segpy", "segment-python"), ("rudder", "rudder")],
)
def test_sdk_events_reach_the_read_api(sdk_run: dict[str, Any], prefix: str, source: str) -> None:
    server: Server = sdk_run["server"]
    events = profile_events(server, f"{prefix}-user")
    assert actions(events) == sorted([*SDK_ACTIONS, f"{prefix}_tracked"]), source
    assert all(e["source"] == "server" for e in events)
    track = next(e for e in events if e["eventAction"] == f"{prefix}_tracked")
    assert track["rawData"]["properties"] == {"n": 1}
    page = next(e for e in events if e["eventAction"] == "page")
    assert page["rawData"]["event"].endswith("Page")
    traits = server.get(f"profiles/userId:{prefix}-user/traits").json()
    assert traits["email"] == f"{prefix}@example.com"


def test_node_sdk_used_the_batch_endpoint(sdk_run: dict[str, Any]) -> None:
    assert sdk_run["node"] == {"errors": [], "requests": 1}


def test_segment_http_api_paths_answer_200_json(sdk_run: dict[str, Any]) -> None:
    for kind in SINGLE_KINDS:
        r = sdk_run["answers"][kind]
        assert r.status_code == 200, (kind, r.text)
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["success"] is True and r.json()["eventId"]
    events = profile_events(sdk_run["server"], "raw-user")
    # The retried track (same messageId) is kept once.
    assert actions(events) == ["alias", "group", "identify", "page", "raw_tracked", "screen"]


def test_mobile_batch_keeps_its_order(sdk_run: dict[str, Any]) -> None:
    answer = sdk_run["answers"]["mobile"]
    assert answer.status_code == 200 and len(answer.json()["eventIds"]) == 5
    events = profile_events(sdk_run["server"], "mobile-user")
    assert [e["rawData"]["event"] for e in events] == [
        "App Opened",
        "Home",
        "Item Viewed",
        "Cart",
        "Checkout Started",
    ]
    assert [e["eventAction"] for e in events][0] == "app_opened"
    assert {e["source"] for e in events} == {"mobile"}
    assert [e["eventId"] for e in events] == answer.json()["eventIds"]


def test_tag_wire_formats(sdk_run: dict[str, Any]) -> None:
    answers = sdk_run["answers"]
    for name in ("text", "gzip", "tag-batch"):
        assert answers[name].status_code == 200, (name, answers[name].text)
    r = sdk_run["server"].get("events/", params={"size": 100})
    wire = {
        e["rawData"]["event"]: e
        for e in r.json()["data"]
        if e["rawData"]["anonymousId"] == "wire-anon"
    }
    assert set(wire) == {"Text Plain", "Gzipped", "Batched"}
    assert wire["Gzipped"]["eventAction"] == "page"
    # The batch's sentAt corrects the item's clock: receipt - (sentAt - timestamp) = 10 s earlier.
    batched = wire["Batched"]
    gap = datetime.fromisoformat(batched["receivedTime"]) - datetime.fromisoformat(
        batched["eventTime"]
    )
    assert 9 <= gap.total_seconds() <= 11


# --- no pipeline needed below --------------------------------------------------------------


@pytest.fixture(scope="module")
def live(sdk_run: dict[str, Any]) -> tuple[Server, str]:
    return sdk_run["server"], sdk_run["creds"]["writeKey"]


def test_write_key_from_body_or_basic(live: tuple[Server, str]) -> None:
    server, wk = live
    event = {"type": "track", "event": "K", "anonymousId": "k"}
    assert post_std(server, "t", {**event, "writeKey": wk}).status_code == 200
    assert post_std(server, "t", event, headers=basic(wk)).status_code == 200
    # Basic with a password (some clients send one) still names the key as the user.
    auth = {"authorization": "Basic " + base64.b64encode(f"{wk}:x".encode()).decode()}
    assert post_std(server, "t", event, headers=auth).status_code == 200
    # The body's key is the one used when both are given.
    r = post_std(server, "t", {**event, "writeKey": "wk_not-a-key"}, headers=basic(wk))
    assert r.status_code == 403


@pytest.mark.parametrize(
    ("path", "headers", "body"),
    [
        (f"{STD}/t", {}, {"type": "track", "event": "E", "anonymousId": "a"}),
        (f"{STD}/t", None, {"type": "track", "event": "E", "anonymousId": "a", "writeKey": "wk_x"}),
        (f"{STD}/mobile/batch", {}, {"batch": [{"type": "track", "event": "E", "userId": "u"}]}),
        ("/v1/track", {"authorization": "Basic d2tfbm9wZTo="}, {"userId": "u", "event": "E"}),
        ("/v1/batch", {"authorization": "Bearer x"}, {"batch": [{"type": "page", "userId": "u"}]}),
    ],
)
def test_bad_or_missing_write_key_is_403_json(
    live: tuple[Server, str], path: str, headers: dict[str, str] | None, body: Any
) -> None:
    server, _ = live
    r = httpx.post(server.url + path, content=json.dumps(body), headers=headers or {}, timeout=30)
    assert r.status_code == 403
    assert r.json()["success"] is False and "writeKey" in r.json()["message"]


def test_cors_preflight(live: tuple[Server, str]) -> None:
    server, wk = live
    for path in (
        f"{STD}/t",
        f"{STD}/mobile/batch",
        f"/cdp/v1/projects/{wk}/settings",
        f"/cdp/analytics.js/v1/{wk}/analytics.min.js",
    ):
        r = httpx.options(
            server.url + path,
            headers={
                "origin": "http://shop.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization,content-type,x-retry-count",
            },
        )
        assert r.status_code == 204, path
        assert r.headers["access-control-allow-origin"] == "*"
        allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "content-type", "x-retry-count"} <= allowed
        assert int(r.headers["access-control-max-age"]) > 0
        assert "POST" in r.headers["access-control-allow-methods"]


@pytest.mark.parametrize(
    ("method", "path", "content", "status"),
    [
        ("POST", f"{STD}/t", b"{not json", 400),
        ("POST", f"{STD}/t", b'{"type":"track","event":"E","anonymousId":"a"}', 403),
        ("POST", f"{STD}/nope", b"{}", 404),
        ("GET", f"{STD}/t", None, 405),
        ("POST", f"{STD}/t", b'{"x":"' + b"y" * 40_000 + b'"}', 413),
    ],
)
def test_errors_carry_cors_headers(
    live: tuple[Server, str], method: str, path: str, content: bytes | None, status: int
) -> None:
    server, _ = live
    r = httpx.request(
        method, server.url + path, content=content, headers={"origin": "http://shop.example"}
    )
    assert r.status_code == status, r.text
    assert r.headers["access-control-allow-origin"] == "*"
    assert "retry-after" in r.headers["access-control-expose-headers"].lower()
    assert r.json()["success"] is False


def test_limits(live: tuple[Server, str]) -> None:
    server, wk = live
    big_call = {"writeKey": wk, "type": "track", "event": "E", "anonymousId": "a"}
    big_call["properties"] = {"x": "y" * 40_000}
    assert post_std(server, "t", big_call).status_code == 413
    item = {"type": "track", "event": "E", "anonymousId": "a", "properties": {"x": "y" * 30_000}}
    over_1mb = {"writeKey": wk, "batch": [item] * 40}
    assert post_std(server, "mobile/batch", over_1mb).status_code == 413
    # A small gzip body that inflates past 1 MB is refused, not decompressed whole.
    bomb = gzip.compress(b'{"writeKey":"' + wk.encode() + b'","batch":[' + b" " * 5_000_000)
    assert len(bomb) < 20_000
    r = post_std(server, "b", bomb, headers={"content-encoding": "gzip"})
    assert r.status_code == 413 and r.json()["success"] is False
    assert (
        post_std(server, "t", b"not gzip", headers={"content-encoding": "gzip"}).status_code == 400
    )


def test_metrics_are_accepted_and_stored_apart(live: tuple[Server, str]) -> None:
    server, _ = live
    series = {"series": [{"type": "Counter", "metric": "analytics_js.invoke", "value": 1}]}
    r = post_std(server, "m", series, headers={"content-type": "text/plain"})
    assert r.status_code == 200 and r.json()["success"] is True
    assert post_std(server, "m", b"garbage").status_code == 200
    lines = [
        json.loads(line)
        for f in (server.data_dir / "metrics").glob("*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert [m["series"] for m in lines] == [series["series"]]


def test_settings_point_the_tag_here(live: tuple[Server, str]) -> None:
    server, wk = live
    r = httpx.get(f"{server.url}/cdp/v1/projects/{wk}/settings")
    assert r.status_code == 200
    settings = r.json()
    assert set(settings["integrations"]) == {"Segment.io"}
    seg = settings["integrations"]["Segment.io"]
    assert seg["apiKey"] == wk and seg["protocol"] == "http"
    assert seg["apiHost"] == f"127.0.0.1:{server.port}{STD}"
    assert settings["remotePlugins"] == [] and settings["metrics"]["sampleRate"] == 0
    proxied = httpx.get(
        f"{server.url}/cdp/v1/projects/{wk}/settings",
        headers={"x-forwarded-proto": "https", "x-forwarded-host": "events.shop.example"},
    ).json()
    assert proxied["integrations"]["Segment.io"]["protocol"] == "https"
    assert proxied["integrations"]["Segment.io"]["apiHost"] == f"events.shop.example{STD}"
    assert proxied["metrics"]["host"] == f"events.shop.example{STD}"
    assert proxied["metrics"]["sampleRate"] > 0
    assert httpx.get(f"{server.url}/cdp/v1/projects/wk_unknown/settings").status_code == 404


def test_tag_assets(live: tuple[Server, str]) -> None:
    server, wk = live
    script = httpx.get(f"{server.url}/cdp/analytics.js/v1/{wk}/analytics.min.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert f'"{wk}"'.encode() in script.content  # like Segment's CDN, the key is embedded
    static = REPO / "collector" / "static" / "analytics-next"
    (version_dir,) = static.iterdir()
    assert (version_dir / "LICENSE.md").exists()
    chunks = {p.name.split(".")[-2]: p.name for p in version_dir.glob("*.bundle.*.js")}
    # Every chunk the entry script can request (its webpack map of content hashes) is served.
    chunk_map = re.search(rb'"\.bundle\."\+\{([^}]*)\}', script.content)
    assert chunk_map, "the chunk map of analytics.js was not found"
    wanted = re.findall(rb'"([0-9a-f]{20})"', chunk_map.group(1))
    assert wanted and {h.decode() for h in wanted} == set(chunks)
    for name in chunks.values():
        r = httpx.get(f"{server.url}/cdp/analytics-next/bundles/{name}")
        assert r.status_code == 200 and r.content == (version_dir / name).read_bytes()
    r = httpx.get(f"{server.url}/cdp/analytics-next/bundles/nope.js")
    assert r.status_code == 404


def test_rate_limit_per_write_key_is_exposed_to_the_tag(server_factory: Any) -> None:
    server = server_factory(env={"MALLARD_RATE_PER_SECOND": "0.01", "MALLARD_RATE_BURST": "2"})
    wk = server.creds["writeKey"]
    event = {"writeKey": wk, "type": "track", "event": "E", "anonymousId": "a"}
    statuses = [post_std(server, "t", event).status_code for _ in range(2)]
    assert statuses == [200, 200]
    r = post_std(server, "t", event, headers={"origin": "http://shop.example"})
    assert r.status_code == 429 and r.json()["success"] is False
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["access-control-allow-origin"] == "*"
    assert "retry-after" in r.headers["access-control-expose-headers"].lower()


def test_openapi_lists_the_client_routes(live: tuple[Server, str]) -> None:
    server, _ = live
    r = httpx.get(f"{server.url}/schema/openapi.json")
    assert r.status_code == 200, r.text
    paths = r.json()["paths"]
    for path in (f"{STD}/t", f"{STD}/mobile/batch", "/v1/batch", "/v1/identify"):
        assert "post" in paths[path]
