"""The benchmark lake's parts: traffic split into parallel parts, stamped like the collector,
landed through the roller; lake sizes."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from bench.generator import Traffic, event_id
from bench.lake import QUICK, sizes, write_landing
from mallard.paths import DataPaths
from mallard.schemas import LANDING_SCHEMA
from orchestration.load import landing_files


def test_split_parts_cover_the_traffic_with_disjoint_customers() -> None:
    whole = Traffic(seed=5, customers=101, events=3001)
    parts = whole.split(3)
    assert [p.events for p in parts] == [1001, 1000, 1000]
    customers: list[set[str]] = []
    messages: Counter[str] = Counter()
    for part in parts:
        msgs = list(part.client_messages())
        assert len(msgs) == part.events
        ids = {m.get("userId") or m["anonymousId"].replace("anon-5-", "user-") for m in msgs}
        assert all(int(i.split("-")[1]) % 3 == part.part for i in ids)
        assert all(int(i.split("-")[1]) < 101 for i in ids)
        customers.append(ids)
        messages.update({m["messageId"] for m in msgs})
    assert not (customers[0] & customers[1]) and not (customers[1] & customers[2])
    assert max(messages.values()) == 1  # messageIds never repeat across parts
    with pytest.raises(ValueError):
        parts[0].split(2)


def test_parts_are_reproducible() -> None:
    a = [m["messageId"] for m in Traffic(seed=9, events=400).split(2)[1].client_messages()]
    b = [m["messageId"] for m in Traffic(seed=9, events=400).split(2)[1].client_messages()]
    assert a == b


def test_event_ids_are_uuid7_shaped_and_ordered_by_receipt() -> None:
    t = Traffic(seed=2, customers=30, events=300)
    stored = [msgspec.json.decode(r) for r in t.stored_messages()]
    ids = [s["eventId"] for s in stored]
    assert len(set(ids)) == len(ids)
    assert all(uuid.UUID(i).version == 7 for i in ids)
    # Time-ordered by receipt, as the collector's ids (duplicates are received later).
    by_time = sorted(stored, key=lambda s: (s["receivedAt"], s["eventId"]))
    assert [s["eventId"][:13] for s in by_time] == sorted(s["eventId"][:13] for s in stored)
    part = t.split(2)[0]
    other = {msgspec.json.decode(r)["eventId"] for r in part.stored_messages()}
    assert not other & set(ids)
    assert event_id(t.start, 1, 2) != event_id(t.start, 2, 1)


def test_stored_messages_carry_the_collector_stamp() -> None:
    t = Traffic(seed=4, customers=10, events=200, skew_rate=0.5)
    stored = [msgspec.json.decode(r) for r in t.stored_messages()]
    for s in stored:
        assert {"eventId", "messageId", "receivedAt", "timestamp", "channel", "version"} <= set(s)
        assert (s["clientId"], s["accountId"], s["brandId"]) == ("bench", "bench", "BENCH")
        assert s["channel"] == "server" and s["source"] == "http"
    skewed = [s for s in stored if "sentAt" in s]
    assert skewed and all("originalTimestamp" in s for s in skewed)


def test_write_landing_goes_through_the_roller(tmp_path: Path) -> None:
    t = Traffic(seed=3, customers=20, events=500, span_days=3)
    rows, files = write_landing(tmp_path, t, "gen0", rows_per_file=200)
    assert rows == 500
    names = landing_files(DataPaths(tmp_path))
    assert len(names) == files >= 3  # three segments, each split by receive date
    assert all(n.split("/")[1].startswith("gen0-") for n in names)
    tables = [pq.read_table(tmp_path / "landing" / n) for n in names]
    assert all(tb.schema.equals(LANDING_SCHEMA) for tb in tables)
    assert sum(tb.num_rows for tb in tables) == 500
    for n, tb in zip(names, tables, strict=True):
        day = n.split("/")[0].removeprefix("date=")
        assert {r.date().isoformat() for r in tb.column("received_at").to_pylist()} == {day}
    # A second model lands after the first, never over its files.
    write_landing(tmp_path, Traffic(seed=4, customers=20, events=50), "gen0")
    assert len(landing_files(DataPaths(tmp_path))) > files
    assert not list(tmp_path.glob("tmp*"))  # the temporary log segment dir is gone


def test_sizes() -> None:
    assert sizes(False, None, None) == QUICK
    assert sizes(True, None, None) == (10_000_000, 1_000_000)
    assert sizes(False, 200_000, None) == (200_000, 20_000)
    assert sizes(True, 5000, 7) == (5000, 7)
    assert sizes(False, None, 3) == (QUICK[0], 3)
