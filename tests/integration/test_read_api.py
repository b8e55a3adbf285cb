"""Read API over HTTP against a real server and a real pipeline.

One pipeline run, shared by the module, builds a rich lake; expected answers come from a Python
oracle of what was sent. The last tests change the warehouse (a second run), so they stay last.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.params import decode_scroll, encode_scroll
from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.maintenance import maintain
from tests.conftest import Server, free_port, init_data_dir, mallard, wait_landed

CLIENT, ACCOUNT, BRAND, OTHER_BRAND = "acme", "shop", "SHOP", "OUTLET"
DAY0 = datetime(2026, 3, 1, tzinfo=UTC)
HEAVY_EVENTS = 250  # > 100: paging and scrolling of one customer are real
FILLERS = 120  # > 100 customers: the profile list needs a scrollId
ACTIONS = ("Product Viewed", "Added To Cart", "Order Completed")


def snake(name: str) -> str:
    return name.lower().replace(" ", "_")


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


@dataclass
class Sent:
    """The oracle: every event accepted, as the read API must show it."""

    events: list[dict[str, Any]] = field(default_factory=list)  # eventId, user, action, time, brand

    def of(self, brand: str = BRAND, users: set[str] | None = None) -> list[dict[str, Any]]:
        rows = [e for e in self.events if e["brand"] == brand]
        if users is not None:
            rows = [e for e in rows if e["user"] in users]
        return rows


def newest_first(rows: list[dict[str, Any]]) -> list[str]:
    return [
        e["eventId"] for e in sorted(rows, key=lambda e: (e["time"], e["eventId"]), reverse=True)
    ]


@dataclass
class Lake:
    server: Server
    tokens: dict[str, str]
    sent: Sent
    last_send_started: datetime

    def base(self, brand: str = BRAND) -> str:
        return f"{self.server.url}/track/{CLIENT}/{ACCOUNT}/{brand}/v1"


class Batches:
    """Messages sent in batches of 100, recorded in the oracle with the eventIds returned."""

    def __init__(self, server: Server, token: str, sent: Sent) -> None:
        self.server, self.token, self.sent = server, token, sent
        self.pending: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        self.ids: list[str] = []

    def add(self, brand: str, msg: dict[str, Any], user: str, action: str, t: datetime) -> None:
        msg = {**msg, "timestamp": iso(t)}
        self.pending.setdefault(brand, []).append(
            (msg, {"user": user, "action": action, "time": iso(t), "brand": brand})
        )
        if len(self.pending[brand]) >= 100:
            self.flush(brand)

    def flush(self, brand: str | None = None) -> None:
        for b in [brand] if brand else list(self.pending):
            items = self.pending.pop(b, [])
            if not items:
                continue
            r = httpx.post(
                f"{self.server.url}/track/{CLIENT}/{ACCOUNT}/{b}/v1/batch",
                json={"batch": [m for m, _ in items]},
                headers={"auth-token": self.token},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            ids = r.json()["eventIds"]
            assert len(ids) == len(items)
            for event_id, (_, rec) in zip(ids, items, strict=True):
                self.sent.events.append({**rec, "eventId": event_id})
            self.ids += ids


def send_dataset(server: Server, token: str, sent: Sent) -> list[str]:
    b = Batches(server, token, sent)
    t = DAY0

    def tick(minutes: int = 7) -> datetime:
        nonlocal t
        t += timedelta(minutes=minutes)
        return t

    def identify(user: str, traits: dict[str, Any], brand: str = BRAND, **kw: Any) -> None:
        msg = {"type": "identify", "event": "identify", "userId": user, "traits": traits, **kw}
        b.add(brand, msg, user, "identify", tick())

    def track(user: str, event: str, brand: str = BRAND, anon: str | None = None) -> None:
        who = {"anonymousId": anon} if anon else {"userId": user}
        msg = {"type": "track", "event": event, **who, "properties": {"sku": f"s-{len(b.ids)}"}}
        b.add(brand, msg, user, snake(event), tick())

    # An anonymous visitor who becomes alice, and one who never identifies.
    b.add(
        BRAND,
        {"type": "page", "event": "page", "anonymousId": "anon-a1"},
        "u-alice",
        "page",
        tick(),
    )
    b.add(
        BRAND,
        {"type": "page", "event": "page", "anonymousId": "anon-v1"},
        "anon-v1",
        "page",
        tick(),
    )
    identify("u-alice", {"email": "Shared@Example.com", "plan": "pro"}, anonymousId="anon-a1")
    identify("u-bob", {"email": "shared@example.COM", "plan": "free"})
    identify("u-carol", {"email": "carol@example.com", "firstName": "Carol", "lastName": "C"})
    identify("u-heavy", {"email": "heavy@example.com"})
    for i in range(80):
        track("u-alice", ACTIONS[i % 3])
        if i < 70:
            track("u-bob", ACTIONS[(i + 1) % 3])
    for i in range(HEAVY_EVENTS):
        track("u-heavy", ACTIONS[i % 3])
    for i in range(FILLERS):
        identify(f"u-f{i:03d}", {"email": f"f{i}@example.com", "n": i})
    for event in ("Logged In", "Order Completed", "Logged In"):
        track("u-carol", event, brand=OTHER_BRAND)
    track("anon-v1", "Product Viewed", anon="anon-v1")
    b.flush()
    return b.ids


def token(data_dir: Path, scope: str) -> str:
    out = mallard("tokens", "create", "--scope", scope, "--json", data_dir=data_dir)
    return str(json.loads(out.stdout)["token"])


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    d = tmp_path_factory.mktemp("read_api") / "data"
    creds = init_data_dir(d)
    mallard(
        "accounts", "add", CLIENT, ACCOUNT, "--brand", BRAND, "--brand", OTHER_BRAND, data_dir=d
    )
    tokens = {
        "account": token(d, f"brands:{CLIENT}/{ACCOUNT}"),
        "outlet": token(d, f"brand:{CLIENT}/{ACCOUNT}/{OTHER_BRAND}"),
    }
    # The rate limit has its own test; here a tight read loop must not trip it.
    fast = {"MALLARD_RATE_PER_SECOND": "100000", "MALLARD_RATE_BURST": "100000"}
    srv = Server(d, free_port(), creds, env={"MALLARD_ROLL_INTERVAL_S": "0.3", **fast})
    srv.start()
    try:
        sent = Sent()
        started = datetime.now(UTC)
        ids = send_dataset(srv, tokens["account"], sent)
        wait_landed(d, ids)
        srv.pipeline()
        yield Lake(srv, tokens, sent, started)
    finally:
        srv.stop()


class Checked(httpx.Client):
    """A client that fails the test on any read answer without a request id or freshness."""

    def __init__(self, tok: str) -> None:
        super().__init__(
            headers={"auth-token": tok, "content-type": "application/json"},
            timeout=30,
            event_hooks={"response": [self._check]},
        )

    @staticmethod
    def _check(r: httpx.Response) -> None:
        assert r.headers.get("x-mallard-RequestId"), (r.request.url, dict(r.headers))
        if r.request.url.path.startswith("/track/"):
            assert "x-mallard-data-through" in r.headers, (r.request.url, dict(r.headers))
            assert r.headers.get("x-mallard-snapshot"), (r.request.url, dict(r.headers))
        assert "json" in r.headers["content-type"], r.headers


@pytest.fixture(scope="module")
def api(lake: Lake) -> Iterator[Checked]:
    with Checked(lake.tokens["account"]) as c:
        yield c


def get(api: Checked, lake: Lake, path: str, **params: Any) -> httpx.Response:
    return api.get(f"{lake.base()}/{path}", params=params)


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, (r.request.url, r.status_code, r.text)
    return r.json()


def error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, (r.request.url, r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return str(body["error"]["message"])


def event_ids(body: dict[str, Any]) -> list[str]:
    return [e["eventId"] for e in body["data"]]


# --- events list (4.3) ----------------------------------------------------------------------


def test_health_says_whether_answers_come_from_the_read_index(api: Checked, lake: Lake) -> None:
    ok(get(api, lake, "events/", size=1))  # a read of the current snapshot
    status = httpx.get(f"{lake.server.url}/health", timeout=10).json()["readIndex"]
    current = get(api, lake, "events/", size=1).headers["x-mallard-snapshot"]
    assert status["indexed"] is True and str(status["snapshot"]) == current
    assert status["servingSnapshot"] == status["snapshot"] and status["building"] is False


def test_events_default_newest_first_page_of_100(api: Checked, lake: Lake) -> None:
    body = ok(get(api, lake, "events/"))
    assert set(body) == {"data"}
    assert event_ids(body) == newest_first(lake.sent.of())[:100]
    first = body["data"][0]
    for key in (
        "id",
        "customerId",
        "userId",
        "externalId",
        "email",
        "eventId",
        "eventTime",
        "receivedTime",
        "eventAction",
        "clientId",
        "accountId",
        "brandId",
        "source",
        "rawData",
    ):
        assert key in first, key
    assert (first["clientId"], first["accountId"], first["brandId"]) == (CLIENT, ACCOUNT, BRAND)
    # Without the trailing slash too.
    assert event_ids(ok(get(api, lake, "events"))) == event_ids(body)


def test_events_sort_and_from_size_paging(api: Checked, lake: Lake) -> None:
    want = newest_first(lake.sent.of())
    asc = event_ids(ok(get(api, lake, "events/", sort="asc", size=100)))
    assert asc == list(reversed(want))[:100]
    assert event_ids(ok(get(api, lake, "events/", sort="desc", size=1))) == want[:1]
    pages: list[str] = []
    for start in range(0, len(want) + 37, 37):
        pages += event_ids(ok(get(api, lake, "events/", **{"from": start, "size": 37})))
    assert pages == want  # no gap, no duplicate


def test_events_size_and_depth_bounds(api: Checked, lake: Lake) -> None:
    assert len(ok(get(api, lake, "events/", size=1))["data"]) == 1
    assert len(ok(get(api, lake, "events/", size=100))["data"]) == 100
    for size in (0, 101, -1, "abc"):
        error(get(api, lake, "events/", size=size), 400, "invalid_request_error")
    assert ok(get(api, lake, "events/", **{"from": 9900, "size": 100}))["data"] == []
    assert "10000" in error(
        get(api, lake, "events/", **{"from": 10_000, "size": 1}), 400, "invalid_request_error"
    )
    error(get(api, lake, "events/", **{"from": -1}), 400, "invalid_request_error")
    error(get(api, lake, "events/", **{"from": "x"}), 400, "invalid_request_error")


def test_events_include_and_exclude(api: Checked, lake: Lake) -> None:
    rows = lake.sent.of()
    got = ok(get(api, lake, "events/", include="order_completed", size=100))["data"]
    assert [e["eventId"] for e in got] == newest_first(
        [e for e in rows if e["action"] == "order_completed"]
    )[:100]
    assert {e["eventAction"] for e in got} == {"order_completed"}
    assert ok(get(api, lake, "events/", include="never_happened"))["data"] == []

    dropped = {"product_viewed", "added_to_cart"}
    got = ok(get(api, lake, "events/", exclude="product_viewed, added_to_cart", size=100))["data"]
    assert [e["eventId"] for e in got] == newest_first(
        [e for e in rows if e["action"] not in dropped]
    )[:100]
    assert not {e["eventAction"] for e in got} & dropped


def test_events_start_end_dates_and_datetimes(api: Checked, lake: Lake) -> None:
    rows = lake.sent.of()

    def expect(lo: datetime | None, hi: datetime | None) -> list[str]:
        return newest_first(
            [
                e
                for e in rows
                if (lo is None or e["time"] > iso(lo)) and (hi is None or e["time"] < iso(hi))
            ]
        )

    day1, day2 = DAY0 + timedelta(days=1), DAY0 + timedelta(days=2)
    assert expect(day1, day2), "the dataset must span several days"
    for start, end, lo, hi in [
        ("2026-03-02", "2026-03-03", day1, day2),
        ("2026-03-02", None, day1, None),
        (None, "2026-03-02", None, day1),
        (
            "2026-03-02T06:30:00Z",
            "2026-03-02T18:00:00Z",
            day1 + timedelta(hours=6.5),
            day1 + timedelta(hours=18),
        ),
        (
            "2026-03-02T07:30:00+01:00",
            "2026-03-02T12:00:00.000+00:00",
            day1 + timedelta(hours=6.5),
            day1 + timedelta(hours=12),
        ),
        ("2026-03-02T06:30:00", None, day1 + timedelta(hours=6.5), None),  # naive means UTC
    ]:
        params = {k: v for k, v in {"start": start, "end": end, "size": 100}.items() if v}
        got = event_ids(ok(get(api, lake, "events/", **params)))
        assert got == expect(lo, hi)[:100], params
        asc = event_ids(ok(get(api, lake, "events/", sort="asc", **params)))
        assert asc == list(reversed(expect(lo, hi)))[:100], params
    for bad in (
        {"start": "yesterday"},
        {"end": "2026-13-01"},
        {"start": "2026-03-03", "end": "2026-03-02"},
    ):
        error(get(api, lake, "events/", **bad), 400, "invalid_request_error")


def test_events_are_per_brand(api: Checked, lake: Lake) -> None:
    outlet = ok(api.get(f"{lake.base(OTHER_BRAND)}/events/"))["data"]
    assert [e["eventId"] for e in outlet] == newest_first(lake.sent.of(OTHER_BRAND))
    assert {e["brandId"] for e in outlet} == {OTHER_BRAND}
    shop = event_ids(ok(get(api, lake, "events/", size=100)))
    assert not set(shop) & {e["eventId"] for e in outlet}


def test_unknown_query_parameter_is_refused(api: Checked, lake: Lake) -> None:
    msg = error(get(api, lake, "events/", limit=5), 400, "invalid_request_error")
    assert "limit" in msg
    error(get(api, lake, "events/", sort="sideways"), 400, "invalid_request_error")
    error(get(api, lake, "profiles/userId:u-alice/traits", size=5), 400, "invalid_request_error")


# --- profiles (4.4) -------------------------------------------------------------------------


def test_traits_by_user_id_and_id_are_the_object(api: Checked, lake: Lake) -> None:
    alice = ok(get(api, lake, "profiles/userId:u-alice/traits"))
    assert alice["email"] == "Shared@Example.com" and alice["plan"] == "pro"
    assert alice["externalId"] == "u-alice" and alice["id"]
    assert "marketingPreferences" in alice
    assert ok(get(api, lake, f"profiles/id:{alice['id']}/traits")) == alice
    carol = ok(get(api, lake, "profiles/userId:u-carol/traits"))
    assert carol["name"] == "Carol C"


def test_traits_by_email_lists_every_customer_case_insensitively(api: Checked, lake: Lake) -> None:
    for spelled in ("shared@example.com", "SHARED@EXAMPLE.COM", "Shared@Example.com"):
        body = ok(get(api, lake, f"profiles/email:{spelled}/traits"))
        assert set(body) == {"data"}
        assert sorted(p["externalId"] for p in body["data"]) == ["u-alice", "u-bob"]
    one = ok(get(api, lake, "profiles/email:carol@example.com/traits"))
    assert [p["externalId"] for p in one["data"]] == ["u-carol"]


def test_meta_and_metadata_are_the_same(api: Checked, lake: Lake) -> None:
    meta = ok(get(api, lake, "profiles/userId:u-alice/meta"))
    assert ok(get(api, lake, "profiles/userId:u-alice/metadata")) == meta
    for key in (
        "_subscriptionId",
        "createdBy",
        "firstEvent",
        "lastEvent",
        "audiencesStatic",
        "lastActivityTime",
        "id",
        "marketingPreferences",
    ):
        assert key in meta, key
    assert meta["plan"] == "pro"  # the traits are part of the metadata
    assert set(meta["firstEvent"]) >= {"identify", "page", *map(snake, ACTIONS)}
    by_email = ok(get(api, lake, "profiles/email:SHARED@example.com/metadata"))
    assert sorted(m["externalId"] for m in by_email["data"]) == ["u-alice", "u-bob"]
    assert ok(get(api, lake, f"profiles/id:{meta['id']}/meta")) == meta


def test_as_of_answers_as_things_stood(api: Checked, lake: Lake) -> None:
    """anon-a1 viewed a page, then identified as alice; bob took the same email after. As of the
    page the visitor is a profile of its own and the page its event; as of alice's identify the
    page is alice's, with her email, and the email finds only her."""
    [page] = [e for e in lake.sent.of(users={"u-alice"}) if e["action"] == "page"]
    identify = min(e["time"] for e in lake.sent.of(users={"u-alice"}) if e["action"] == "identify")
    alice = ok(get(api, lake, "profiles/userId:u-alice/traits"))

    events = ok(get(api, lake, "events/", asOf=page["time"], sort="asc"))["data"]
    assert [e["eventId"] for e in events] == [page["eventId"]]  # the first event of all
    visitor = events[0]["customerId"]
    assert visitor != alice["id"] and events[0]["userId"] is None and events[0]["email"] is None
    assert ok(get(api, lake, f"profiles/id:{visitor}/traits", asOf=page["time"])) == {
        "externalId": None,
        "id": visitor,
    }
    error(get(api, lake, "profiles/userId:u-alice/traits", asOf=page["time"]), 404, "not_found")

    then = ok(get(api, lake, "profiles/userId:u-alice/traits", asOf=identify))
    assert then == {
        "email": "Shared@Example.com",
        "externalId": "u-alice",
        "id": alice["id"],
        "plan": "pro",
    }
    assert ok(get(api, lake, "profiles/userId:u-alice/metadata", asOf=identify)) == then
    error(get(api, lake, f"profiles/id:{visitor}/traits", asOf=identify), 404, "not_found")
    by_email = ok(get(api, lake, "profiles/email:SHARED@example.com/traits", asOf=identify))
    assert by_email == {"data": [then]}
    events = ok(get(api, lake, "events/", asOf=identify, sort="asc"))["data"]
    assert events[0]["eventId"] == page["eventId"]
    assert (events[0]["customerId"], events[0]["userId"], events[0]["email"]) == (
        alice["id"],
        "u-alice",
        "Shared@Example.com",
    )
    assert {e["eventId"] for e in events} == {
        e["eventId"] for e in lake.sent.of() if e["time"] <= identify
    }
    # Far ahead: the current traits, but for marketingPreferences (the preferences' own rules).
    now = ok(get(api, lake, "profiles/userId:u-alice/traits", asOf="2100-01-01"))
    assert now == {k: v for k, v in alice.items() if k != "marketingPreferences"}


