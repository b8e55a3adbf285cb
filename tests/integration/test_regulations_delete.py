"""A SUPPRESS_WITH_DELETE through HTTP on a real server, collector and pipeline, proven the way a
privacy officer would have to: nothing of the subject anywhere in the data dir (the local
mailbox's messages to or about them included), no process holding a deleted file open, no
profile answer, no audience, journey or mail of theirs, no time travel back, and a rebuild
from the landing files equal to the incremental state (so the other customers, one of whom
shared an anonymousId with the subject, equal a build that never saw the subject)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import smtplib
import sqlite3
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow.parquet as pq
import pytest
from aiosmtpd.controller import Controller

from mallard import mailbox as local_mailbox
from mallard.mailbox import MailboxHandler
from mallard.paths import DataPaths
from orchestration.warehouse import lake_connection
from tests.conftest import REPO, free_port, mallard, wait_landed
from tests.integration.prefs_support import PrefsEnv, start_prefs_env

pytestmark = pytest.mark.integration

U = secrets.token_hex(4)
SUBJECT = f"subj-{U}"
NEIGHBOUR = f"nb-{U}"
OTHER = f"other-{U}"
EMAIL = f"subj-{U}@example.test"
OTHER_EMAIL = f"other-{U}@example.test"
ANON = f"anon-subj-{U}"
SHARED = f"anon-shared-{U}"
# A visitor the subject's alias links to them, and a group both the subject and the neighbour
# named (the subject's call set a trait holding their email).
ALIASED = f"anon-aliased-{U}"
GROUP = f"g-{U}"
# Values only the subject's messages carry, each a random string found nowhere else: the trait
# values, page path, sku, group trait and journey data the test sends for them. After the
# Delete none may be left, as no identifier may.
TOKEN = secrets.token_hex(6)
FIRST_NAME, LAST_NAME = f"fn{TOKEN}a", f"ln{TOKEN}b"
PLAN, LATER_PLAN, CITY = f"pro{TOKEN}c", f"team{TOKEN}d", f"city{TOKEN}e"
PATH, SKU, GROUP_PLAN = f"/p/{TOKEN}f", f"sku{TOKEN}g", f"gp{TOKEN}h"
# (The welcome email shows the journey's plan with its first letter capitalised: a digit.)
COUPON, JOURNEY_PLAN = f"cpn{TOKEN}i", f"0jp{TOKEN}j"
VALUES = [
    FIRST_NAME,
    LAST_NAME,
    PLAN,
    LATER_PLAN,
    CITY,
    PATH,
    SKU,
    GROUP_PLAN,
    COUPON,
    JOURNEY_PLAN,
]
# An audience only the subject is in (nobody else orders), and the journey the subject enters.
AUDIENCE = "buyers"
AUDIENCE_SQL = "select customer_id from events where event_action = 'order_completed'\n"
JOURNEY = "welcome_series"
# asOf times before, at and after each of the subject's messages (their event times are
# 2026-01-01T00:00:01Z to :10Z; the first identify with the email is sent now).
AS_OF = [
    "2026-01-01",
    *(f"2026-01-01T00:00:{s:02d}Z" for s in range(1, 11)),
    "2026-01-01T00:00:05.500+01:00",
    "2100-01-01T00:00:00Z",
]
USERS: dict[str, dict[str, Any]] = {
    SUBJECT: {"email": EMAIL, "firstName": FIRST_NAME, "lastName": LAST_NAME},
    NEIGHBOUR: {"email": f"nb-{U}@example.test"},
    OTHER: {"email": OTHER_EMAIL},
}


def _file(env: PrefsEnv, kind: str, ids: list[str]) -> str:
    r = env.server.post(
        "regulations", {"regulationType": kind, "subject": {"type": "USER_ID", "ids": ids}}
    )
    assert r.status_code == 200, r.text
    return str(r.json()["regulationId"])


def _send(env: PrefsEnv, action: str, body: dict[str, Any]) -> str:
    r = env.server.post(action, body)
    assert r.status_code == 200, r.text
    return str(r.json()["eventId"])


def _snapshot(paths: DataPaths) -> int:
    conn = lake_connection(paths)
    try:
        row = conn.execute("select id from ducklake_current_snapshot('lake')").fetchone()
        return int(row[0]) if row else 0
    finally:
        conn.close()


def _landing_event_ids(data: Path) -> set[str]:
    out: set[str] = set()
    for f in data.glob("landing/date=*/*.parquet"):
        out |= set(pq.read_table(f, columns=["event_id"]).column("event_id").to_pylist())
    return out


def _mailbox(env: PrefsEnv) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in DataPaths(env.server.data_dir).mailbox_dir.glob("*")}


def _mail(port: int, to: str, body: str) -> None:
    """A message to the local mailbox, its body base64 (as mail with non-ASCII text often is)."""
    raw = (
        f"From: Shop <shop@example.com>\r\nTo: {to}\r\nSubject: Re: your account\r\n"
        "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"
        "Content-Transfer-Encoding: base64\r\n\r\n"
    ).encode() + base64.encodebytes(body.encode())
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
        smtp.sendmail("shop@example.com", [to], raw)


@pytest.fixture(scope="module")
def mailbox_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, mailbox_port: int) -> Iterator[PrefsEnv]:
    # The dispatcher's mail server is the local mailbox (as under `make run`); the journey the
    # subject enters is the repo's, read when the server starts.
    yield from start_prefs_env(
        tmp_path_factory.mktemp("reg-delete"),
        USERS,
        env={"MALLARD_SMTP_URL": f"smtp://127.0.0.1:{mailbox_port}"},
        extra_config={
            f"journeys/{JOURNEY}.toml": (
                REPO / "config" / "journeys" / f"{JOURNEY}.toml"
            ).read_text()
        },
    )


@pytest.fixture(scope="module")
def mailbox(env: PrefsEnv, mailbox_port: int) -> Iterator[int]:
    """The local mailbox `make run` starts, keeping messages in the server's data dir, on the
    port the dispatcher sends to; its SMTP port. The dispatcher delivers the subject's sends to
    it, and the test mails it too (a message about the subject, one to another customer)."""
    box = Controller(
        MailboxHandler(DataPaths(env.server.data_dir).mailbox_dir),
        hostname="127.0.0.1",
        port=mailbox_port,
    )
    box.start()
    try:
        yield box.port
    finally:
        box.stop()


@pytest.fixture(scope="module")
def before(env: PrefsEnv, mailbox: int) -> dict[str, Any]:
    """The subject's and the others' activity, a pass (an audience evaluated, a journey
    entered, sends delivered to the mailbox), an Access zip; what was there before."""
    (env.config_dir / "audiences").mkdir(exist_ok=True)
    (env.config_dir / "audiences" / f"{AUDIENCE}.sql").write_text(AUDIENCE_SQL)
    t0 = "2026-01-01T00:00:0{}Z"
    ids = [
        # Anonymous, then identified with ANON and SHARED; SHARED later identified with the
        # neighbour too (so it belongs to the subject by the first identification).
        _send(
            env,
            "page",
            {
                "anonymousId": ANON,
                "event": "page",
                "timestamp": t0.format(1),
                "properties": {"path": PATH},
            },
        ),
        _send(
            env,
            "identify",
            {
                "userId": SUBJECT,
                "anonymousId": ANON,
                "event": "identify",
                "timestamp": t0.format(2),
                "traits": {"plan": PLAN},
            },
        ),
        _send(
            env,
            "identify",
            {
                "userId": SUBJECT,
                "anonymousId": SHARED,
                "event": "identify",
                "timestamp": t0.format(3),
                "traits": {"city": CITY},
            },
        ),
        _send(
            env,
            "track",
            {
                "userId": SUBJECT,
                "event": "Order Completed",
                "timestamp": t0.format(4),
                "properties": {"total": 42},
            },
        ),
        _send(
            env,
            "track",
            {
                "anonymousId": SHARED,
                "event": "Viewed",
                "timestamp": t0.format(5),
                "properties": {"sku": SKU},
            },
        ),
        _send(
            env,
            "identify",
            {
                "userId": NEIGHBOUR,
                "anonymousId": SHARED,
                "event": "identify",
                "timestamp": t0.format(6),
                "traits": {"plan": "free"},
            },
        ),
        _send(
            env,
            "track",
            {
                "userId": NEIGHBOUR,
                "anonymousId": SHARED,
                "event": "Clicked",
                "timestamp": t0.format(7),
            },
        ),
        _send(env, "track", {"userId": OTHER, "event": "Clicked", "timestamp": t0.format(8)}),
        _send(
            env,
            "page",
            {"anonymousId": ALIASED, "event": "page", "timestamp": "2026-01-01T00:00:10Z"},
        ),
    ]
    # An alias of the subject linking ALIASED, and the group calls: by batch, which takes them.
    r = env.server.post(
        "batch",
        {
            "batch": [
                {
                    "type": "alias",
                    "userId": SUBJECT,
                    "previousId": ALIASED,
                    "timestamp": "2026-01-01T00:00:11Z",
                },
                {
                    "type": "group",
                    "userId": NEIGHBOUR,
                    "groupId": GROUP,
                    "traits": {"plan": "free", "seats": 3},
                    "timestamp": "2026-01-01T00:00:12Z",
                },
                {
                    "type": "group",
                    "userId": SUBJECT,
                    "groupId": GROUP,
                    "traits": {"plan": GROUP_PLAN, "billingEmail": EMAIL},
                    "timestamp": "2026-01-01T00:00:13Z",
                },
            ]
        },
    )
    assert r.status_code == 200, r.text
    ids += [
        *r.json()["eventIds"],
        # A send to the subject: the dispatcher renders it with their traits and delivers it
        # to the local mailbox.
        _send(
            env,
            "track",
            {
                "userId": SUBJECT,
                "event": "send_email",
                "assetId": "welcome",
                "timestamp": t0.format(9),
            },
        ),
        # After the send, the subject's plan changes (the worked example of docs/api.md).
        _send(
            env,
            "identify",
            {
                "userId": SUBJECT,
                "event": "identify",
                "timestamp": "2026-01-01T00:00:10Z",
                "traits": {"plan": LATER_PLAN},
            },
        ),
        # The subject enters a journey, whose first step sends them the welcome email with the
        # journey's data (root keys and properties) in its merge data.
        _send(
            env,
            "track",
            {
                "userId": SUBJECT,
                "event": "start_journey",
                "coupon": COUPON,
                "timestamp": "2026-01-01T00:00:10Z",
                "properties": {"journeyIdToTrigger": JOURNEY, "plan": JOURNEY_PLAN},
            },
        ),
    ]
    assert (
        env.post(SUBJECT, {"channels": [{"channel": "sms", "subscribed": True}]}).status_code == 200
    )
    httpx.post(f"{env.server.url}/cdp/events/std/m", json={"series": [{"anon": ANON}]}, timeout=10)
    wait_landed(env.server.data_dir, ids)
    env.server.pipeline()
    # The pass's dispatch delivers the send_email and the journey's first send to the mailbox.
    delivered = _wait_mail(env, 2)
    assert all(EMAIL.encode() in raw for raw in delivered.values()), delivered
    assert {JOURNEY_PLAN.encode() in local_mailbox.readable(raw) for raw in delivered.values()} == {
        True,
        False,
    }, "one of them is the journey's, with its plan"
    outbox = (env.server.data_dir / "outbox.sqlite").read_bytes()
    assert EMAIL.encode() in outbox  # the sends, rendered for the subject
    # In the local mailbox besides: one about the subject to someone else (their address only
    # in its encoded body), and one to another customer.
    _mail(mailbox, "support@example.test", f"Zoë asks us to forget {EMAIL}.")
    _mail(mailbox, OTHER_EMAIL, "Zoë, your order has shipped.")
    mail = _wait_mail(env, 4)
    [other_mail] = [n for n, raw in mail.items() if OTHER_EMAIL.encode() in raw]
    meta = env.server.get(f"profiles/userId:{SUBJECT}/meta").json()
    assert AUDIENCE in meta["audiencesStatic"], meta
    as_of = _as_of_answers(env, meta["id"], _visitor_id(env))
    [send] = env.server.get(
        f"profiles/userId:{SUBJECT}/events", params={"include": "send_email", "size": 1}
    ).json()["data"]
    example = (
        send,
        env.server.get(f"profiles/userId:{SUBJECT}/traits", params={"asOf": send["eventTime"]}),
        env.server.get(f"profiles/userId:{SUBJECT}/traits"),
    )
    first = env.server.get(f"profiles/userId:{SUBJECT}/events", params={"size": 1}).json()
    assert first["data"] and first["scrollId"]
    access = env.server.wait_regulation(_file(env, "ACCESS", [SUBJECT]))
    assert access["status"] == "finished", access
    paths = DataPaths(env.server.data_dir)
    landed = _landing_event_ids(env.server.data_dir)
    conn = lake_connection(paths)
    try:
        subject_events = {
            r[0]
            for r in conn.execute(
                "select event_id from lake.raw.messages where user_id = ? or anonymous_id = ?"
                " and user_id is null",
                [SUBJECT, ANON],
            ).fetchall()
        } | {
            r[0]
            for r in conn.execute(
                "select event_id from lake.raw.messages where anonymous_id in (?, ?)"
                " and user_id is null",
                [SHARED, ALIASED],
            ).fetchall()
        }
        events_before = conn.execute(
            "select count(*) from lake.marts.events where customer_id = ?", [meta["id"]]
        ).fetchone()
        aliased_events = [
            r[0]
            for r in conn.execute(
                "select customer_id from lake.marts.events where event_id in ("
                " select event_id from lake.raw.messages where anonymous_id = ?)",
                [ALIASED],
            ).fetchall()
        ]
        group = conn.execute(
            "select traits, member_count from lake.marts.groups where group_id = ?", [GROUP]
        ).fetchone()
        audience_rows, journey_rows = (
            conn.execute(
                f"select count(*) from {table} where customer_id = ?", [meta["id"]]
            ).fetchone()[0]  # type: ignore[index]
            for table in ("lake.marts.audience_members", "lake.marts.journey_instances")
        )
    finally:
        conn.close()
    return {
        "customer_id": meta["id"],
        "subscription_id": meta["_subscriptionId"],
        "snapshot": _snapshot(paths),
        "landed": landed,
        "subject_events": subject_events,
        "events": events_before[0] if events_before else 0,
        "access": access,
        "scroll": first["scrollId"],
        "other_mail": (other_mail, mail[other_mail]),
        "aliased_events": aliased_events,
        "group": (json.loads(group[0]), group[1]) if group else None,
        "as_of": as_of,
        "example": example,
        "delivered": sorted(delivered),
        "audience_rows": audience_rows,
        "journey_rows": journey_rows,
        "found": _leftovers(env.server.data_dir, _strings_of(meta)),
    }


def _wait_mail(env: PrefsEnv, n: int) -> dict[str, bytes]:
    """The mailbox's messages once it holds `n` (the dispatcher delivers after the pass)."""
    deadline = time.monotonic() + 120
    box = DataPaths(env.server.data_dir).mailbox_dir
    while len(local_mailbox.stored(box)) < n:
        assert time.monotonic() < deadline, f"{local_mailbox.stored(box)} in the mailbox, not {n}"
        time.sleep(0.2)
    mail = _mailbox(env)
    assert len(mail) == n, mail.keys()
    return mail


