"""Server ingestion through a real `mallard serve`: every rule and status code of issue 3."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from tests.conftest import Server, free_port, init_data_dir, landed_event_ids, wait_landed


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("collector") / "data"
    server = Server(
        d,
        free_port(),
        init_data_dir(d),
        env={"MALLARD_ROLL_INTERVAL_S": "0.2", "MALLARD_RATE_BURST": "100000"},
    )
    server.start()
    yield server
    server.stop()


def landed_messages(data_dir: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for f in sorted((data_dir / "landing").glob("date=*/*.parquet")):
        for m in pq.read_table(f, columns=["message"]).column("message").to_pylist():
            msg = json.loads(m)
            out[msg["eventId"]] = msg
    return out


VALID = {
    "identify": {"userId": "u1", "event": "identify", "traits": {"plan": "pro"}},
    "track": {"userId": "u1", "event": "Signed Up", "properties": {"x": 1}},
    "page": {"anonymousId": "a1", "event": "page", "properties": {"path": "/"}},
    "screen": {"userId": "u1", "name": "Home"},
}


@pytest.mark.parametrize("action", list(VALID))
def test_valid_calls_are_stored_with_server_fields(srv: Server, action: str) -> None:
    r = srv.post(action, VALID[action])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["eventId"]
    wait_landed(srv.data_dir, [body["eventId"]])
    stored = landed_messages(srv.data_dir)[body["eventId"]]
    assert stored["type"] == action
    assert stored["channel"] == "server" and stored["version"] == "1"
    assert (stored["clientId"], stored["accountId"], stored["brandId"]) == ("demo", "demo", "DEMO")
    for field in ("messageId", "receivedAt", "timestamp"):
        assert stored[field]
    assert "ip" not in stored["context"]


@pytest.mark.parametrize(
    ("action", "body", "message"),
    [
        ("track", {"event": "E"}, '"userId" or "anonymousId" is required'),
        ("track", {"userId": 1, "event": "E"}, '"userId" must be a non-empty string'),
        (
            "track",
            {"userId": "u", "anonymousId": ["x"], "event": "E"},
            '"anonymousId" must be a non-empty string',
        ),
        ("track", {"userId": "u"}, '"event" is required for track'),
        ("track", {"userId": "u", "event": 7}, '"event" is required for track'),
        ("identify", {"userId": "u", "traits": {}}, '"event" must be "identify"'),
        ("identify", {"userId": "u", "event": "identify"}, '"traits" is required for identify'),
        (
            "identify",
            {"userId": "u", "event": "identify", "traits": "x"},
            '"traits" must be an object',
        ),
        ("page", {"userId": "u"}, '"event" must be "page"'),
        ("screen", {"userId": "u", "name": {}}, '"name" must be a string'),
        ("track", {"userId": "u", "event": "E", "properties": 1}, '"properties" must be an object'),
        ("track", {"userId": "u", "event": "E", "context": []}, '"context" must be an object'),
        (
            "track",
            {"userId": "u", "event": "E", "timestamp": "not a time"},
            '"timestamp" must be an ISO-8601',
        ),
        ("track", {"userId": "u", "event": "E", "sentAt": 5}, '"sentAt" must be an ISO-8601'),
        ("batch", {"batch": []}, '"batch" must not be empty'),
        ("batch", {"items": []}, '"batch" is required'),
        (
            "batch",
            {
                "batch": [
                    {"type": "track", "userId": "u", "event": "E"},
                    {"event": "Clicked", "userId": "u"},
                ]
            },
            "batch[1]",
        ),
        ("batch", {"batch": [{"type": "track", "userId": "u"}]}, 'batch[0]: "event" is required'),
    ],
)
def test_invalid_calls_are_400_naming_field_and_rule(
    srv: Server, action: str, body: Any, message: str
) -> None:
    before = len(landed_event_ids(srv.data_dir))
    r = srv.post(action, body)
    assert r.status_code == 400, r.text
    assert r.json()["success"] is False
    assert message in r.json()["message"]
    assert len(landed_event_ids(srv.data_dir)) == before


def test_body_that_is_not_json(srv: Server) -> None:
    r = httpx.post(f"{srv.base}/track", content=b"{nope", headers=srv.headers)
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
    r = httpx.post(f"{srv.base}/track", content=b"[1,2]", headers=srv.headers)
    assert r.status_code == 400 and "JSON object" in r.json()["message"]


def test_batch(srv: Server) -> None:
    body = {
        "context": {"app": {"name": "shop"}, "locale": "en-GB"},
        "batch": [
            {"type": "identify", "userId": "b1", "traits": {"email": "b1@example.com"}},
            {"event": "page", "anonymousId": "an1", "context": {"locale": "pt-PT"}},
            {"type": "track", "userId": "b1", "event": "Bought", "messageId": "mid-1"},
            {"type": "screen", "userId": "b1", "name": "Cart"},
            {"type": "group", "userId": "b1", "groupId": "g1"},
        ],
    }
    r = srv.post("batch", body)
    assert r.status_code == 200, r.text
    ids = r.json()["eventIds"]
    assert len(ids) == 5 and r.json()["eventId"] == ids[0] and len(set(ids)) == 5
    wait_landed(srv.data_dir, ids)
    stored = landed_messages(srv.data_dir)
    types = [stored[i]["type"] for i in ids]
    assert types == ["identify", "page", "track", "screen", "group"]
    assert stored[ids[0]]["context"] == {"app": {"name": "shop"}, "locale": "en-GB"}
    assert stored[ids[1]]["context"]["locale"] == "pt-PT"  # the item's own key wins
    assert stored[ids[2]]["messageId"] == "mid-1"


def test_batch_of_many_calls_gets_distinct_ids_and_canonical_times(srv: Server) -> None:
    """From BATCH_IDS calls on, a batch's ids come from one reservation; a timestamp already in
    the stored form is kept as sent, any other form is stored in it."""
    forms = {
        "2026-03-01T12:00:00.250Z": "2026-03-01T12:00:00.250Z",
        "2026-03-01T13:00:00.25+01:00": "2026-03-01T12:00:00.250Z",
        "2026-03-01": "2026-03-01T00:00:00.000Z",
        "2026-W09-7T12:00:00.000Z": "2026-03-01T12:00:00.000Z",  # a week date, same shape
    }
    batch = [
        {"type": "track", "userId": f"m{i}", "event": "E", "timestamp": sent}
        for i, sent in enumerate(list(forms) * 10)
    ]
    r = srv.post("batch", {"batch": batch})
    assert r.status_code == 200, r.text
    ids = r.json()["eventIds"]
    assert len(set(ids)) == 40
    wait_landed(srv.data_dir, ids)
    stored = landed_messages(srv.data_dir)
    for event_id, item in zip(ids, batch, strict=True):
        msg = stored[event_id]
        assert msg["timestamp"] == forms[item["timestamp"]]
        assert msg["originalTimestamp"] == item["timestamp"]
        assert msg["messageId"] == event_id


def test_router_and_fast_path_answer_alike(srv: Server) -> None:
    """FastIngest (collector/routes.py) takes the usual path; a trailing slash goes through
    Litestar's router to the same handler: same statuses, bodies and headers."""
    for body in (VALID["track"], {"event": "x"}, [1]):
        answers = [
            httpx.post(f"{srv.base}/track{tail}", json=body, headers=srv.headers, timeout=30)
            for tail in ("", "/")
        ]
        fast, routed = answers
        assert fast.status_code == routed.status_code, (fast.text, routed.text)
        assert fast.headers["content-type"] == routed.headers["content-type"]
        assert "x-mallard-requestid" in fast.headers and "x-mallard-requestid" in routed.headers
        if fast.status_code == 200:
            assert fast.json().keys() == routed.json().keys() == {"success", "eventId"}
        else:
            assert fast.json() == routed.json()
    no_token = httpx.post(f"{srv.base}/track", json=VALID["track"], timeout=30)
    assert no_token.status_code == 403 and no_token.json()["success"] is False