def test_a_bad_as_of_is_refused(api: Checked, lake: Lake) -> None:
    for bad in ("yesterday", "2026-13-01", "", "2026-03-01T25:00:00Z"):
        for path in ("profiles/userId:u-alice/traits", "profiles/userId:u-alice/meta", "events/"):
            msg = error(get(api, lake, path, asOf=bad), 400, "invalid_request_error")
            assert msg.startswith('"asOf" must be an ISO-8601 date or date-time'), msg
    # The profile events take no asOf (an account's events list does).
    msg = error(
        get(api, lake, "profiles/userId:u-alice/events", asOf="2026-03-02"),
        400,
        "invalid_request_error",
    )
    assert msg.startswith("unknown query parameter asOf"), msg


def test_external_ids(api: Checked, lake: Lake) -> None:
    body = ok(get(api, lake, "profiles/userId:u-alice/external_ids"))
    pairs = {(x["type"], x["id"]) for x in body["data"]}
    assert ("userId", "u-alice") in pairs and ("anonymousId", "anon-a1") in pairs
    shared = ok(get(api, lake, "profiles/email:shared@example.com/external_ids"))
    assert {x["id"] for x in shared["data"] if x["type"] == "userId"} == {"u-alice", "u-bob"}


def test_anonymous_visitor_is_a_profile(api: Checked, lake: Lake) -> None:
    page = ok(get(api, lake, "profiles", size=100))
    everyone = collect_profiles(api, lake)
    visitor = [p for p in everyone if not p.get("externalId")]
    assert len(visitor) == 1  # anon-v1; anon-a1 became alice
    events = ok(get(api, lake, f"profiles/id:{visitor[0]['id']}/events"))
    assert {e["eventAction"] for e in events["data"]} == {"page", "product_viewed"}
    assert page["data"]


