"""Suppress and NoTrack at the collector, on real `mallard serve` processes.

A dropped call is answered as any accepted one (200, an eventId, the same headers); only
`GET events/{eventId}/status` with a token (`Server.dropped`) says it was dropped, and why.

Regulations are filed through the store in this process (`RegulationStore.file`), as the API
does: their effect holds when `file()` returns. Landing files are read after a fence message
(the last one sent to a collector) has landed: a collector lands its log in order, so anything
an earlier request stored has landed too.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from mallard.paths import DataPaths
from mallard.regulations import Generation, RegulationStore
from tests.conftest import Server, free_port, init_data_dir, wait_landed

STD = "/cdp/events/std"
VARIANTS = 6
ENV = {
    "MALLARD_ROLL_INTERVAL_S": "0.2",
    "MALLARD_RATE_BURST": "1000000",
    "MALLARD_RATE_PER_SECOND": "1000000",
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("admission") / "data"
    server = Server(d, free_port(), init_data_dir(d), env=ENV)
    server.start()
    yield server
    server.stop()


def unique(prefix: str) -> str:
    return f"adm-{prefix}-{uuid.uuid4().hex[:12]}"


def file(srv: Server, kind: str, user: str, anonymous_ids: tuple[str, ...] = ()) -> None:
    c = srv.creds
    store = RegulationStore(DataPaths(srv.data_dir))
    try:
        store.file(
            c["clientId"], c["accountId"], c["brandId"], kind, [user], {user: list(anonymous_ids)}
        )
    finally:
        store.close()


def send(srv: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST to a server action (`track`, `batch`, ...) with the auth-token, or to a client path
    (`/cdp/...` with the writeKey in the body, `/v1/...` with it as the Basic user)."""
    if not path.startswith("/"):
        return srv.post(path, body)
    if path.startswith("/v1/"):
        return httpx.post(
            f"{srv.url}{path}", json=body, auth=(srv.creds["writeKey"], ""), timeout=30
        )
    content = json.dumps({**body, "writeKey": srv.creds["writeKey"]}).encode()
    # The tag posts text/plain.
    return httpx.post(
        f"{srv.url}{path}", content=content, headers={"content-type": "text/plain"}, timeout=30
    )


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def ids_of(r: httpx.Response) -> list[str]:
    """The eventIds of an accepted call's answer, each a UUIDv7 string: kept or dropped alike."""
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True
    ids: list[str] = body["eventIds"] if "eventIds" in body else [body["eventId"]]
    assert body["eventId"] == ids[0]
    assert all(isinstance(i, str) and UUID.fullmatch(i) for i in ids), ids
    return ids


def landed(data_dir: Path) -> dict[str, dict[str, Any]]:
    """messageId -> (userId, anonymousId, eventId) of every landed message."""
    out: dict[str, dict[str, Any]] = {}
    cols = ["message_id", "user_id", "anonymous_id", "event_id"]
    for f in sorted((data_dir / "landing").glob("date=*/*.parquet")):
        for row in pq.read_table(f, columns=cols).to_pylist():
            out[row["message_id"]] = row
    return out


def fence(srv: Server, kept: list[str]) -> dict[str, dict[str, Any]]:
    """Land one more message after everything sent, wait for it and for every kept id."""
    fence_ids = ids_of(srv.post("track", {"userId": unique("fence"), "event": "Fence"}))
    wait_landed(srv.data_dir, [*kept, *fence_ids])
    return landed(srv.data_dir)


def mid() -> str:
    return f"adm-mid-{uuid.uuid4().hex}"


# --- Suppress racing ingestion ----------------------------------------------------------------