def _visitor_id(env: PrefsEnv) -> str:
    """The subject's visitor profile (ANON) as it stood before its identify: the customerId of
    its page event as of then."""
    events = env.server.get("events/", params={"asOf": "2026-01-01T00:00:01Z"}).json()["data"]
    [page] = [e for e in events if e["rawData"]["anonymousId"] == ANON]
    assert page["userId"] is None
    return str(page["customerId"])


def _as_of_answers(env: PrefsEnv, customer_id: str, visitor_id: str) -> dict[str, Any]:
    """Per asOf time: the status of each profile read of the subject, and the events then."""
    out: dict[str, Any] = {}
    for when in AS_OF:
        statuses = {
            (key, endpoint): env.server.get(
                f"profiles/{key}/{endpoint}", params={"asOf": when}
            ).status_code
            for key in (
                f"userId:{SUBJECT}",
                f"email:{EMAIL}",
                f"id:{customer_id}",
                f"id:{visitor_id}",
            )
            for endpoint in ("traits", "metadata")
        }
        events = env.server.get("events/", params={"asOf": when, "size": 100})
        assert events.status_code == 200, events.text
        out[when] = {"statuses": statuses, "events": events.json()["data"]}
    return out


@pytest.fixture(scope="module")
def deleted(env: PrefsEnv, before: dict[str, Any]) -> dict[str, Any]:
    # A Delete of a user never suppressed is refused, naming the field.
    r = env.server.post(
        "regulations", {"regulationType": "DELETE", "subject": {"type": "USER_ID", "ids": [OTHER]}}
    )
    assert r.status_code == 400 and "subject.ids" in r.text, r.text
    done = env.server.wait_regulation(_file(env, "SUPPRESS_WITH_DELETE", [SUBJECT]))
    assert done["status"] == "finished", done
    return done