def scroll_events(api: Checked, lake: Lake, profile: str, **params: Any) -> list[list[str]]:
    pages = []
    body = ok(get(api, lake, f"profiles/{profile}/events", **params))
    while True:
        assert set(body) == {"scrollId", "data"}
        pages.append(event_ids(body))
        if not body["data"]:
            return pages
        body = ok(get(api, lake, f"profiles/{profile}/events", scrollId=body["scrollId"]))


def test_profile_events_page_and_scroll_to_the_end(api: Checked, lake: Lake) -> None:
    want = newest_first(lake.sent.of(users={"u-heavy"}))
    assert len(want) > 200
    pages = scroll_events(api, lake, "userId:u-heavy")
    assert [len(p) for p in pages] == [100, 100, len(want) - 200, 0]
    assert [i for p in pages for i in p] == want
    first = ok(get(api, lake, "profiles/userId:u-heavy/events", size=1))
    assert event_ids(first) == want[:1]
    asc = scroll_events(api, lake, "userId:u-heavy", sort="asc", size=60, include="order_completed")
    assert [i for p in asc for i in p] == list(
        reversed(
            newest_first(
                [e for e in lake.sent.of(users={"u-heavy"}) if e["action"] == "order_completed"]
            )
        )
    )
    assert (
        event_ids(
            ok(get(api, lake, "profiles/userId:u-heavy/events", **{"from": 240, "size": 100}))
        )
        == want[240:]
    )
    error(get(api, lake, "profiles/userId:u-heavy/events", size=101), 400, "invalid_request_error")
    error(get(api, lake, "profiles/userId:u-heavy/events", size=0), 400, "invalid_request_error")
    error(
        get(api, lake, "profiles/userId:u-heavy/events", **{"from": 9901, "size": 100}),
        400,
        "invalid_request_error",
    )