def test_suppress_races_ingestion_from_several_threads(srv: Server) -> None:
    user, anon, other = unique("sup-user"), unique("sup-anon"), unique("sup-other")

    def calls(variant: int) -> tuple[str, dict[str, Any], list[tuple[str, bool]]]:
        """(path, body, [(messageId, of the subject)]) of one request."""
        a, b, c = mid(), mid(), mid()
        if variant == 0:
            return "track", {"userId": user, "event": "Clicked", "messageId": a}, [(a, True)]
        if variant == 1:
            batch = [
                {"type": "track", "userId": user, "event": "Clicked", "messageId": a},
                {"type": "page", "anonymousId": anon, "event": "page", "messageId": b},
                {"type": "track", "userId": other, "event": "Clicked", "messageId": c},
            ]
            return "batch", {"batch": batch}, [(a, True), (b, True), (c, False)]
        if variant == 2:
            body = {"type": "page", "anonymousId": anon, "messageId": a}
            return f"{STD}/t", body, [(a, True)]
        if variant == 3:
            return "track", {"userId": other, "event": "Clicked", "messageId": a}, [(a, False)]
        if variant == 4:
            batch = [
                {"type": "screen", "userId": user, "name": "Home", "messageId": a},
                {"type": "track", "anonymousId": anon, "name": "Opened", "messageId": b},
                {"type": "screen", "userId": other, "name": "Home", "messageId": c},
            ]
            return f"{STD}/mobile/batch", {"batch": batch}, [(a, True), (b, True), (c, False)]
        return "/v1/identify", {"userId": user, "traits": {"x": 1}, "messageId": a}, [(a, True)]

    filed, stop = threading.Event(), threading.Event()
    # (variant, sent after file() returned, [(messageId, of the subject)], answer)
    records: list[tuple[int, bool, list[tuple[str, bool]], httpx.Response]] = []
    lock = threading.Lock()

    def sender(start: int) -> None:
        for n in itertools.count(start):
            if stop.is_set():
                return
            after = filed.is_set()
            path, body, sent = calls(n % VARIANTS)
            r = send(srv, path, body)
            with lock:
                records.append((n % VARIANTS, after, sent, r))

    def wait_for(after: bool, per_variant: int) -> None:
        """Until every variant was answered this often before (or after) the filing: counts,
        not sleeps, since on a loaded machine a request may take much longer."""
        deadline = time.monotonic() + 60
        while True:
            with lock:
                seen = Counter(v for v, a, _, _ in records if a == after)
            if all(seen[v] >= per_variant for v in range(VARIANTS)):
                return
            assert time.monotonic() < deadline, f"too few answers: {seen}"
            time.sleep(0.05)

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        wait_for(after=False, per_variant=1)
        file(srv, "SUPPRESS", user, (anon,))
        filed.set()
        wait_for(after=True, per_variant=3)
    finally:
        stop.set()
        for t in threads:
            t.join()

    after_subject, after_other, kept = set(), set(), []
    for _, after, sent, r in records:
        ids = ids_of(r)
        assert len(ids) == len(sent)
        for (message_id, subject), event_id in zip(sent, ids, strict=True):
            # A call of the subject sent before file() returned may have been dropped too.
            reason = srv.dropped(event_id) if subject else None
            if reason is None:
                kept.append(event_id)
            if not after:
                continue
            if subject:
                assert reason == "suppress", (message_id, r.request.url)
                after_subject.add(message_id)
            else:
                after_other.add(message_id)
    before = [s for _, after, sent, _ in records if not after for s in sent]
    assert any(subject for _, subject in before), "no message of the subject before the filing"

    rows = fence(srv, kept)
    assert not after_subject & rows.keys()
    assert after_other <= rows.keys()
    before_ids = {m for m, _ in before}
    for message_id, row in rows.items():
        if row["user_id"] == user or row["anonymous_id"] == anon:
            assert message_id in before_ids

    file(srv, "UNSUPPRESS", user)
    again = [
        *ids_of(send(srv, "track", {"userId": user, "event": "Back"})),
        *ids_of(send(srv, f"{STD}/p", {"anonymousId": anon})),
    ]
    assert [srv.dropped(i) for i in again] == [None, None]
    wait_landed(srv.data_dir, again)


# --- every ingestion route --------------------------------------------------------------------


def ingestion_routes(tmp_path: Path) -> list[str]:
    """Every POST route of the app that ingests calls: the server actions and every path under
    /cdp/events/ and /v1/ (so a new route cannot be left out)."""
    from collector.routes import SERVER_ACTIONS
    from mallard.app import create_app
    from mallard.settings import get_settings

    app = create_app(get_settings().with_data_dir(tmp_path / "route-listing"))
    paths = {
        route.path
        for route in app.routes
        if route.path.startswith(("/cdp/events/", "/v1/"))
        and "POST" in getattr(route, "methods", set())
    }
    assert not any("{" in p for p in paths)
    return [*SERVER_ACTIONS, *sorted(paths - {f"{STD}/m"})]