def test_status_codes(srv: Server) -> None:
    r = srv.post("nope", VALID["track"])
    assert r.status_code == 404 and r.json()["success"] is False
    r = httpx.get(f"{srv.base}/track", headers=srv.headers)
    assert r.status_code == 405
    assert r.headers["content-type"].startswith("application/json")
    r = httpx.post(f"{srv.base}/track", json=VALID["track"])
    assert r.status_code == 403 and r.json() == {
        "success": False,
        "message": "missing auth-token header",
    }


def test_size_limits(srv: Server) -> None:
    big = {"userId": "u", "event": "E", "properties": {"blob": "x" * 33_000}}
    r = srv.post("track", big)
    assert r.status_code == 413 and r.json()["success"] is False
    item = {**VALID["track"], "type": "track"}
    r = srv.post("batch", {"batch": [item, {**big, "type": "track"}]})
    assert r.status_code == 413 and "batch[1]" in r.json()["message"]
    # Many small items are fine as long as the whole body is under 1 MB ...
    r = srv.post("batch", {"batch": [item] * 500})
    assert r.status_code == 200 and len(r.json()["eventIds"]) == 500
    # ... and over 1 MB the body is refused before it is parsed.
    huge = b'{"batch":[' + b",".join([json.dumps(item).encode()] * 25_000) + b"]}"
    assert len(huge) > 1_048_576
    r = httpx.post(f"{srv.base}/batch", content=huge, headers=srv.headers)
    assert r.status_code == 413
    assert r.json()["success"] is False


