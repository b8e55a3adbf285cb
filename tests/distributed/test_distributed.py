"""The distributed topology (issue 38) against the embedded default, on the same input.

A real PostgreSQL (catalog, Dagster's instance) and moto's S3 server (lake and landing files)
on loopback, two collectors (one SIGKILLed while it takes load, then restarted), two API
replicas, passes; then a Delete. Every answer read through either replica must equal the
embedded deployment's (one `mallard serve`, SQLite catalog, local files) on the same messages,
and the Delete must leave nothing of the subject (userId, email, customer id) in S3 objects,
the catalog's rows or Dagster's run storage on PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from mallard.cluster import S3_BUCKET, free_port
from mallard.topology import Deployment

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1500)]

USERS = [f"user-{i:04d}" for i in range(1, 7)]
SUBJECT = "user-0002"  # deleted at the end
DAY = "2026-03-0"


def messages() -> list[dict[str, Any]]:
    """One identify and five tracks per user, ids and times fixed, so answers compare."""
    out: list[dict[str, Any]] = []
    for u, user in enumerate(USERS):
        out.append(
            {
                "type": "identify",
                "event": "identify",
                "userId": user,
                "messageId": f"m-{user}-id",
                "timestamp": f"{DAY}{u + 1}T09:00:00Z",
                "traits": {"email": f"{user}@example.com", "plan": ["free", "pro"][u % 2]},
            }
        )
        for i in range(5):
            out.append(
                {
                    "type": "track",
                    "event": ["Viewed Item", "Logged In"][i % 2],
                    "userId": user,
                    "messageId": f"m-{user}-{i}",
                    "timestamp": f"{DAY}{u + 1}T10:0{i}:00Z",
                    "properties": {"i": i, "sku": f"sku-{u}-{i}"},
                }
            )
    return out


def token(identifier: str) -> str:
    """The identifier as a whole value, as the Delete's proof matches it: no letter or digit on
    either side (orchestration/regulations/verify.py)."""
    return f"(?<![A-Za-z0-9]){re.escape(identifier)}(?![A-Za-z0-9])"


def dagster_rows_naming(dep: Deployment, identifiers: list[str]) -> dict[str, int]:
    """Rows of every table of Dagster's PostgreSQL storage (runs, event logs, tags, ...) whose
    text names one of the identifiers, by table (only tables with any)."""
    tables = dep.cluster.psql(
        "select table_name from information_schema.tables where table_schema = 'public'"
        " and table_type = 'BASE TABLE'",
        "dagster",
    ).split()
    assert {"runs", "event_logs"} <= set(tables), tables
    # PostgreSQL's regex has no lookbehind: the same rule with explicit edges.
    pattern = "|".join(f"(^|[^A-Za-z0-9]){re.escape(i)}([^A-Za-z0-9]|$)" for i in identifiers)
    out = {}
    for table in tables:
        n = int(
            dep.cluster.psql(
                f"select count(*) from \"{table}\" t where t::text ~ '{pattern}'", "dagster"
            )
        )
        if n:
            out[table] = n
    return out


def tenant_base(url: str, creds: dict[str, str]) -> str:
    return f"{url}/track/{creds['clientId']}/{creds['accountId']}/{creds['brandId']}/v1"


def post(base: str, creds: dict[str, str], msg: dict[str, Any]) -> httpx.Response:
    action = "identify" if msg["type"] == "identify" else "track"
    return httpx.post(f"{base}/{action}", json=msg, headers={"auth-token": creds["token"]})


def wait_for(what: str, check: Any, timeout: float = 120.0, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def answers(base: str, creds: dict[str, str], users: list[str]) -> dict[str, Any]:
    """What the read API says of each user (traits, events) and of the account (its events),
    without what differs by deployment: server-made ids, receipt times, the subscription id
    (an HMAC under each data dir's own secret)."""
    h = {"auth-token": creds["token"]}

    def clean(e: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in e.items() if k not in ("id", "eventId", "receivedTime")}

    out: dict[str, Any] = {}
    for user in users:
        t = httpx.get(f"{base}/profiles/userId:{user}/traits", headers=h, timeout=60)
        traits = t.json() if t.status_code == 200 else t.status_code
        if isinstance(traits, dict):
            traits.pop("_subscriptionId", None)
        ev = httpx.get(f"{base}/profiles/userId:{user}/events?size=100", headers=h, timeout=60)
        events = [clean(e) for e in ev.json()["data"]] if ev.status_code == 200 else ev.status_code
        out[user] = {"traits": traits, "events": events}
    page = httpx.get(f"{base}/events/?size=100&sort=asc", headers=h, timeout=60)
    assert page.status_code == 200, page.text
    out["events"] = sorted(
        (e["externalId"] or "", e["eventAction"], e["eventTime"]) for e in page.json()["data"]
    )
    return out


def delete_subject(read_base: str, status_base: str, creds: dict[str, str]) -> dict[str, Any]:
    h = {"auth-token": creds["token"]}
    body = {
        "regulationType": "SUPPRESS_WITH_DELETE",
        "subject": {"type": "USER_ID", "ids": [SUBJECT]},
    }
    r = httpx.post(f"{read_base}/regulations", json=body, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    rid = r.json()["regulationId"]

    def done() -> dict[str, Any] | None:
        got = httpx.get(f"{status_base}/regulations/{rid}", headers=h, timeout=60).json()
        return got if got["status"] in ("finished", "failed") else None

    reg = wait_for(f"regulation {rid}", done, timeout=600, every=1.0)
    assert reg["status"] == "finished", reg
    return reg


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The default: one `mallard serve` on a data dir (SQLite catalog, local files)."""
    root = tmp_path_factory.mktemp("embedded")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLARD_", "AWS_"))}
    env["MALLARD_DATA_DIR"] = str(root / "data")
    env["DAGSTER_HOME"] = str(root / "data" / "dagster")
    mallard = [sys.executable, "-m", "mallard.cli"]

    def run(*args: str) -> str:
        out = subprocess.run([*mallard, *args], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    import json

    creds = json.loads(run("init", "--json"))
    port = free_port()
    log = open(root / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*mallard, "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/health").status_code == 200
            return False

        wait_for("embedded serve", healthy)
        yield {"url": url, "creds": creds, "run": run, "root": root}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    dep = Deployment(tmp_path_factory.mktemp("distributed"))
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()


def landed_message_ids(dep: Deployment) -> set[str]:
    fs = dep.cluster.s3()
    ids: set[str] = set()
    for key in dep.cluster.s3_keys("landing/"):
        ids.update(pq.read_table(f"{S3_BUCKET}/{key}", filesystem=fs)["message_id"].to_pylist())
    return ids


def test_same_answers_as_embedded(deployment: Deployment, embedded: dict[str, Any]) -> None:
    dep, msgs = deployment, messages()
    creds = dep.creds
    c1 = tenant_base(dep.served["collector-1"].url, creds)
    c2 = tenant_base(dep.served["collector-2"].url, creds)
    ours, theirs = msgs[0::2], msgs[1::2]

    # Collector 1 takes its half from a thread and is SIGKILLed halfway; what it did not
    # acknowledge is sent again once it is back (as an SDK retries), the rest goes to collector 2.
    acked: list[dict[str, Any]] = []
    unacked: list[dict[str, Any]] = []

    def load_c1() -> None:
        for m in ours:
            try:
                ok = post(c1, creds, m).status_code == 200
            except httpx.HTTPError:
                ok = False
            (acked if ok else unacked).append(m)

    sender = threading.Thread(target=load_c1)
    sender.start()
    wait_for("half of collector 1's load", lambda: len(acked) >= len(ours) // 2, every=0.01)
    dep.kill("collector-1")
    for m in theirs:
        assert post(c2, creds, m).status_code == 200
    sender.join()
    assert unacked, "collector 1 was killed after its whole load"
    dep.start_served("collector-1")
    for m in unacked:
        assert post(c1, creds, m).status_code == 200

    every = {m["messageId"] for m in msgs}
    wait_for("every message on S3", lambda: every <= landed_message_ids(dep), timeout=60)
    prefixes = {k.split("/")[1] for k in dep.cluster.s3_keys("landing/")}
    assert prefixes == {"c1", "c2"}, prefixes

    dep.mallard("pipeline", "run")
    assert int(dep.cluster.psql("select count(*) from runs", "dagster")) >= 1  # Dagster on PG

    e_base = tenant_base(embedded["url"], embedded["creds"])
    for m in msgs:
        assert post(e_base, embedded["creds"], m).status_code == 200
    paths_landing = Path(embedded["root"]) / "data" / "landing"
    wait_for(
        "embedded landing",
        lambda: (
            sum(pq.read_metadata(p).num_rows for p in paths_landing.glob("date=*/*.parquet"))
            >= len(msgs)
        ),
        timeout=60,
    )
    embedded["run"]("pipeline", "run")

    want = answers(e_base, embedded["creds"], USERS)
    assert len(want["events"]) == len(msgs)  # each message once
    for replica in ("api-1", "api-2"):
        got = answers(tenant_base(dep.served[replica].url, creds), creds, USERS)
        assert got == want, replica

    # The subject's identifiers, searched for after the Delete.
    h = {"auth-token": creds["token"]}
    api_1 = tenant_base(dep.served["api-1"].url, creds)
    meta = httpx.get(f"{api_1}/profiles/userId:{SUBJECT}/meta", headers=h, timeout=60)
    assert meta.status_code == 200, meta.text
    identifiers = [SUBJECT, f"{SUBJECT}@example.com", meta.json()["id"]]
    found = re.compile("|".join(token(i) for i in identifiers))
    # A Delete through the replicas: filed on one, followed on the other.
    reg = delete_subject(
        tenant_base(dep.served["api-1"].url, creds),
        tenant_base(dep.served["api-2"].url, creds),
        creds,
    )
    assert reg["evidence"]["rowsRemainingTotal"] == 0, reg
    delete_subject(e_base, e_base, embedded["creds"])

    # Nothing of the subject in any S3 object: landing files by their rows, the lake's files
    # by every value (text, JSON, nested), decoded; and the lake's objects are only the files
    # its catalog refers to.
    fs = dep.cluster.s3()
    searched = 0
    for key in dep.cluster.s3_keys(""):
        table = pq.read_table(f"{S3_BUCKET}/{key}", filesystem=fs)
        for col in table.column_names:
            values = [str(v) for v in table[col].to_pylist() if v is not None]
            assert not [v for v in values if found.search(v)], (key, col)
            searched += len(values)
    assert searched > 0
    # Nor in Dagster's run storage (every table of its PostgreSQL database), where the same
    # search finds a run's id in its run row and its events.
    run_id = dep.cluster.psql("select run_id from runs limit 1", "dagster").strip()
    assert {"runs", "event_logs"} <= set(dagster_rows_naming(dep, [run_id]))
    assert dagster_rows_naming(dep, identifiers) == {}
    # The lake's objects are the live files of its catalog, no more: the old ones went.
    live = dep.cluster.psql(
        "select (select count(*) from ducklake_data_file where end_snapshot is null)"
        " + (select count(*) from ducklake_delete_file where end_snapshot is null)",
        "lake",
    )
    assert len(dep.cluster.s3_keys("lake/")) == int(live) > 0
    from orchestration.regulations.verify import catalog_rows_remaining

    env_before = dict(os.environ)
    os.environ.update(dep.cluster.env())
    try:
        assert catalog_rows_remaining(identifiers) == {}
    finally:
        os.environ.clear()
        os.environ.update(env_before)

    # The suppression reaches every collector: each drops the subject's new call, and lands
    # another user's call sent after it.
    later = {"type": "track", "event": "Came Back", "timestamp": f"{DAY}9T10:00:00Z"}
    markers = set()
    for i, b in enumerate((c1, c2)):
        for user in (SUBJECT, USERS[0]):
            msg = {**later, "userId": user, "messageId": f"m-later-{user}-{i}"}
            assert post(b, creds, msg).status_code == 200
            assert post(e_base, embedded["creds"], msg).status_code == 200
        markers.add(f"m-later-{USERS[0]}-{i}")
    wait_for("the markers on S3", lambda: markers <= landed_message_ids(dep))
    assert not {m for m in landed_message_ids(dep) if SUBJECT in m}

    def embedded_ids() -> set[str]:
        return {
            m
            for p in paths_landing.glob("date=*/*.parquet")
            for m in pq.read_table(p)["message_id"].to_pylist()
        }

    wait_for("the markers in the embedded landing", lambda: markers <= embedded_ids())
    embedded["run"]("pipeline", "run")
    dep.mallard("pipeline", "run")
    want = answers(e_base, embedded["creds"], USERS)
    assert want[SUBJECT]["traits"] == 404
    for replica in ("api-1", "api-2"):
        got = answers(tenant_base(dep.served[replica].url, creds), creds, USERS)
        assert got == want, replica