def route_body(path: str, ids: dict[str, str]) -> dict[str, Any]:
    kind = path.rsplit("/", 1)[-1]
    item = {"type": "track", "event": "Routed", **ids}
    bodies: dict[str, dict[str, Any]] = {
        "identify": {**ids, "event": "identify", "traits": {"plan": "pro"}},
        "i": {**ids, "type": "identify", "traits": {"plan": "pro"}},
        "track": {**ids, "event": "Routed"},
        "t": {**ids, "type": "track", "event": "Routed"},
        "page": {**ids, "event": "page"},
        "p": {**ids, "type": "page"},
        "screen": {**ids, "name": "Routed"},
        "s": {**ids, "type": "screen", "name": "Routed"},
        "group": {**ids, "groupId": "g-1"},
        "g": {**ids, "type": "group", "groupId": "g-1"},
        "alias": {**ids, "previousId": "adm-previous"},
        "a": {**ids, "type": "alias", "previousId": "adm-previous"},
        "batch": {"batch": [item]},
        "b": {"batch": [item]},
    }
    assert kind in bodies, f"no body for the new ingestion route {path}: add one"
    return bodies[kind]


def test_every_ingestion_route_drops_a_suppressed_user(srv: Server, tmp_path: Path) -> None:
    user, anon = unique("all-user"), unique("all-anon")
    file(srv, "SUPPRESS", user, (anon,))
    routes = ingestion_routes(tmp_path)
    assert {"track", "batch", f"{STD}/t", f"{STD}/mobile/batch", "/v1/batch"} <= set(routes)
    kept: list[str] = []
    for path in routes:
        # Another user on the same route: stored, and answered as the dropped calls are.
        other = send(srv, path, route_body(path, {"userId": unique("k")}))
        kept += ids_of(other)
        for ids in ({"userId": user}, {"anonymousId": anon}):
            r = send(srv, path, route_body(path, ids))
            [event_id] = ids_of(r)
            assert r.status_code == other.status_code, path
            assert r.json().keys() == other.json().keys(), path
            assert sorted(r.headers.keys()) == sorted(other.headers.keys()), path
            assert srv.dropped(event_id) == "suppress", (path, ids)
    assert [srv.dropped(i) for i in kept] == [None] * len(kept)
    rows = fence(srv, kept)
    assert not [r for r in rows.values() if r["user_id"] == user or r["anonymous_id"] == anon]


def test_tag_metrics_carrying_a_suppressed_identifier_are_dropped(srv: Server) -> None:
    user, anon = unique("m-user"), unique("m-anon")
    file(srv, "SUPPRESS", user, (anon,))
    plain_marker, anon_marker, user_marker = unique("mk"), unique("mk"), unique("mk")

    def metrics(marker: str, tags: dict[str, Any]) -> dict[str, Any]:
        series = [{"type": "Counter", "metric": marker, "value": 1, "tags": tags}]
        return {"series": series}

    for body in (
        metrics(plain_marker, {"library": "analytics.js"}),
        metrics(anon_marker, {"anonymousId": anon}),
        metrics(user_marker, {"url": f"https://shop.example/?uid={user}&x=1"}),
    ):
        r = httpx.post(f"{srv.url}{STD}/m", content=json.dumps(body).encode(), timeout=30)
        assert r.status_code == 200 and r.json() == {"success": True}
    stored = "".join(p.read_text() for p in (srv.data_dir / "metrics").glob("*.jsonl"))
    assert plain_marker in stored
    assert anon_marker not in stored and user_marker not in stored
    assert anon not in stored and user not in stored


# --- NoTrack ----------------------------------------------------------------------------------