def _strings(before: dict[str, Any]) -> list[bytes]:
    """The subject's identifiers and the values only their messages carry."""
    return _strings_of({"_subscriptionId": before["subscription_id"], "id": before["customer_id"]})


def _strings_of(meta: dict[str, Any]) -> list[bytes]:
    return [
        s.encode()
        for s in (
            SUBJECT,
            ANON,
            ALIASED,
            EMAIL,
            meta["_subscriptionId"],
            meta["id"],
            *VALUES,
        )
    ]


def _found(where: str, data: bytes, wanted: list[bytes]) -> list[str]:
    return [f"{where}: {s.decode()}" for s in wanted if s in data]


def _sqlite_values(path: Path) -> bytes:
    """Every value of every table of a SQLite file (with its write-ahead file), as text: what
    a reader of the database gets, whatever the pages' layout on disk. Read from a copy, so
    the data dir is not touched."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "db.sqlite"
        shutil.copy(path, copy)
        wal = path.with_name(path.name + "-wal")
        if wal.exists():
            shutil.copy(wal, copy.with_name(copy.name + "-wal"))
        conn = sqlite3.connect(copy)
        try:
            out: list[bytes] = []
            tables = [
                r[0] for r in conn.execute("select name from sqlite_master where type='table'")
            ]
            for table in tables:
                for row in conn.execute(f'select * from "{table}"'):
                    for v in row:
                        out.append(v if isinstance(v, bytes) else str(v).encode())
            return b"\n".join(out)
        finally:
            conn.close()


def _decoded_hits(path: Path, data: bytes, wanted: list[bytes]) -> list[str]:
    """What the file holds once decoded, by what it is: a SQLite database's values, a zip's
    members, a Parquet file's values (decompressed), a mail's decoded headers and bodies."""
    hits: list[str] = []
    if data.startswith(b"SQLite format 3\x00"):
        hits += _found(f"{path} (sqlite values)", _sqlite_values(path), wanted)
    if data.startswith(b"PAR1"):
        hits += _found(
            f"{path} (parquet values)", str(pq.read_table(path).to_pylist()).encode(), wanted
        )
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                content = z.read(member)
                hits += _found(f"{path}!{member}", content, wanted)
                hits += (
                    _decoded_hits(Path(f"{path}!{member}"), content, wanted)
                    if content.startswith(b"PAR1")
                    else []
                )
    if ".eml" in path.name:  # every header and body, decoded from base64 or quoted-printable
        hits += _found(f"{path} (decoded)", local_mailbox.readable(data), wanted)
    return hits


def _leftovers(data_dir: Path, wanted: list[bytes]) -> list[str]:
    """Every place in the data dir that still holds one of `wanted`: each file's bytes, and
    its values decoded (the DuckDB extensions, binaries of the install, left out)."""
    hits: list[str] = []
    for path in data_dir.rglob("*"):
        if not path.is_file() or "duckdb_extensions" in path.parts:
            continue
        data = path.read_bytes()
        hits += _found(str(path), data, wanted)
        hits += _decoded_hits(path, data, wanted)
    return hits


def test_evidence_counts_what_was_deleted_and_finds_nothing_left(
    deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    evidence = deleted["evidence"]
    assert evidence["rowsRemainingTotal"] == 0 and evidence["bytesFoundTotal"] == 0
    assert evidence["rowsDeleted"]["marts.events"] == before["events"] > 0
    assert evidence["rowsDeleted"]["raw.messages"] == len(before["subject_events"])
    assert evidence["landingRowsRemoved"] == len(before["subject_events"])
    assert evidence["snapshotsExpired"] > 0 and evidence["filesDeleted"] > 0
    assert evidence["accessZipsRemoved"] == 1 and evidence["preferencesJournalRows"] >= 1
    assert evidence["outboxRows"]["sends"] == 2  # the send_email's and the journey's
    assert evidence["outboxRows"]["journey_instances"] == 1
    # The two sends delivered to the subject, and the message about them.
    assert evidence["mailboxMessagesRemoved"] == 3
    # The Access zip filed before held exactly the rows the Delete removed, table by table.
    assert before["access"]["evidence"]["rowsExported"] == evidence["rowsDeleted"]


def test_the_access_download_answers_410_once_the_delete_removed_its_zip(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    access_id = before["access"]["regulationId"]
    assert before["access"]["download"]["url"].endswith(f"/{access_id}/download")
    r = env.server.get(f"regulations/{access_id}/download")
    assert r.status_code == 410, r.text
    assert r.json()["error"]["code"] == "not_found"
    message = r.json()["error"]["message"]
    assert "was removed at 20" in message and deleted["regulationId"] in message, message
    assert "Delete of its subject" in message
    evidence = env.server.get(f"regulations/{access_id}").json()["evidence"]
    assert evidence["downloadRemoved"]["by"] == deleted["regulationId"]


def test_no_byte_of_the_subject_is_left_in_the_data_dir(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    wanted = _strings(before)
    # Before the Delete the search found every one of them, decoded where it had to be.
    found = {hit.rsplit(": ", 1)[1] for hit in before["found"]}
    assert found == {s.decode() for s in wanted}, found
    assert any("(sqlite values)" in hit for hit in before["found"])
    assert any("(parquet values)" in hit for hit in before["found"])
    assert any(".zip!" in hit for hit in before["found"])
    assert _leftovers(env.server.data_dir, wanted) == []


def test_the_mailbox_keeps_only_the_messages_not_about_the_subject(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    name, raw = before["other_mail"]
    assert _mailbox(env) == {name: raw}


def test_the_subject_left_the_audience_and_the_journey(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    """Before the Delete the subject was a member of the audience and had entered the journey;
    after it no row of either names them, and the audience has no member left."""
    assert before["audience_rows"] == 1 and before["journey_rows"] == 1
    paths = DataPaths(env.server.data_dir)
    for table in ("audience_members", "journey_instances", "journey_steps"):
        sql = f"select count(*) from lake.marts.{table} where customer_id = ?"
        rows = _rows(paths, sql.replace("?", f"'{before['customer_id']}'"))
        assert rows == [(0,)], table
    members = env.server.get(f"audiences/{AUDIENCE}/members")
    assert members.status_code == 200 and members.json()["data"] == [], members.text


def test_no_process_holds_a_deleted_file_open(env: PrefsEnv, deleted: dict[str, Any]) -> None:
    root = str(env.server.data_dir.resolve())
    held = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if (
            target.startswith(root)
            and target.endswith("(deleted)")
            and ("/lake/" in target or "/landing/" in target)
        ):
            held.append(f"{fd}: {target}")
    assert held == []


def test_profiles_answer_404(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    for key in (f"userId:{SUBJECT}", f"email:{EMAIL}", f"id:{before['customer_id']}"):
        for endpoint in ("traits", "meta"):
            assert env.server.get(f"profiles/{key}/{endpoint}").status_code == 404, key
        events = env.server.get(f"profiles/{key}/events")
        assert events.status_code == 404, (key, events.text)
    assert env.server.get(f"profiles/userId:{OTHER}/traits").status_code == 200
    # The marketing preferences by subscription id, served from the lake and the journal.
    assert env.get(SUBJECT).status_code == 404
    assert env.get(OTHER).status_code == 200
    # A scroll begun before the Delete does not go on from what the API held in memory.
    scroll = env.server.get(
        f"profiles/userId:{SUBJECT}/events", params={"scrollId": before["scroll"]}
    )
    assert scroll.status_code in (400, 404) or scroll.json()["data"] == [], scroll.text


def test_why_the_subject_got_that_email(before: dict[str, Any]) -> None:
    """The worked example of docs/api.md, before the Delete: the traits as of the send_email
    command's event time are those it was sent with; the plan changed after, and the email
    came later still."""
    send, then, now = before["example"]
    assert send["eventTime"] == "2026-01-01T00:00:09.000Z", send
    assert then.status_code == 200, then.text
    assert then.json() == {
        "city": CITY,
        "externalId": SUBJECT,
        "id": before["customer_id"],
        "plan": PLAN,
    }
    assert now.json()["plan"] == LATER_PLAN and now.json()["email"] == EMAIL


def test_the_subject_is_absent_at_every_as_of(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    """After the Delete, no profile read of the subject as of any time finds it, and no event
    list as of any time shows its events; before it, they did."""
    visitor = _visitor_id_before(before)
    after = _as_of_answers(env, before["customer_id"], visitor)
    found_before = [
        (when, read)
        for when, answers in before["as_of"].items()
        for read, status in answers["statuses"].items()
        if status == 200
    ]
    assert len(found_before) >= 20, found_before
    ids = {before["customer_id"], visitor}
    for when, answers in after.items():
        assert set(answers["statuses"].values()) == {404}, (when, answers["statuses"])
        for e in answers["events"]:
            assert e["eventId"] not in before["subject_events"], (when, e)
            assert e["customerId"] not in ids and e["email"] != EMAIL, (when, e)
    shown = [
        when
        for when, answers in before["as_of"].items()
        if {e["eventId"] for e in answers["events"]} & before["subject_events"]
    ]
    assert len(shown) >= 10, shown


def _visitor_id_before(before: dict[str, Any]) -> str:
    events = before["as_of"]["2026-01-01T00:00:01Z"]["events"]
    [page] = [e for e in events if e["rawData"]["anonymousId"] == ANON]
    return str(page["customerId"])


def test_the_neighbour_now_owns_the_shared_anonymous_id(
    env: PrefsEnv, deleted: dict[str, Any]
) -> None:
    r = env.server.get(f"profiles/userId:{NEIGHBOUR}/external_ids")
    assert r.status_code == 200, r.text
    assert SHARED in r.text


def test_the_alias_linked_visitor_was_the_subjects_and_the_group_keeps_the_neighbours_traits(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    """Before the Delete, ALIASED's page was the subject's event and the group had the traits
    of the subject's later call and two members; after it, the neighbour's call alone."""
    assert before["aliased_events"] == [before["customer_id"]]
    assert before["group"] == ({"billingEmail": EMAIL, "plan": GROUP_PLAN, "seats": 3}, 2)
    [(traits, members)] = _rows(
        DataPaths(env.server.data_dir),
        f"select traits, member_count from lake.marts.groups where group_id = '{GROUP}'",
    )
    assert (json.loads(traits), members) == ({"plan": "free", "seats": 3}, 1)
    nb = env.server.get(f"profiles/userId:{NEIGHBOUR}/meta").json()
    assert nb["groupId"] == GROUP


def test_time_travel_cannot_read_the_subject(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any]
) -> None:
    conn = lake_connection(DataPaths(env.server.data_dir))
    try:
        try:
            rows = conn.execute(
                f"select count(*) from lake.raw.messages at (version => {before['snapshot']})"
                " where user_id = ?",
                [SUBJECT],
            ).fetchone()
        except duckdb.Error as e:
            assert "snapshot" in str(e).lower(), e
        else:
            assert rows == (0,)
    finally:
        conn.close()


def test_a_rebuild_from_landing_equals_the_incremental_state(
    env: PrefsEnv, deleted: dict[str, Any], before: dict[str, Any], tmp_path: Path
) -> None:
    data = env.server.data_dir
    # The landing files are the originals minus exactly the subject's messages: a build of
    # them is a build that never saw the subject.
    assert _landing_event_ids(data) == before["landed"] - before["subject_events"]
    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    shutil.copy(data / "secret.key", rebuilt / "secret.key")
    shutil.copytree(data / "landing", rebuilt / "landing")
    out = mallard("pipeline", "run", data_dir=rebuilt)
    assert out.returncode == 0, out.stdout + out.stderr
    queries = {
        "events": "select event_id, customer_id, event_action, record from lake.marts.events",
        "customers": "select customer_id, user_id, traits, subscription_id, email_lower"
        " from lake.marts.customers",
        "identifiers": "select customer_id, id_type, id_value, first_seen, last_seen"
        " from lake.marts.customer_identifiers",
        "identity": "select account_id, anonymous_id, user_id"
        " from lake.intermediate.int_identity_map",
        "groups": "select account_id, group_id, traits, member_count from lake.marts.groups",
        "group_members": "select group_id, customer_id from lake.marts.group_members",
        "preferences": "select customer_id, marketing_preferences"
        " from lake.marts.customer_preferences",
        "trait_history": "select customer_id, customer_id_then, trait_key, trait_value::varchar,"
        " valid_from, valid_to, message_id from lake.marts.trait_history",
    }
    for name, sql in queries.items():
        assert _rows(DataPaths(data), sql) == _rows(DataPaths(rebuilt), sql), name


def _rows(paths: DataPaths, sql: str) -> list[tuple[Any, ...]]:
    conn = lake_connection(paths)
    try:
        return sorted(conn.execute(sql).fetchall(), key=repr)
    finally:
        conn.close()
