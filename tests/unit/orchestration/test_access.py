"""The Access zip's parts without a server: the README's answers to GDPR Art. 15(1)(a)-(h), the
CSV twins, regulations.json, the atomic write, and an export of a lake with raw messages only
(before the first pipeline run)."""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from mallard.paths import DataPaths
from mallard.regulations import Regulation
from orchestration.regulations import subjects
from orchestration.regulations.access import (
    Facts,
    csv_bytes,
    export_access,
    regulations_json,
    render_readme,
    write_zip,
)
from orchestration.warehouse import lake_connection

CREATED = datetime(2025, 3, 4, 5, 6, 8, tzinfo=UTC)  # zip times have 2 s steps
FILES: list[tuple[str, int | None, str]] = [
    ("profile.json", 1, "profile"),
    ("events.jsonl", 3, "events"),
    ("messages.jsonl", 4, "messages"),
    ("deliveries.jsonl", 0, "deliveries"),
]


def facts(**over: object) -> Facts:
    base: dict[str, object] = {
        "regulation_id": "reg-1",
        "snapshot_id": 42,
        "created_at": CREATED,
        "user_ids": ["u-1"],
        "files": FILES,
        "sources": {("browser", "tag"): 2, ("mobile", "mobile"): 1, ("server", "http"): 1},
        "event_actions": {"page": 2, "logged_in": 1},
        "trait_keys": ["email", "plan"],
        "context_keys": ["ip", "userAgent"],
        "identifier_counts": {"userId": 1, "anonymousId": 2, "email": 1},
        "derived": {"intermediate.int_messages_deduped": 4},
    }
    return Facts(**{**base, **over})  # type: ignore[arg-type]