def no_track_calls(user: str, anon: str) -> list[tuple[str, dict[str, Any], list[bool]]]:
    """(path, body, per call whether NoTrack lets it in) on every channel."""
    by_user, by_anon = {"userId": user}, {"anonymousId": anon}
    return [
        # Server API.
        ("identify", {**by_user, "event": "identify", "traits": {"plan": "pro"}}, [True]),
        ("track", {**by_user, "event": "Viewed Item"}, [False]),
        ("track", {**by_user, "event": "SEND_EMAIL", "assetId": "welcome"}, [True]),
        ("page", {**by_anon, "event": "page"}, [False]),
        ("screen", {**by_user, "name": "Home"}, [False]),
        (
            "batch",
            {
                "batch": [
                    {**by_user, "type": "identify", "traits": {"plan": "pro"}},
                    {**by_anon, "type": "track", "event": "Viewed Item"},
                    {**by_user, "type": "track", "event": "Send_Push", "assetId": "offer_push"},
                ]
            },
            [True, False, True],
        ),
        # Segment drop-in (server SDKs).
        ("/v1/identify", {**by_user, "traits": {"plan": "pro"}}, [True]),
        ("/v1/track", {**by_user, "event": "Viewed Item"}, [False]),
        # The tag.
        (f"{STD}/i", {**by_anon, "type": "identify", "userId": user, "traits": {}}, [False]),
        (f"{STD}/t", {**by_anon, "type": "track", "event": "Viewed Item"}, [False]),
        (f"{STD}/p", {**by_anon, "type": "page"}, [False]),
        (
            f"{STD}/t",
            {**by_anon, "type": "track", "event": "send_sms", "assetId": "reset_code"},
            [True],
        ),
        (
            f"{STD}/b",
            {
                "batch": [
                    {**by_anon, "type": "page"},
                    {**by_user, "type": "identify", "traits": {"plan": "pro"}},
                ]
            },
            [False, False],
        ),
        # Mobile.
        (
            f"{STD}/mobile/batch",
            {
                "batch": [
                    {**by_user, "type": "identify", "traits": {"plan": "pro"}},
                    {**by_anon, "type": "screen", "name": "Home"},
                    {**by_user, "type": "track", "name": "Opened"},
                ]
            },
            [True, False, False],
        ),
        (f"{STD}/t", {**by_user, "type": "identify", "channel": "mobile", "traits": {}}, [True]),
    ]


def send_all(
    srv: Server, calls: list[tuple[str, dict[str, Any], list[bool]]]
) -> list[tuple[str, list[str], list[str | None], list[bool]]]:
    """(path, eventIds, per call the list that dropped it, per call whether it is expected
    in) of each call."""
    out = []
    for path, body, expected in calls:
        ids = ids_of(send(srv, path, body))
        out.append((path, ids, [srv.dropped(i) for i in ids], expected))
    return out


def test_no_track_then_track_on_every_channel(srv: Server) -> None:
    user, anon = unique("nt-user"), unique("nt-anon")
    other, other_anon = unique("nt-other"), unique("nt-other-anon")
    file(srv, "NO_TRACK", user, (anon,))

    answers = send_all(srv, no_track_calls(user, anon))
    for path, _, drops, expected in answers:
        assert drops == [None if e else "no_track" for e in expected], path
    others = send_all(srv, no_track_calls(other, other_anon))
    assert all(drops == [None] * len(drops) for _, _, drops, _ in others)

    def kept_of(sent: list[tuple[str, list[str], list[str | None], list[bool]]]) -> list[str]:
        return [i for _, ids, drops, _ in sent for i, d in zip(ids, drops, strict=True) if not d]

    rows = fence(srv, kept_of(answers + others))
    subject_rows = {
        r["event_id"] for r in rows.values() if r["user_id"] == user or r["anonymous_id"] == anon
    }
    assert subject_rows == set(kept_of(answers))

    file(srv, "TRACK", user)
    again = send_all(srv, no_track_calls(user, anon))
    assert all(drops == [None] * len(drops) for _, _, drops, _ in again)
    wait_landed(srv.data_dir, [i for _, ids, _, _ in again for i in ids])


# --- another collector on the same data dir ---------------------------------------------------


