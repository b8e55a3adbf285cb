"""mallard.importer's columnar build of the stored messages, against the per-row build it
replaced: the same messageIds (a file imported before is a no-op again) and the same records."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import polars as pl
import pyarrow as pa
import pytest

from collector.messages import Tenant
from collector.wal import frame, read_records
from mallard import importer
from mallard.importer import chunk_messages, heads, landing_table, message_ids, stamping
from mallard.paths import DataPaths

# What each messageId hashes first: the account and the file's SHA-256.
PREFIX = b"shop:" + b"d" * 64 + b":"


def per_row_heads(df: pl.DataFrame) -> list[str]:
    """The heads the per-row build made (150bc70): polars' JSON of {userId, traits}; a row with
    a null trait decoded, its nulls left out and encoded again by msgspec."""
    traits = [c for c in df.columns if c != "userId"]
    fields = [pl.col("userId")]
    if traits:
        fields.append(pl.struct([pl.col(c).alias(c[7:]) for c in traits]).alias("traits"))
    nulls = pl.any_horizontal([pl.col(c).is_null() for c in traits]) if traits else pl.lit(False)
    rows = df.select(pl.struct(fields).struct.json_encode().alias("h"), nulls.alias("n"))
    out = []
    for head, null in rows.iter_rows():
        if null:
            obj = msgspec.json.decode(head)
            obj["traits"] = {k: v for k, v in obj["traits"].items() if v is not None}
            head = msgspec.json.encode(obj).decode()
        if not head.endswith("}}"):
            head = head[:-1] + ',"traits":{}}'
        out.append(head)
    return out


def per_row_message_id(head: str) -> str:
    return "import:" + hashlib.sha256(PREFIX + head.encode()).hexdigest()[:32]


FRAMES = {
    # As a CSV reads: every value text, empty cells null.
    "csv": pl.DataFrame(
        {
            "userId": ["u1", "u2", 'q"uo\\te', "ünï😀", "ctl\n\t\x01", "u6"],
            "traits.email": ["a@b.co", None, "c@d.co", None, None, "e@f.co"],
            "traits.plan": ["pro", "free", None, "team", None, "</script>"],
            "traits.first Name": [None, "Ann", "Bo", "Çé", None, "x"],
        }
    ),
    # As JSON lines or Parquet read: typed values, floats with exponents, nested values.
    "typed": pl.DataFrame(
        {
            "userId": ["a", "b", "c", "d", "e"],
            "traits.score": [1e20, None, 0.1, 2.5e-7, -3.0e300],
            "traits.age": [41, 7, None, 2**62, -1],
            "traits.vip": [True, None, False, True, None],
            "traits.tags": [["x", "y"], None, [], ["z"], None],
            "traits.address": [
                {"city": "Lyon", "zip": "69001"},
                None,
                {"city": None, "zip": "1"},
                {"city": "Ghent", "zip": None},
                None,
            ],  # fmt: skip
        }
    ),
    # A float inside a struct or list on rows with a null trait: re-encoded row by row.
    "nested floats": pl.DataFrame(
        {
            "userId": ["a", "b", "c", "d"],
            "traits.geo": [
                {"lat": 1e21, "lon": 0.5},
                None,
                {"lat": 2.0, "lon": None},
                {"lat": 3e22, "lon": 1.0},
            ],  # fmt: skip
            "traits.scores": [[1e25], [1e25, None], None, [0.25]],
            "traits.plan": [None, "pro", "free", "team"],
        }
    ),
    "no traits": pl.DataFrame({"userId": ["a", "b}", 'c"}']}),
    "all null": pl.DataFrame(
        {"userId": ["a", "b"], "traits.x": [None, None], "traits.y": [None, 1.5e30]}
    ),
}


@pytest.mark.parametrize("name", FRAMES)
def test_heads_and_message_ids_are_the_per_row_builds(name: str) -> None:
    df = FRAMES[name]
    expected = per_row_heads(df)
    got = heads(df)
    assert got["userId"].to_list() == df["userId"].to_list()
    assert got["head"].to_list() == expected
    ids = message_ids(pa.array(got["head"].to_list(), pa.string()), PREFIX)
    assert ids.to_pylist() == [per_row_message_id(h) for h in expected]
    # An array that starts inside its buffers (a slice) hashes its own values.
    tail = message_ids(pa.array(["x", *got["head"].to_list()], pa.string()).slice(1), PREFIX)
    assert tail.to_pylist() == ids.to_pylist()


def test_a_long_float_column_with_nulls_keeps_its_ids() -> None:
    # Exponents in polars' and msgspec's float text differ: many random floats, half the rows
    # with a null beside them.
    import random

    rnd = random.Random(7)
    n = 5_000
    df = pl.DataFrame(
        {
            "userId": [f"u{i}" for i in range(n)],
            "traits.f": [rnd.uniform(-1, 1) * 10 ** rnd.randint(-30, 30) for _ in range(n)],
            "traits.s": [None if i % 2 else "x" for i in range(n)],
        }
    )
    assert heads(df)["head"].to_list() == per_row_heads(df)


def test_chunk_records_landing_table_and_log_frames_agree() -> None:
    tenant = Tenant("acme", "shop", "SHOP")
    st = stamping(tenant, "d" * 64, "crm.csv", datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC))
    assert st.prefix == PREFIX
    df = FRAMES["csv"]
    part = heads(df)
    keep = [True, False, True, True, True, False]
    chunk = chunk_messages(part, st, keep)
    kept = [h for h, k in zip(part["head"], keep, strict=True) if k]
    assert len(chunk) == 4

    records = [msgspec.json.decode(m) for m in chunk.messages.to_pylist()]
    assert [r["messageId"] for r in records] == [per_row_message_id(h) for h in kept]
    assert [r["eventId"] for r in records] == chunk.event_ids.to_pylist()
    assert len(set(chunk.event_ids.to_pylist())) == 4
    first = records[0]
    assert {k: first[k] for k in ("userId", "traits", "type", "channel", "source")} == {
        "userId": "u1",
        "traits": {"email": "a@b.co", "plan": "pro"},
        "type": "identify",
        "channel": "import",
        "source": "import",
    }
    assert first["context"]["mallardImport"] == {
        "filename": "crm.csv",
        "createdTime": "2026-03-04T05:06:07.891Z",
    }
    assert (first["clientId"], first["accountId"], first["brandId"]) == ("acme", "shop", "SHOP")
    # The record is the head's members, then messageId, eventId and the stamped fields, as the
    # per-row build wrote it.
    assert chunk.messages.to_pylist() == [
        f'{h[:-1]},"messageId":"{r["messageId"]}","eventId":"{r["eventId"]}",{st.tail}}}'
        for h, r in zip(kept, records, strict=True)
    ]

    # Every row of a chunk dropped (a file of suppressed users only): nothing to store.
    assert len(chunk_messages(part, st, [False] * len(keep))) == 0

    table = landing_table(chunk, st).to_pydict()
    assert table["message"] == chunk.messages.to_pylist()
    assert table["user_id"] == [r["userId"] for r in records]
    assert table["message_id"] == [r["messageId"] for r in records]
    assert set(table["received_at"]) == {datetime(2026, 3, 4, 5, 6, 7, 891000, tzinfo=UTC)}
    assert set(table["brand_id"]) == {"SHOP"} and set(table["event"]) == {None}


def test_a_sealed_segment_holds_the_records_of_an_arrow_array(tmp_path: Path) -> None:
    values = ['{"a":1}', "", "ünï😀" * 50, "x"]
    arr = pa.array(["skipped", *values], pa.string()).slice(1)  # an offset into the buffers
    log = importer.ImportLog(DataPaths(tmp_path))
    try:
        sealed = log.seal(arr)
    finally:
        log.close()
    assert [r.decode() for r in read_records(sealed)] == values
    assert sealed.read_bytes() == b"".join(frame(v.encode()) for v in values)