def test_chunked_bodies_are_counted_against_the_limit(srv: Server) -> None:
    """No content-length to refuse early: the bytes streamed are counted (collector/routes.py
    read_body, as Litestar's Request.stream counts them)."""

    def chunks(n: int) -> Iterator[bytes]:
        yield b'{"batch":['
        for i in range(n):
            yield (b"," if i else b"") + json.dumps({**VALID["track"], "type": "track"}).encode()
        yield b"]}"

    r = httpx.post(f"{srv.base}/batch", content=chunks(3), headers=srv.headers, timeout=30)
    assert r.status_code == 200 and len(r.json()["eventIds"]) == 3, r.text
    r = httpx.post(f"{srv.base}/batch", content=chunks(25_000), headers=srv.headers, timeout=30)
    assert r.status_code == 413 and r.json()["success"] is False, r.text


def test_rate_limit(server_factory: Any) -> None:
    server = server_factory(env={"MALLARD_RATE_PER_SECOND": "1", "MALLARD_RATE_BURST": "3"})
    codes = [server.post("track", VALID["track"]).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    r = server.post("track", VALID["track"])
    assert r.status_code == 429
    assert r.json()["success"] is False
    assert int(r.headers["retry-after"]) >= 1


def test_direct_calls_record_the_request_ip(srv: Server) -> None:
    r = srv.post("track", {**VALID["track"], "context": {"direct": True}})
    wait_landed(srv.data_dir, [r.json()["eventId"]])
    assert landed_messages(srv.data_dir)[r.json()["eventId"]]["context"]["ip"] == "127.0.0.1"


def test_calls_without_a_valid_token_are_rate_limited_by_address(server_factory: Any) -> None:
    """Guessing tokens is limited like calling with one: invalid and missing tokens draw on a
    bucket of the caller's address (here 3, refilled once a 100 s), which leaves a valid token's
    own bucket alone."""
    server = server_factory(env={"MALLARD_RATE_PER_SECOND": "0.01", "MALLARD_RATE_BURST": "3"})
    guess = {"content-type": "application/json", "auth-token": "mlt_00000000_guess"}
    codes = [
        httpx.post(f"{server.base}/track", json=VALID["track"], headers=guess).status_code
        for _ in range(2)
    ]
    codes.append(httpx.get(f"{server.base}/events").status_code)  # no token, read API
    assert codes == [403, 403, 401]
    r = httpx.post(f"{server.base}/track", json=VALID["track"], headers=guess)
    assert r.status_code == 429 and r.json()["success"] is False
    assert r.headers["retry-after"] == "100"  # ceil((1 - 0 tokens) / 0.01 per s)
    r = httpx.get(f"{server.base}/events", headers={"auth-token": "mlt_00000000_guess"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_error"
    assert server.post("track", VALID["track"]).status_code == 200  # a valid token still works