def test_a_second_collector_drops_from_the_moment_file_returns(srv: Server) -> None:
    second = Server(
        srv.data_dir, free_port(), srv.creds, env={**ENV, "MALLARD_COLLECTOR_ID": "adm-c2"}
    )
    second.start()
    try:
        user, anon, other = unique("c2-user"), unique("c2-anon"), unique("c2-other")
        warm = ids_of(send(second, "track", {"userId": user, "event": "Before"}))
        assert second.dropped(warm[0]) is None
        file(srv, "SUPPRESS", user, (anon,))
        dropped = []
        for server in (srv, second):
            dropped += ids_of(send(server, "track", {"userId": user, "event": "After"}))
            dropped += ids_of(send(server, f"{STD}/p", {"anonymousId": anon}))
        # Either server answers for the other's dropped calls: the status reads every log.
        assert [srv.dropped(i) for i in dropped] == ["suppress"] * 4
        assert [second.dropped(i) for i in dropped] == ["suppress"] * 4
        kept = ids_of(send(second, "track", {"userId": other, "event": "After"}))
        assert second.dropped(kept[0]) is None
        fence(srv, [])
        rows = fence(second, [*warm, *kept])
        subject = {r["event_id"] for r in rows.values() if user == r["user_id"]}
        assert subject == set(warm)
        assert not [r for r in rows.values() if r["anonymous_id"] == anon]

        # Killed right after its answer, the second collector's dropped call is still known:
        # its record was durable in the log, and the restart moves it to the store.
        [last] = ids_of(send(second, "track", {"userId": user, "event": "Killed"}))
        second.kill()
        assert srv.dropped(last) == "suppress"
        second.start()
        wal = srv.data_dir / "wal" / "adm-c2"
        assert not [p for p in wal.iterdir() if last.encode() in p.read_bytes()]
        assert RegulationStore(DataPaths(srv.data_dir)).dropped(srv.creds["accountId"], last)
        assert [second.dropped(i) for i in [*dropped, last]] == ["suppress"] * 5

        file(srv, "UNSUPPRESS", user)
        back = ids_of(send(second, "track", {"userId": user, "event": "Back"}))
        assert second.dropped(back[0]) is None
        fence(second, back)
    finally:
        second.stop()


# --- fail closed ------------------------------------------------------------------------------


def test_ingestion_fails_closed_while_the_lists_cannot_be_read(srv: Server) -> None:
    paths = DataPaths(srv.data_dir)
    user = unique("fc-user")
    store = RegulationStore(paths)
    store.compact()  # every page in the main file, where the garbage goes
    store.close()
    good = paths.regulations_db.read_bytes()
    sent: list[tuple[str, dict[str, Any]]] = [
        ("track", {"userId": user, "event": "Down", "messageId": mid()}),
        ("batch", {"batch": [{"type": "track", "userId": user, "event": "D", "messageId": mid()}]}),
        (f"{STD}/t", {"type": "track", "userId": user, "event": "Down", "messageId": mid()}),
        (
            f"{STD}/mobile/batch",
            {"batch": [{"type": "screen", "userId": user, "messageId": mid()}]},
        ),
        ("/v1/track", {"userId": user, "event": "Down", "messageId": mid()}),
    ]
    marker = unique("fc-metric")
    try:
        with open(paths.regulations_db, "r+b") as f:
            f.write(os.urandom(len(good)))
        Generation(paths.regulations_generation).bump()
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda p=p, b=b: answers.append(send(srv, p, b)))
            for p, b in sent
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(answers) == len(sent)
        for r in answers:
            assert r.status_code == 503, r.text
            assert r.headers["content-type"].startswith("application/json")
            assert r.json() == {
                "success": False,
                "message": "the regulation lists cannot be read; nothing was accepted, retry later",
            }
        metrics = {"series": [{"type": "Counter", "metric": marker, "value": 1}]}
        r = httpx.post(f"{srv.url}{STD}/m", content=json.dumps(metrics).encode(), timeout=30)
        assert r.status_code == 200
    finally:
        with open(paths.regulations_db, "r+b") as f:
            f.write(good)
        Generation(paths.regulations_generation).bump()

    back = ids_of(send(srv, "track", {"userId": user, "event": "Up"}))
    assert srv.dropped(back[0]) is None
    rows = fence(srv, back)
    assert not {body.get("messageId") for _, body in sent} & rows.keys()
    assert not [m for _, b in sent for m in b.get("batch", []) if m["messageId"] in rows]
    stored = "".join(p.read_text() for p in (srv.data_dir / "metrics").glob("*.jsonl"))
    assert marker not in stored
