"""The benchmark harness's own parts: the traffic generator, the statistics, the server it
starts and how the freshness bench tells which runs a probe waited on."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import msgspec
import pytest

from bench.freshness import Probe, Run
from bench.generator import Traffic
from bench.stats import percentile, summarize
from mallard.harness import Server, free_port
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


def test_a_server_not_ready_in_time_is_stopped(tmp_path: Path) -> None:
    """A start that times out leaves no `mallard serve` behind (a test fixture that fails in
    its set-up never reaches its teardown)."""
    server = Server(tmp_path, free_port(), creds={})
    with pytest.raises(AssertionError, match="not ready"):
        server.start(timeout=0.01)
    assert server.proc is not None
    assert server.proc.poll() is not None, "the server outlived its failed start"


def test_a_probe_waited_on_the_runs_under_way_until_it_was_seen() -> None:
    served = Run(100.0, 110.0, True, "served")
    rest = Run(110.0, 125.0, True, "rest")
    compaction = Run(125.0, 133.0, True, "compaction")
    after = Run(133.0, 143.0, True, "served")
    runs = [served, rest, compaction, after]
    early = Probe("a", acked=0.0, seen=9.0, acked_at=100.5)  # seen at 109.5
    held = Probe("b", acked=0.0, seen=30.0, acked_at=109.0)  # seen at 139.0
    unseen = Probe("c", acked=0.0, acked_at=101.0)
    assert early.waited_on(runs) == [served]
    assert held.waited_on(runs) == [served, rest, compaction, after]
    assert unseen.waited_on(runs) == []
    assert [r.holds_served for r in runs] == [False, True, True, False]
    assert compaction.seconds == 8.0
