"""The per-key token bucket and the Retry-After it answers, on an injected clock."""

from __future__ import annotations

import math

import pytest

from mallard.ratelimit import RateLimiter


def test_a_burst_then_the_rate() -> None:
    limiter = RateLimiter(rate_per_second=10, burst=5)
    assert [limiter.take("k", now=0.0) for _ in range(5)] == [0.0] * 5
    assert limiter.take("k", now=0.0) == pytest.approx(0.1)  # one token per 1/rate s
    assert limiter.take("other", now=0.0) == 0.0  # another key has its own bucket
    assert limiter.take("k", now=0.1) == 0.0  # refilled by exactly one token
    assert limiter.take("k", now=0.1) > 0


@pytest.mark.parametrize(("rate", "burst", "elapsed"), [(0.5, 1, 0.0), (0.5, 1, 0.7), (3, 2, 0.1)])
def test_retry_after_is_the_wait_for_one_token_and_a_retry_then_succeeds(
    rate: float, burst: int, elapsed: float
) -> None:
    limiter = RateLimiter(rate_per_second=rate, burst=burst)
    for _ in range(burst):
        assert limiter.take("k", now=0.0) == 0.0
    tokens = min(burst, elapsed * rate)  # what the bucket holds when the refused call comes
    wait = limiter.take("k", now=elapsed)
    assert wait == pytest.approx((1 - tokens) / rate)
    header = RateLimiter.retry_after_header(wait)
    assert header == {"Retry-After": str(max(1, math.ceil((1 - tokens) / rate)))}
    # A client that waits what the header says is let in.
    assert limiter.take("k", now=elapsed + int(header["Retry-After"])) == 0.0


def test_retry_after_is_never_below_one_second() -> None:
    assert RateLimiter.retry_after_header(0.01) == {"Retry-After": "1"}
    assert RateLimiter.retry_after_header(1.01) == {"Retry-After": "2"}
