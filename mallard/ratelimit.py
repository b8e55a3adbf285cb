"""Per-key token buckets: 100 requests/s with a burst of 500 by default."""

from __future__ import annotations

import math
import threading
import time


class RateLimiter:
    def __init__(self, rate_per_second: float, burst: int) -> None:
        self.rate = rate_per_second
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """Take one request for key; 0.0 when allowed, else the seconds until one is allowed."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    @staticmethod
    def retry_after_header(wait_s: float) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(wait_s)))}