def test_profile_events_by_email_span_every_customer(api: Checked, lake: Lake) -> None:
    want = newest_first(lake.sent.of(users={"u-alice", "u-bob"}))
    pages = scroll_events(api, lake, "email:SHARED@example.com", size=40)
    got = [i for p in pages for i in p]
    assert got == want and len(set(got)) == len(got)
    assert all(len(p) == 40 for p in pages[:-2]) and pages[-1] == []
    window = scroll_events(
        api, lake, "email:shared@example.com", start="2026-03-01T06:00:00Z", exclude="added_to_cart"
    )
    assert [i for p in window for i in p] == newest_first(
        [
            e
            for e in lake.sent.of(users={"u-alice", "u-bob"})
            if e["time"] > "2026-03-01T06:00:00.000Z" and e["action"] != "added_to_cart"
        ]
    )


def collect_profiles(api: Checked, lake: Lake, **params: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    body = ok(get(api, lake, "profiles", **params))
    while True:
        assert set(body) == {"scrollId", "data"}
        out += body["data"]
        if not body["data"]:
            return out
        body = ok(get(api, lake, "profiles", scrollId=body["scrollId"]))


def lake_customer_ids(lake: Lake) -> set[str]:
    conn = connect(DataPaths(lake.server.data_dir), read_only=True)
    try:
        rows = conn.execute(
            "select customer_id from lake.marts.customer_profiles where account_id = ?", [ACCOUNT]
        ).fetchall()
        return {r[0] for r in rows}
    finally:
        conn.close()


def test_profile_list_scrolls_to_the_end(api: Checked, lake: Lake) -> None:
    first = ok(get(api, lake, "profiles"))
    assert len(first["data"]) == 100 and first["scrollId"]
    everyone = collect_profiles(api, lake)
    ids = [p["id"] for p in everyone]
    assert len(ids) == len(set(ids))  # no duplicates
    assert set(ids) == lake_customer_ids(lake)  # no gaps
    named = {p["externalId"] for p in everyone if p.get("externalId")}
    assert named == {"u-alice", "u-bob", "u-carol", "u-heavy"} | {
        f"u-f{i:03d}" for i in range(FILLERS)
    }
    assert len(ids) == len(named) + 1  # and the one anonymous visitor
    # from/size on the first page, then the scroll goes on from there.
    page = ok(get(api, lake, "profiles", **{"from": 5, "size": 10}))
    assert [p["id"] for p in page["data"]] == ids[5:15]
    nxt = ok(get(api, lake, "profiles", scrollId=page["scrollId"]))
    assert [p["id"] for p in nxt["data"]] == ids[15:25]
    small = collect_profiles(api, lake, size=1)
    assert [p["id"] for p in small] == ids
    for params in ({"size": 0}, {"size": 101}, {"from": 10_000, "size": 1}, {"from": -1}):
        error(get(api, lake, "profiles", **params), 400, "invalid_request_error")
    assert ok(get(api, lake, "profiles", **{"from": 9_900, "size": 100}))["data"] == []


# --- errors (7) -----------------------------------------------------------------------------


def test_validation_and_not_found_errors(api: Checked, lake: Lake) -> None:
    for bad in ("u-alice", "phone:123", "userId:", ":x"):
        error(get(api, lake, f"profiles/{bad}/traits"), 400, "validation_error")
        error(get(api, lake, f"profiles/{bad}/events"), 400, "validation_error")
    for endpoint in ("traits", "meta", "metadata", "events", "external_ids"):
        error(get(api, lake, f"profiles/userId:nobody/{endpoint}"), 404, "not_found")
        error(get(api, lake, f"profiles/email:nobody@example.com/{endpoint}"), 404, "not_found")
    error(get(api, lake, "profiles/userId:u-alice/nonsense"), 404, "not_found")
    error(get(api, lake, "nonsense/deeper/path"), 404, "not_found")


def test_framework_errors_are_json(lake: Lake) -> None:
    with Checked(lake.tokens["account"]) as c:
        error(c.delete(f"{lake.base()}/profiles"), 405, "invalid_request_error")
        error(c.put(f"{lake.base()}/events/"), 405, "invalid_request_error")
        r = c.get(f"{lake.server.url}/no/such/route")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_scroll_ids_are_checked(api: Checked, lake: Lake) -> None:
    error(get(api, lake, "profiles", scrollId="not-a-scroll"), 400, "invalid_request_error")
    profiles_scroll = ok(get(api, lake, "profiles", size=2))["scrollId"]
    events_scroll = ok(get(api, lake, "profiles/userId:u-heavy/events", size=2))["scrollId"]
    # A scrollId belongs to its own list.
    error(
        get(api, lake, "profiles/userId:u-heavy/events", scrollId=profiles_scroll),
        400,
        "invalid_request_error",
    )
    error(
        get(api, lake, "profiles/userId:u-alice/events", scrollId=events_scroll),
        400,
        "invalid_request_error",
    )
    error(get(api, lake, "profiles", scrollId=events_scroll), 400, "invalid_request_error")


def test_authentication_and_scope(lake: Lake) -> None:
    url = f"{lake.base()}/events/"
    r = httpx.get(url)
    error(r, 401, "authentication_error")
    assert r.headers.get("x-mallard-RequestId") and "x-mallard-data-through" in r.headers
    error(httpx.get(url, headers={"auth-token": "mlt_not_a_token"}), 401, "authentication_error")
    outlet = {"auth-token": lake.tokens["outlet"]}
    for path in ("events/", "profiles", "profiles/userId:u-alice/traits"):
        error(httpx.get(f"{lake.base()}/{path}", headers=outlet), 403, "authentication_error")
    assert httpx.get(f"{lake.base(OTHER_BRAND)}/events/", headers=outlet).status_code == 200
    error(
        httpx.get(f"{lake.server.url}/track/{CLIENT}/nope/NOPE/v1/events/", headers=outlet),
        403,
        "authentication_error",
    )


def test_freshness_header_is_the_last_load(api: Checked, lake: Lake) -> None:
    r = get(api, lake, "events/", size=1)
    through = datetime.fromisoformat(r.headers["x-mallard-data-through"].replace("Z", "+00:00"))
    built = datetime.fromisoformat(r.headers["x-mallard-built-at"].replace("Z", "+00:00"))
    assert lake.last_send_started <= through <= built <= datetime.now(UTC)
    # Errors carry it too (checked by the client), and agree with answers on the same data.
    e = get(api, lake, "profiles/userId:nobody/traits")
    assert e.headers["x-mallard-data-through"] == r.headers["x-mallard-data-through"]


def test_rate_limit_gives_429_with_retry_after(server_factory: Any) -> None:
    srv = server_factory(env={"MALLARD_RATE_PER_SECOND": "0.5", "MALLARD_RATE_BURST": "3"})
    url = f"{srv.base}/events/"
    statuses = [httpx.get(url, headers=srv.headers).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    r = httpx.get(url, headers=srv.headers)
    error(r, 429, "rate_limit_error")
    assert int(r.headers["Retry-After"]) >= 1
    assert r.headers.get("x-mallard-RequestId") and "x-mallard-snapshot" in r.headers


def test_internal_error_is_json(tmp_path: Path) -> None:
    d = tmp_path / "data"
    creds = init_data_dir(d)
    # A corrupt lake catalog: every read fails inside the server, not in the caller's request.
    DataPaths(d).lake_catalog.parent.mkdir(parents=True, exist_ok=True)
    DataPaths(d).lake_catalog.write_bytes(b"this is not a SQLite database\n" * 200)
    srv = Server(d, free_port(), creds)
    srv.start()
    try:
        for path in ("events/", "profiles/userId:x/traits", "profiles"):
            r = srv.get(path)
            error(r, 500, "internal_server_error")
            assert r.headers.get("x-mallard-RequestId")
            assert "catalog" not in r.text.lower()  # internals stay in the log
        assert srv.log is not None and "Traceback" in srv.log.read_text()
    finally:
        srv.stop()


# --- OpenAPI --------------------------------------------------------------------------------

DOCUMENTED = {
    "listEvents": {"include", "exclude", "start", "end", "sort", "from", "size", "asOf"},
    "listProfiles": {"from", "size", "scrollId"},
    "getProfileTraits": {"asOf"},
    "getProfileMeta": {"asOf"},
    "getProfileMetadata": {"asOf"},
    "getProfileExternalIds": set(),
    "getProfileEvents": {"include", "exclude", "start", "end", "sort", "from", "size", "scrollId"},
}
VALID = {
    "include": "order_completed",
    "exclude": "page,identify",
    "start": "2026-03-01",
    "end": "2026-03-09T00:00:00Z",
    "sort": "asc",
    "from": "1",
    "size": "5",
    "asOf": "2026-03-02T00:00:00Z",
}


def test_openapi_documents_what_the_handlers_accept(api: Checked, lake: Lake) -> None:
    doc = ok(api.get(f"{lake.server.url}/schema/openapi.json"))
    ops = {
        op["operationId"]: (path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method == "get" and op.get("operationId") in DOCUMENTED
    }
    assert set(ops) == set(DOCUMENTED)
    for op_id, (path, op) in ops.items():
        params = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}
        assert set(params) == DOCUMENTED[op_id], op_id
        for status in ("200", "400", "401", "403", "429", "500"):
            assert status in op["responses"], (op_id, status)
        for status, resp in op["responses"].items():
            if status != "200":
                ref = resp["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorBody"), (op_id, status)
        if op_id.startswith("getProfile"):
            assert "404" in op["responses"], op_id
        if "size" in params:
            assert (params["size"]["schema"]["minimum"], params["size"]["schema"]["maximum"]) == (
                1,
                100,
            )
        if "sort" in params:
            assert set(params["sort"]["schema"]["enum"]) == {"asc", "desc"}

        # What is documented is accepted, and nothing else is.
        concrete = (
            path.replace("{clientId}", CLIENT)
            .replace("{accountId}", ACCOUNT)
            .replace("{BRANDID}", BRAND)
            .replace("{profileId}", "userId:u-heavy")
        )
        url = lake.server.url + concrete
        for name in params:
            value = VALID.get(name)
            if name == "scrollId":
                value = ok(api.get(url, params={"size": 2}))["scrollId"]
            ok(api.get(url, params={name: value}))
        msg = error(api.get(url, params={"undocumented": "1"}), 400, "invalid_request_error")
        assert "undocumented" in msg
    schemas = doc["components"]["schemas"]
    assert set(schemas["ErrorBody"]["properties"]) == {"error"}
    assert set(schemas["EventRecord"]["required"]) >= {"eventId", "eventTime", "eventAction"}


# --- changes while reading (these run a second pipeline, so they come last) -----------------


def test_scrolls_survive_and_reads_switch_atomically_during_a_rebuild(
    api: Checked, lake: Lake
) -> None:
    srv = lake.server
    # Scrolls started on the current build.
    profiles_before = collect_profiles(api, lake)
    heavy_before = [i for p in scroll_events(api, lake, "userId:u-heavy") for i in p]
    p1 = ok(get(api, lake, "profiles", size=30))
    e1 = ok(get(api, lake, "profiles/userId:u-heavy/events", size=30))
    old_meta = ok(get(api, lake, "profiles/userId:u-alice/meta"))
    old_events = event_ids(ok(get(api, lake, "events/", size=100)))

    # New data that changes all three: more customers, more heavy events, alice's plan.
    more = Sent()
    b = Batches(srv, lake.tokens["account"], more)
    t = DAY0 + timedelta(days=10)
    b.add(
        BRAND,
        {
            "type": "identify",
            "event": "identify",
            "userId": "u-alice",
            "traits": {"plan": "enterprise"},
        },
        "u-alice",
        "identify",
        t,
    )
    for i in range(150):
        b.add(
            BRAND,
            {
                "type": "identify",
                "event": "identify",
                "userId": f"u-new{i:03d}",
                "traits": {"n": i},
            },
            f"u-new{i:03d}",
            "identify",
            t + timedelta(seconds=i + 1),
        )
    for i in range(30):
        b.add(
            BRAND,
            {"type": "track", "event": "Product Viewed", "userId": "u-heavy"},
            "u-heavy",
            "product_viewed",
            t + timedelta(minutes=i + 5),
        )
    b.flush()
    wait_landed(srv.data_dir, b.ids)

    plans: list[str] = []  # alice's plan, per metadata answer, in order
    newest: list[str] = []  # the newest event, per events answer, in order
    failures: list[str] = []
    stop = threading.Event()
    old_identify = old_meta["lastEvent"]["identify"]["eventId"]

    def reader() -> None:
        with httpx.Client(headers={"auth-token": lake.tokens["account"]}, timeout=30) as c:
            while not stop.is_set():
                m = c.get(f"{lake.base()}/profiles/userId:u-alice/meta")
                ev = c.get(f"{lake.base()}/events/", params={"size": 1})
                if m.status_code != 200 or ev.status_code != 200:
                    failures.append(
                        f"{m.status_code} {m.text[:200]} {ev.status_code} {ev.text[:200]}"
                    )
                    continue
                meta = m.json()
                # One answer never mixes builds: the plan and the last identify agree.
                pair = (meta["plan"], meta["lastEvent"]["identify"]["eventId"])
                if pair not in {("pro", old_identify), ("enterprise", b.ids[0])}:
                    failures.append(f"mixed metadata {pair}")
                plans.append(meta["plan"])
                newest.append(ev.json()["data"][0]["eventId"])

    th = threading.Thread(target=reader)
    th.start()
    try:
        proc = mallard("pipeline", "run", data_dir=srv.data_dir, check=False)
        n = len(plans)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(plans) < n + 3:
            time.sleep(0.05)
    finally:
        stop.set()
        th.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert failures == []
    assert len(plans) > 5
    # Each list switches once, from the old build to the new one, and never goes back. (The
    # marts are committed one model at a time, so the two lists may switch a moment apart.)
    new_newest = newest_first(more.events)[0]
    for seq, old, new in ((plans, "pro", "enterprise"), (newest, old_events[0], new_newest)):
        assert seq[-1] == new
        switch = seq.index(new)
        assert set(seq[:switch]) <= {old} and set(seq[switch:]) == {new}

    # Scrolls begun before the rebuild finish on their own snapshot: no new rows, no gaps.
    rest = collect_profiles_from(api, lake, p1)
    assert [p["id"] for p in rest] == [p["id"] for p in profiles_before]
    heavy = event_ids(e1)
    body = e1
    while body["data"]:
        body = ok(get(api, lake, "profiles/userId:u-heavy/events", scrollId=body["scrollId"]))
        heavy += event_ids(body)
    assert heavy == heavy_before
    # New lists see the new build.
    assert len(collect_profiles(api, lake)) == len(profiles_before) + 150
    assert ok(get(api, lake, "profiles/userId:u-alice/traits"))["plan"] == "enterprise"


def collect_profiles_from(api: Checked, lake: Lake, first: dict[str, Any]) -> list[dict[str, Any]]:
    out, body = list(first["data"]), first
    while body["data"]:
        body = ok(get(api, lake, "profiles", scrollId=body["scrollId"]))
        out += body["data"]
    return out


def test_a_scroll_on_an_expired_snapshot_is_told_to_start_again(api: Checked, lake: Lake) -> None:
    """Maintenance expires old snapshots (and deletes their files). A scroll begun on one never
    gets rows of another snapshot: it goes on from the read index the server still holds for
    it, or, read from the lake, gets 400 "start again". A new list works. Last in the module: it
    expires the shared lake's history."""
    whole = collect_profiles(api, lake)  # the list on the current snapshot
    first = ok(get(api, lake, "profiles", size=2))
    paths = DataPaths(lake.server.data_dir)
    conn = connect(paths)  # a newer snapshot, so the scroll's is no longer the current one
    try:
        conn.execute("create table lake.state.scroll_expiry_probe as select 1 as x")
    finally:
        conn.close()
    maintain(paths, retention=timedelta(0))

    r = get(api, lake, "profiles", scrollId=first["scrollId"])
    if r.status_code == 200:  # from the index of the scroll's snapshot, still in memory
        page = r.json()["data"]
        assert page and page == whole[2 : 2 + len(page)]  # the next page of the same list
    else:
        assert "start again" in error(r, 400, "invalid_request_error")
    # A snapshot the server holds nothing of is read from the lake, where it is gone.
    stale = {**decode_scroll(first["scrollId"], "profiles"), "v": 1}
    r = get(api, lake, "profiles", scrollId=encode_scroll(stale))
    assert "start again" in error(r, 400, "invalid_request_error")
    assert len(ok(get(api, lake, "profiles", size=2))["data"]) == 2