def sections(readme: str) -> dict[str, str]:
    """Each (a)-(h) section's text, by letter."""
    parts = re.split(r"^## \(([a-h])\) ", readme, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_readme_answers_article_15_1_a_to_h() -> None:
    readme = render_readme(facts())
    s = sections(readme)
    assert sorted(s) == list("abcdefgh")
    # (a) purposes, naming the files that serve each.
    assert "Purposes" in s["a"]
    for name in ("identifiers.json", "profile.json", "events.jsonl", "preferences.json"):
        assert name in s["a"]
    # (b) categories: the traits, event actions and context keys found, with their files.
    assert "Categories" in s["b"]
    for text in ("`plan`", "`email`", "`page` (2)", "`logged_in` (1)", "`userAgent`", "`ip`"):
        assert text in s["b"]
    assert "2 anonymousId" in s["b"] and "events.jsonl" in s["b"]
    # (c) recipients: none, and why deliveries.jsonl is empty.
    assert "Recipients" in s["c"] and "no deliveries table" in s["c"]
    assert "discloses your data to no one" in s["c"]
    # (d) retention: until a Delete; snapshots kept a day by maintenance.
    assert "`DELETE`" in s["d"] and "one day" in s["d"] and "snapshots" in s["d"]
    # (e) the rights and the regulation types that carry them out.
    for text in ("Rectification", "Erasure", "Restriction", "Objection"):
        assert text in s["e"]
    for kind in ("`DELETE`", "`SUPPRESS_WITH_DELETE`", "`SUPPRESS`", "`NO_TRACK`", "`TRACK`"):
        assert kind in s["e"]
    # (f) a complaint to a supervisory authority.
    assert "supervisory authority" in s["f"] and "Art. 77" in s["f"]
    # (g) the channels the messages came through, with counts.
    assert "2 messages through the website tag" in s["g"]
    assert "1 message through the mobile SDK" in s["g"]
    assert "1 message through the server API" in s["g"]
    # (h) no automated decisions; no audience, no journey.
    assert "no decision" in s["h"] and "Art. 22" in s["h"]
    assert "no audience" in s["h"] and "No automated message sequence" in s["h"]
    # The files and the other tables, with their rows.
    assert "| `events.jsonl` | 3 |" in readme
    assert "`intermediate.int_messages_deduped`: 4 rows" in readme
    assert "deliveries.jsonl` (and `deliveries.csv`) is empty" in readme


def test_the_readme_names_recipients_audiences_and_journeys_when_there_are_some() -> None:
    s = sections(
        render_readme(
            facts(
                deliveries_table=True,
                deliveries=2,
                delivery_recipients=["email", "smtp"],
                audiences=["vip"],
                journey_rows=3,
                retention=timedelta(days=2),
            )
        )
    )
    assert "deliver 2 messages to you: `email`, `smtp`" in s["c"]
    assert "deliveries.jsonl" in s["a"] and "deliveries.jsonl" in s["b"]
    assert "2 days" in s["d"]
    assert "`vip`" in s["h"] and "3 rows" in s["h"]
    no_delivery = sections(render_readme(facts(deliveries_table=True)))
    assert "No message has been sent to you" in no_delivery["c"]


def test_the_readme_calls_marts_what_people_read_and_only_other_tables_the_pipelines() -> None:
    derived = {
        "marts.commands": 2,
        "marts.some_new_mart": 1,
        "intermediate.int_some_step": 3,
        "state.some_bookkeeping": 4,
    }
    readme = render_readme(facts(derived=derived))
    assert "internal" not in readme.split("## (a)")[0]
    assert "`marts.commands`: 2 rows, each of your events that asked for a message" in readme
    assert "`marts.some_new_mart`: 1 row, a table the organisation's analysts and systems" in readme
    assert "`intermediate.int_some_step`: 3 rows, a working step of the models" in readme
    assert "`state.some_bookkeeping`: 4 rows, bookkeeping the pipeline keeps" in readme


def test_the_readme_without_messages_says_so() -> None:
    s = sections(render_readme(facts(sources={})))
    assert "holds no message about you" in s["g"]


def test_csv_twins_keep_nested_values_as_json_text_and_every_row() -> None:
    records: list[dict[str, Any]] = [
        {"a": 'x\ny, "quoted"', "n": 1, "obj": {"k": [1, 2]}, "mixed": 1},
        {"a": None, "n": 2.5, "obj": None, "mixed": "text", "late": True},
    ]
    frame = pl.read_csv(io.BytesIO(csv_bytes(records)), infer_schema=False)
    assert frame.columns == ["a", "n", "obj", "mixed", "late"]
    assert frame.height == 2
    assert frame["a"].to_list() == ['x\ny, "quoted"', None]
    assert json.loads(frame["obj"][0]) == {"k": [1, 2]}
    assert frame["mixed"].to_list() == ["1", "text"]
    assert frame["n"].to_list() == ["1.0", "2.5"]
    empty = csv_bytes([], ("eventId", "message"))
    assert empty == b"eventId,message\n"
    assert pl.read_csv(io.BytesIO(empty)).height == 0


def test_regulations_json_never_names_another_user() -> None:
    reg = Regulation(
        "r1", "c", "a", "B", "SUPPRESS", "finished", 1.7e9, 1.7e9, 1.7e9 + 5, ["u-1", "u-2"],
        ["h1", "h2"], None, None, None, None, None, None, 1,
    )  # fmt: skip
    subject = subjects.Subject("a", ["u-1"])
    (item,) = regulations_json([reg], subject)
    assert item == {
        "regulationId": "r1",
        "regulationType": "SUPPRESS",
        "status": "finished",
        "createdAt": "2023-11-14T22:13:20Z",
        "startedAt": "2023-11-14T22:13:20Z",
        "finishedAt": "2023-11-14T22:13:25Z",
        "subjectIds": ["u-1"],
    }
    (given,) = regulations_json([{"regulationId": "r2", "subjectIds": ["u-2", "u-1"]}], subject)
    assert given["subjectIds"] == ["u-1"]


def test_the_zip_replaces_the_old_one_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    out = tmp_path / "access" / "r.zip"
    out.parent.mkdir()
    stale = out.with_name(f"{out.name}.999.tmp")
    stale.write_bytes(b"left by a killed export")
    write_zip(out, [("a.txt", b"one")], CREATED)
    write_zip(out, [("a.txt", b"two"), ("b.txt", b"")], CREATED)
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.zip"]
    assert os.stat(out).st_mode & 0o777 == 0o600
    with zipfile.ZipFile(out) as z:
        assert z.read("a.txt") == b"two" and z.namelist() == ["a.txt", "b.txt"]
        assert z.getinfo("a.txt").date_time == (2025, 3, 4, 5, 6, 8)

    class Boom(Exception):
        pass

    class Failing(bytes):
        def __len__(self) -> int:
            raise Boom

    with pytest.raises(Boom):
        write_zip(out, [("a.txt", Failing(b"x"))], CREATED)
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.zip"]
    with zipfile.ZipFile(out) as z:
        assert z.read("a.txt") == b"two"


def _message(event_id: str, user: str | None, anon: str | None, text: str) -> list[object]:
    t = "2025-01-01 00:00:00+00"
    return [event_id, event_id, "c", "acct", "B", "track", "E", user, anon, t, t, None, "server",
            "http", text, "f.parquet", t]  # fmt: skip


def test_a_lake_with_raw_messages_only_exports_them(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    conn = lake_connection(paths)
    try:
        rows = [
            _message("e1", "u-1", None, '{"userId":"u-1","event":"E","n":1}'),
            # Not what the collector writes (compact JSON), but valid: embedded re-encoded.
            _message("e2", "u-1", "a-1", '{"userId": "u-1",\n "event": "E"}'),
            _message("e3", "u-2", None, '{"userId":"u-2"}'),
        ]
        for row in rows:
            conn.execute(f"insert into lake.raw.messages values ({', '.join('?' * len(row))})", row)
        subject = subjects.resolve(conn, "acct", ["u-1"])
        out = tmp_path / "access" / "x.zip"
        manifest = export_access(conn, subject, out, regulation_id="x")
        # The read transaction is over: the connection takes another.
        conn.execute("begin transaction")
        conn.execute("rollback")
        with pytest.raises(ValueError, match="snapshot 999999"):
            export_access(conn, subject, out, regulation_id="x", snapshot_id=999999)
        conn.execute("begin transaction")
        conn.execute("rollback")
    finally:
        conn.close()
    assert manifest["rows_by_table"]["raw.messages"] == 2
    with zipfile.ZipFile(out) as z:
        lines = z.read("messages.jsonl").decode().splitlines()
        assert json.loads(z.read("profile.json")) == []
        assert z.read("events.jsonl") == b""
        assert json.loads(z.read("identifiers.json")) == []
        assert z.read("deliveries.jsonl") == b""
        assert z.read("events.csv").decode().startswith("id,customerId,")
    items = [json.loads(line) for line in lines]
    assert [i["eventId"] for i in items] == ["e1", "e2"]
    assert '"message":{"userId":"u-1","event":"E","n":1}}' in lines[0]
    assert items[1]["message"] == {"userId": "u-1", "event": "E"}
