"""ids, rate limits and the error map."""

from __future__ import annotations

import pytest

from mallard import errors, ids
from mallard.ids import new_id, new_ids
from mallard.ratelimit import RateLimiter


def test_ids_are_unique_and_time_ordered() -> None:
    ids = [new_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(len(i) == 36 and i[14] == "7" for i in ids[:10])


def test_a_batch_of_ids_is_what_new_id_makes_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # Just below a carry into the counter's upper 12 bits (the third group's last digits).
    monkeypatch.setattr(ids, "_next_seq", 2**32 - 3)
    before = new_id()
    batch = new_ids(6).to_pylist()
    after = new_id()
    got = [before, *batch, after]
    assert got == sorted(got) and len(set(got)) == len(got)
    assert [i[14:18] for i in got] == ["7000"] * 3 + ["7001"] * 5
    assert [int(i[-8:], 16) for i in got] == [2**32 - 3, 2**32 - 2, 2**32 - 1, 0, 1, 2, 3, 4]
    # Every digit as new_id's formula puts it, for a time and counter with all bits in use.
    ms, first = 0xFEDCBA987654, 2**44 - 2
    monkeypatch.setattr(ids, "_reserve", lambda n: (ms, first))
    assert new_ids(4).to_pylist() == [ids._format(ms, first + k) for k in range(4)]


def test_rate_limit_burst_then_refill() -> None:
    lim = RateLimiter(rate_per_second=100, burst=500)
    assert all(lim.take("k", now=0.0) == 0.0 for _ in range(500))
    wait = lim.take("k", now=0.0)
    assert wait == pytest.approx(0.01)
    assert lim.take("other", now=0.0) == 0.0
    assert lim.take("k", now=0.02) == 0.0  # 2 tokens refilled after 20 ms
    assert RateLimiter.retry_after_header(0.01) == {"Retry-After": "1"}


@pytest.mark.parametrize(
    ("exc", "family", "status", "body"),
    [
        (errors.InvalidRequest("bad"), "ingest", 400, {"success": False, "message": "bad"}),
        (errors.Unauthenticated("no"), "ingest", 403, {"success": False, "message": "no"}),
        (errors.Forbidden("no"), "ingest", 403, {"success": False, "message": "no"}),
        (errors.PayloadTooLarge("big"), "ingest", 413, {"success": False, "message": "big"}),
        (errors.RateLimited("slow"), "ingest", 429, {"success": False, "message": "slow"}),
        (errors.Unavailable("down"), "ingest", 503, {"success": False, "message": "down"}),
        (
            errors.Unauthenticated("no"),
            "read",
            401,
            {"error": {"code": "authentication_error", "message": "no"}},
        ),
        (
            errors.Forbidden("no"),
            "read",
            403,
            {"error": {"code": "authentication_error", "message": "no"}},
        ),
        (
            errors.InvalidRequest("bad"),
            "read",
            400,
            {"error": {"code": "invalid_request_error", "message": "bad"}},
        ),
        (
            errors.ValidationFailed("id"),
            "read",
            400,
            {"error": {"code": "validation_error", "message": "id"}},
        ),
        (errors.NotFound("gone"), "read", 404, {"error": {"code": "not_found", "message": "gone"}}),
        (
            errors.RateLimited("slow"),
            "read",
            429,
            {"error": {"code": "rate_limit_error", "message": "slow"}},
        ),
        (
            errors.MallardError("boom"),
            "read",
            500,
            {"error": {"code": "internal_server_error", "message": "boom"}},
        ),
    ],
)
def test_error_map(
    exc: errors.MallardError, family: errors.Family, status: int, body: dict[str, object]
) -> None:
    assert errors.error_body(exc, family) == (status, body)


@pytest.mark.parametrize(
    ("path", "method", "family"),
    [
        ("/track/c/a/B/v1/track", "POST", "ingest"),
        ("/track/c/a/B/v1/events/", "GET", "read"),
        ("/track/c/a/B/v1/regulations", "POST", "read"),
        ("/track/c/a/B/v1/regulations/", "POST", "read"),
        ("/track/c/a/B/v1/regulations/r-1/download", "GET", "read"),
        ("/cdp/events/std/t", "POST", "ingest"),
        ("/v1/batch", "POST", "ingest"),
        ("/cdp/marketing-preferences/x", "GET", "read"),
        ("/cdp/marketing-preferences/x", "POST", "read"),
    ],
)
def test_family_of(path: str, method: str, family: str) -> None:
    assert errors.family_of(path, method) == family
