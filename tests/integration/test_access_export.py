"""The Access zip against a real server and pipeline, checked field by field against the marts.

One module-scoped server (with preference choices configured). Two users, each with anonymous
activity before the identify that ties it to them; the subject also sends from the tag and a
mobile batch, sends one messageId twice, and changes a marketing preference through the API.
One pipeline run, then the export of the subject, read back from the zip.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from mallard.paths import DataPaths
from mallard.regulations import Regulation
from orchestration.regulations import subjects
from orchestration.regulations.access import DERIVED, EXPORTED, export_access
from orchestration.warehouse import lake_connection
from tests.conftest import wait_landed
from tests.integration.prefs_support import PrefsEnv, start_prefs_env

pytestmark = pytest.mark.integration

RUN = secrets.token_hex(4)
ALICE, BOB = f"acc-{RUN}-alice", f"acc-{RUN}-bob"
ANON_A, ANON_B = f"acc-{RUN}-anon-a", f"acc-{RUN}-anon-b"
EMAIL_A, EMAIL_B = f"acc-{RUN}-alice@example.com", f"acc-{RUN}-bob@example.com"
DUPLICATE_ID = f"acc-{RUN}-order-1"
STD = "/cdp/events/std"


@dataclass
class World:
    env: PrefsEnv
    paths: DataPaths
    account: str
    sent: dict[str, list[str]]  # userId -> eventIds the collector acknowledged for them
    first_snapshot: int  # the lake after the first pipeline run (identifies only)
    zip_path: Path
    manifest: dict[str, Any]
    files: dict[str, bytes]
    subject: subjects.Subject

    def lines(self, name: str) -> list[str]:
        return self.files[name].decode().splitlines()

    def query(self, sql: str, params: Any = ()) -> list[Any]:
        conn = lake_connection(self.paths)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefsEnv]:
    users = {ALICE: {"email": EMAIL_A, "plan": "basic"}, BOB: {"email": EMAIL_B}}
    yield from start_prefs_env(tmp_path_factory.mktemp("access"), users)


def _ok(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    body = r.json()
    return list(body.get("eventIds") or [body["eventId"]])


def _regulation(reg_id: str, kind: str, user_ids: list[str]) -> Regulation:
    now = time.time()
    return Regulation(
        reg_id, "demo", "demo", "DEMO", kind, "running", now, now, None, user_ids, [], None,
        None, None, None, None, None, 1,
    )  # fmt: skip


@pytest.fixture(scope="module")
def world(env: PrefsEnv, tmp_path_factory: pytest.TempPathFactory) -> World:
    server = env.server
    paths = DataPaths(server.data_dir)
    account = server.creds["accountId"]
    key = server.creds["writeKey"]
    conn = lake_connection(paths)
    try:
        row = conn.execute("select id from lake.current_snapshot()").fetchone()
        assert row is not None
        first_snapshot = int(row[0])
    finally:
        conn.close()

    def std(path: str, body: dict[str, Any]) -> list[str]:
        return _ok(httpx.post(f"{server.url}{STD}/{path}", json={**body, "writeKey": key}))

    sent: dict[str, list[str]] = {ALICE: [], BOB: []}
    # Alice: anonymous on the website first, then identified with that anonymousId.
    sent[ALICE] += std("p", {"anonymousId": ANON_A, "name": "Pricing", "properties": {"p": 1}})
    sent[ALICE] += std(
        "t",
        {
            "anonymousId": ANON_A,
            "event": "Viewed Plan",
            "properties": {"note": 'two\nlines, quotes " and ünïcödé'},
            "context": {"userAgent": "Mozilla/5.0 (test)"},
        },
    )
    sent[ALICE] += _ok(
        server.post(
            "identify",
            {
                "userId": ALICE,
                "anonymousId": ANON_A,
                "event": "identify",
                "traits": {"plan": "pro", "firstName": "Al"},
            },
        )
    )
    # The preference change, before the messages the test waits for: it goes through the same
    # collector log, so once they have landed it has too.
    r = env.post(
        ALICE,
        {
            "channels": [{"channel": "email", "subscribed": True}],
            "categories": [{"category": "offers", "subscribed": False}],
        },
    )
    assert r.status_code == 200, r.text
    sent[ALICE] += _ok(
        httpx.post(
            f"{server.url}{STD}/mobile/batch",
            json={
                "writeKey": key,
                "batch": [
                    {"type": "screen", "userId": ALICE, "name": "Home"},
                    {"type": "track", "userId": ALICE, "event": "Opened App"},
                ],
            },
            timeout=30,
        )
    )
    order = {"userId": ALICE, "event": "Order Completed", "messageId": DUPLICATE_ID}
    sent[ALICE] += _ok(server.post("track", {**order, "properties": {"total": 12.5}}))
    sent[ALICE] += _ok(server.post("track", {**order, "properties": {"total": 99}}))
    sent[ALICE] += _ok(server.post("page", {"userId": ALICE, "event": "page", "name": "Account"}))
    # Bob: the same shape, on the server API.
    sent[BOB] += _ok(server.post("track", {"anonymousId": ANON_B, "event": "Viewed Plan"}))
    sent[BOB] += _ok(
        server.post(
            "identify",
            {"userId": BOB, "anonymousId": ANON_B, "event": "identify", "traits": {"plan": "x"}},
        )
    )
    sent[BOB] += _ok(server.post("track", {"userId": BOB, "event": "Order Completed"}))
    sent[BOB] += _ok(server.post("page", {"userId": BOB, "event": "page", "name": "Account"}))
    wait_landed(server.data_dir, sent[ALICE] + sent[BOB])
    server.pipeline()

    out = tmp_path_factory.mktemp("zips") / "access.zip"
    conn = lake_connection(paths)
    try:
        subject = subjects.resolve(conn, account, [ALICE])
        regs = [
            _regulation("reg-access", "ACCESS", [ALICE, BOB]),
            _regulation("reg-notrack", "NO_TRACK", [BOB]),
        ]
        manifest = export_access(
            conn, subject, out, regulation_id="reg-access", regulations=regs[:1]
        )
    finally:
        conn.close()
    with zipfile.ZipFile(out) as z:
        files = {n: z.read(n) for n in z.namelist()}
    return World(env, paths, account, sent, first_snapshot, out, manifest, files, subject)


def _customer_id(world: World, user: str) -> str:
    r = world.env.server.get(f"profiles/userId:{user}/traits")
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def test_the_zip_is_written_whole_for_its_owner_only(world: World) -> None:
    assert os.stat(world.zip_path).st_mode & 0o777 == 0o600
    assert [p.name for p in world.zip_path.parent.iterdir()] == [world.zip_path.name]
    with zipfile.ZipFile(world.zip_path) as z:
        assert z.testzip() is None


def test_manifest_lists_every_file_with_its_hash_size_and_rows(world: World) -> None:
    import hashlib

    m = json.loads(world.files["manifest.json"])
    assert m == world.manifest
    assert m["regulation_id"] == "reg-access"
    current = world.query("select id from lake.current_snapshot()")[0][0]
    assert m["snapshot_id"] == current
    assert {f["name"] for f in m["files"]} == set(world.files) - {"manifest.json"}
    for f in m["files"]:
        data = world.files[f["name"]]
        assert f["sha256"] == hashlib.sha256(data).hexdigest(), f["name"]
        assert f["bytes"] == len(data), f["name"]
    stems = [
        "profile",
        "events",
        "messages",
        "trait_history",
        "identifiers",
        "identifier_sightings",
        "preferences",
        "deliveries",
        "regulations",
    ]
    rows = {f["name"]: f["rows"] for f in m["files"]}
    for stem in stems:
        json_name = next(n for n in (f"{stem}.json", f"{stem}.jsonl") if n in world.files)
        data = world.files[json_name]
        count = len(json.loads(data)) if json_name.endswith(".json") else len(data.splitlines())
        assert rows[json_name] == count, json_name
        assert rows[f"{stem}.csv"] == count, stem
    assert m["subject"]["user_ids"] == [ALICE]
    assert ANON_A in m["subject"]["anonymous_ids"] and ANON_B not in m["subject"]["anonymous_ids"]


def test_events_are_the_marts_records_of_the_subject_byte_for_byte(world: World) -> None:
    cid = _customer_id(world, ALICE)
    marts = dict(
        world.query(
            "select event_id, record::varchar from lake.marts.events where customer_id = ?", [cid]
        )
    )
    lines = world.lines("events.jsonl")
    by_id = {json.loads(line)["eventId"]: line for line in lines}
    assert len(by_id) == len(lines)
    assert by_id == marts
    # Every acknowledged message of Alice is an event (the anonymous ones before the identify
    # too), except the second copy of the duplicated messageId; none of Bob's is.
    assert len(set(world.sent[ALICE]) - set(by_id)) == 1
    assert not set(world.sent[BOB]) & set(by_id)
    records = [json.loads(line) for line in lines]
    assert {r["customerId"] for r in records} == {cid}
    actions = Counter(r["eventAction"] for r in records)
    assert actions["page"] == 2 and actions["viewed_plan"] == 1 and actions["order_completed"] == 1
    assert actions["preferences_updated"] == 1 and actions["screen"] == 1


def test_messages_are_the_raw_messages_as_received(world: World) -> None:
    raw = dict(
        world.query(
            "select event_id, message from lake.raw.messages where account_id = ?"
            " and (user_id = ? or (user_id is null and anonymous_id = ?))",
            [world.account, ALICE, ANON_A],
        )
    )
    lines = world.lines("messages.jsonl")
    got = {json.loads(line)["eventId"]: line for line in lines}
    assert set(got) == set(raw)
    assert len(got) == len(lines)
    for event_id, line in got.items():
        item = json.loads(line)
        # The stored message, byte for byte, inside the line; and the same JSON when parsed.
        assert raw[event_id] in line
        assert item["message"] == json.loads(raw[event_id])
        assert item["message"]["eventId"] == event_id
        assert item["receivedAt"] and item["channel"] and item["source"]
    # Both copies of the duplicated messageId, the anonymous tag messages, the mobile batch.
    assert set(world.sent[ALICE]) <= set(got)
    assert not set(world.sent[BOB]) & set(got)
    copies = [i for i in map(json.loads, lines) if i["message"]["messageId"] == DUPLICATE_ID]
    assert len(copies) == 2
    sources = Counter((i["channel"], i["source"]) for i in map(json.loads, lines))
    assert sources[("browser", "tag")] == 2 and sources[("mobile", "mobile")] == 2
    assert sources[("server", "preferences")] == 1
    blob = b"".join(world.files.values())
    for other in (BOB, ANON_B, EMAIL_B):
        assert other.encode() not in blob


def test_profile_and_identifiers_are_what_the_profile_api_answers(world: World) -> None:
    server = world.env.server
    profile = json.loads(world.files["profile.json"])
    assert len(profile) == 1
    (customer,) = profile
    traits = server.get(f"profiles/userId:{ALICE}/traits").json()
    meta = server.get(f"profiles/userId:{ALICE}/meta").json()
    ids = server.get(f"profiles/userId:{ALICE}/external_ids").json()["data"]
    assert customer["traits"] == traits
    assert customer["metadata"] == meta
    assert customer["customerId"] == traits["id"] and customer["userId"] == ALICE
    assert traits["plan"] == "pro" and traits["email"] == EMAIL_A
    identifiers = json.loads(world.files["identifiers.json"])
    assert identifiers == ids
    assert customer["identifiers"] == [
        {k: v for k, v in i.items() if k != "customerId"} for i in ids
    ]
    assert {(i["type"], i["id"]) for i in ids} >= {
        ("userId", ALICE),
        ("anonymousId", ANON_A),
        ("email", EMAIL_A),
    }
    sightings = [json.loads(line) for line in world.lines("identifier_sightings.jsonl")]
    stored = world.query(
        "select id_type, id_value from lake.state.customer_identifier_sightings"
        " where customer_id = ?",
        [traits["id"]],
    )
    assert Counter((s["type"], s["id"]) for s in sightings) == Counter(stored)


def test_trait_history_and_preferences_are_the_models_rows(world: World) -> None:
    cid = _customer_id(world, ALICE)
    history = [json.loads(line) for line in world.lines("trait_history.jsonl")]
    stored = world.query(
        "select event_id, trait_key, trait_value::varchar from lake.intermediate.int_trait_history"
        " where customer_id = ?",
        [cid],
    )
    assert sorted((h["eventId"], h["traitKey"], h["traitValue"]) for h in history) == sorted(
        (e, k, json.loads(v)) for e, k, v in stored
    )
    assert [h["traitValue"] for h in history if h["traitKey"] == "plan"] == ["basic", "pro"]

    (prefs,) = json.loads(world.files["preferences.json"])
    (row,) = world.query(
        "select subscription_id, marketing_preferences::varchar, state::varchar"
        " from lake.marts.customer_preferences where customer_id = ?",
        [cid],
    )
    assert prefs["customerId"] == cid and prefs["subscriptionId"] == row[0]
    assert prefs["marketingPreferences"] == json.loads(row[1])
    assert prefs["changes"] == json.loads(row[2])
    # The change made through the preferences API, as that API answers it.
    api = world.env.get(ALICE).json()
    channels = {c["channel"]: c["subscribed"] for c in api["channels"]}
    categories = {c["name"]: c["subscribed"] for c in api["categories"]}
    assert prefs["marketingPreferences"]["channels"] == [{"channel": "email", "subscribed": True}]
    assert prefs["marketingPreferences"]["categories"] == [
        {"category": "offers", "subscribed": False}
    ]
    assert channels["email"] is True and categories["offers"] is False


def test_csv_twins_have_the_rows_and_values_of_their_files(world: World) -> None:
    for name in world.files:
        if not name.endswith(".csv"):
            continue
        stem = name.removesuffix(".csv")
        twin = f"{stem}.json" if f"{stem}.json" in world.files else f"{stem}.jsonl"
        data = world.files[twin]
        records = (
            json.loads(data)
            if twin.endswith(".json")
            else [json.loads(line) for line in data.splitlines()]
        )
        frame = pl.read_csv(io.BytesIO(world.files[name]), infer_schema=False)
        assert frame.height == len(records), name
    events = pl.read_csv(io.BytesIO(world.files["events.csv"]), infer_schema=False)
    records = {
        json.loads(line)["eventId"]: json.loads(line) for line in world.lines("events.jsonl")
    }
    for row in events.iter_rows(named=True):
        record = records[row["eventId"]]
        assert json.loads(row["rawData"]) == record["rawData"]
        assert row["eventAction"] == record["eventAction"]
    messages = pl.read_csv(io.BytesIO(world.files["messages.csv"]), infer_schema=False)
    raw = dict(
        world.query(
            "select event_id, message from lake.raw.messages where event_id in (select unnest(?))",
            [messages["eventId"].to_list()],
        )
    )
    # The message column holds the stored text exactly (line breaks inside values included).
    assert dict(zip(messages["eventId"], messages["message"], strict=True)) == raw


def test_rows_by_table_are_the_rows_a_delete_of_the_subject_removes(world: World) -> None:
    conn = lake_connection(world.paths)
    try:
        expected = {
            sel.name: subjects.count(conn, sel) for sel in subjects.selections(conn, world.subject)
        }
        tables = [f"{schema}.{table}" for schema, table in subjects.lake_tables(conn)]
    finally:
        conn.close()
    # A finished pass leaves none of dbt's replaced tables behind (a model committing with
    # companions, customer_profiles, once kept its backup, rows of every customer included).
    assert not [t for t in tables if t.endswith(("__dbt_backup", "__dbt_tmp"))], tables
    assert world.manifest["rows_by_table"] == expected
    counts = {f["name"]: f["rows"] for f in world.manifest["files"]}
    for table, name in world.manifest["exported_tables"].items():
        assert counts[name] == expected[table], table
    assert set(world.manifest["exported_tables"]) == {
        "raw.messages",
        "marts.events",
        "intermediate.int_trait_history",
        "state.customer_identifier_sightings",
        "marts.customer_profiles",
        "marts.deliveries",
    }
    assert expected["raw.messages"] == len(world.sent[ALICE]) + 2  # + the first identify, prefs
    # Every table holding the subject's rows is a file of the zip or named in its README.
    assert not set(expected) - set(EXPORTED) - set(DERIVED)


def test_regulations_json_names_only_the_subject(world: World) -> None:
    (reg,) = json.loads(world.files["regulations.json"])
    assert reg["regulationId"] == "reg-access" and reg["regulationType"] == "ACCESS"
    assert reg["subjectIds"] == [ALICE]


def test_readme_names_the_channels_the_messages_came_through(world: World) -> None:
    readme = world.files["README.md"].decode()
    for source in ("`tag`", "`mobile`", "`http`", "`preferences`"):
        assert f"source {source}" in readme
    assert "userAgent" in readme  # a context key the tag message carried
    assert "`deliveries.jsonl`" in readme
    for letter in "abcdefgh":
        assert f"## ({letter})" in readme


def test_an_earlier_snapshot_is_exported_as_it_was(world: World, tmp_path: Path) -> None:
    conn = lake_connection(world.paths)
    try:
        m = export_access(
            conn,
            world.subject,
            tmp_path / "earlier.zip",
            regulation_id="reg-earlier",
            snapshot_id=world.first_snapshot,
        )
        with pytest.raises(ValueError, match="snapshot"):
            export_access(
                conn, world.subject, tmp_path / "x.zip", regulation_id="r", snapshot_id=10**9
            )
    finally:
        conn.close()
    assert m["snapshot_id"] == world.first_snapshot
    # Then Alice had one message, her first identify.
    assert m["rows_by_table"]["raw.messages"] == 1
    assert m["rows_by_table"]["marts.events"] == 1
    with zipfile.ZipFile(tmp_path / "earlier.zip") as z:
        (customer,) = json.loads(z.read("profile.json"))
    assert customer["traits"]["plan"] == "basic"
    assert not (tmp_path / "x.zip").exists()


def test_a_deliveries_table_gives_deliveries_and_recipients(world: World, tmp_path: Path) -> None:
    cid = _customer_id(world, ALICE)
    other = _customer_id(world, BOB)
    conn = lake_connection(world.paths)
    rows = [("d-alice", cid, "email"), ("d-bob", other, "sms")]
    try:
        conn.executemany(
            "insert into lake.marts.deliveries (event_id, send_id, asset_id, send_type, outcome,"
            " customer_id, event_time) values (?, 's-' || ?, 'welcome', ?, 'sent', ?,"
            " '2025-01-02 03:04:05+00')",
            [[e, e, t, c] for e, c, t in rows],
        )
        m = export_access(conn, world.subject, tmp_path / "d.zip", regulation_id="reg-d")
    finally:
        conn.execute("delete from lake.marts.deliveries where event_id in ('d-alice', 'd-bob')")
        conn.close()
    assert m["rows_by_table"]["marts.deliveries"] == 1
    with zipfile.ZipFile(tmp_path / "d.zip") as z:
        lines = z.read("deliveries.jsonl").decode().splitlines()
        readme = z.read("README.md").decode()
        csv = pl.read_csv(io.BytesIO(z.read("deliveries.csv")), infer_schema=False)
    (record,) = [json.loads(line) for line in lines]
    assert (record["customerId"], record["sendType"], record["assetId"], record["outcome"]) == (
        cid,
        "email",
        "welcome",
        "sent",
    )
    assert record["eventTime"] == "2025-01-02T03:04:05Z"
    assert csv.height == 1 and csv["sendId"][0] == "s-d-alice"
    assert "deliver 1 message to you: `email`." in readme
