"""The benchmark harness's own parts: the traffic generator and the statistics."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import msgspec
import pytest

from bench.generator import Traffic
from bench.stats import percentile, summarize
from mallard.schemas import LANDING_SCHEMA


def test_percentile_interpolates() -> None:
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_summarize() -> None:
    s = summarize([3.0, 1.0, 2.0])
    assert s == {
        "count": 3.0,
        "mean": 2.0,
        "p50": 2.0,
        "p95": pytest.approx(2.9),
        "p99": pytest.approx(2.98),
        "max": 3.0,
    }


def test_generator_is_reproducible_and_sized() -> None:
    a = [m["messageId"] for m in Traffic(seed=7, customers=50, events=500).client_messages()]
    b = [m["messageId"] for m in Traffic(seed=7, customers=50, events=500).client_messages()]
    c = [m["messageId"] for m in Traffic(seed=8, customers=50, events=500).client_messages()]
    assert a == b and a != c
    assert len(a) == 500


def test_generator_has_the_traffic_features() -> None:
    msgs = list(
        Traffic(
            seed=1, customers=200, events=5000, duplicate_rate=0.05, late_rate=0.05, skew_rate=0.1
        ).client_messages()
    )
    kinds = Counter(m["type"] for m in msgs)
    assert set(kinds) == {"identify", "track", "page", "screen"}
    assert kinds["track"] > kinds["page"] > kinds["screen"]
    ids = Counter(m["messageId"] for m in msgs)
    assert sum(1 for n in ids.values() if n > 1) > 50  # retries
    assert any("sentAt" in m for m in msgs)  # skewed clocks
    # Anonymous visitors who later identify: an anonymousId seen alone, then on an identify.
    anon_only = {m["anonymousId"] for m in msgs if "userId" not in m}
    identified = {m["anonymousId"] for m in msgs if m["type"] == "identify"}
    assert anon_only & identified
    assert anon_only - identified  # and some who never do

    def lag_hours(m: dict[str, object]) -> float:
        ts = datetime.fromisoformat(str(m["timestamp"]).replace("Z", "+00:00"))
        return (m["_receivedAt"] - ts).total_seconds() / 3600  # type: ignore[operator]

    assert sum(1 for m in msgs if "sentAt" not in m and lag_hours(m) > 1) > 50


def test_landing_batches_match_the_landing_schema() -> None:
    tables = list(Traffic(seed=3, customers=20, events=250).landing_batches(rows_per_batch=100))
    assert [t.num_rows for t in tables] == [100, 100, 50]
    assert all(t.schema == LANDING_SCHEMA for t in tables)
    stored = msgspec.json.decode(tables[0].column("message")[0].as_py())
    assert stored["eventId"] == tables[0].column("event_id")[0].as_py()
    assert {"receivedAt", "timestamp", "channel", "version", "clientId"} <= set(stored)
