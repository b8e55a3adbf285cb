"""The seven regulation types through HTTP on one real server, its collector and the pipeline:
Suppress filed while several threads send (nothing of the subject stored after the answer),
Unsuppress, NoTrack and Track, Delete after a Suppress, Access with its download, and the
status of each run to finished."""

from __future__ import annotations

import io
import json
import secrets
import threading
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import dagster as dg
import httpx
import pyarrow.parquet as pq
import pytest

from mallard.paths import DataPaths
from orchestration.warehouse import lake_connection
from tests.conftest import Server, free_port, init_data_dir, wait_landed

pytestmark = pytest.mark.integration

U = secrets.token_hex(4)
S, ANON_S = f"sup-{U}", f"anon-sup-{U}"
N, ACC = f"nt-{U}", f"acc-{U}"
# The racing senders go faster than a token's default rate limit.
UNLIMITED = {"MALLARD_RATE_PER_SECOND": "100000", "MALLARD_RATE_BURST": "100000"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("reg-types") / "data"
    server = Server(
        data, free_port(), init_data_dir(data), env={"MALLARD_ROLL_INTERVAL_S": "0.2", **UNLIMITED}
    )
    server.start()
    try:
        ids = [
            _id(
                server.post(
                    "identify",
                    {
                        "userId": S,
                        "anonymousId": ANON_S,
                        "event": "identify",
                        "traits": {"plan": "pro"},
                    },
                )
            ),
            _id(server.post("identify", {"userId": N, "event": "identify", "traits": {}})),
            _id(
                server.post(
                    "identify",
                    {
                        "userId": ACC,
                        "event": "identify",
                        "traits": {"email": f"{ACC}@example.test"},
                    },
                )
            ),
            _id(server.post("track", {"userId": ACC, "event": "Bought"})),
        ]
        wait_landed(data, [i for i in ids if i])
        server.pipeline()  # the models tie ANON_S to S before anything is filed
        yield server
    finally:
        server.stop()


def _id(r: httpx.Response) -> str:
    """The eventId of an accepted call, kept or dropped alike (Server.dropped tells them apart)."""
    assert r.status_code == 200, r.text
    return str(r.json()["eventId"])


def _file(srv: Server, kind: str, user: str) -> str:
    r = srv.post(
        "regulations", {"regulationType": kind, "subject": {"type": "USER_ID", "ids": [user]}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("pending", "running", "finished")
    return str(r.json()["regulationId"])


def _finished(srv: Server, reg_id: str) -> dict[str, Any]:
    body = srv.wait_regulation(reg_id)
    assert body["status"] == "finished", body
    return body


def _landed_rows(srv: Server, **match: str) -> int:
    n = 0
    for f in srv.data_dir.glob("landing/date=*/*.parquet"):
        for row in pq.read_table(f, columns=["user_id", "anonymous_id"]).to_pylist():
            n += any(row[k] == v for k, v in match.items())
    return n


def test_suppress_filed_while_threads_send_stores_nothing_after_its_answer(srv: Server) -> None:
    answered = threading.Event()
    stop = threading.Event()
    # (subject, sent after the answer, eventId, the key that names the sender)
    calls: list[tuple[bool, bool, str, str]] = []
    lock = threading.Lock()

    def sender(n: int) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while not stop.is_set():
                i += 1
                subject = i % 3 != 0
                body = (
                    ({"userId": S} if i % 2 else {"anonymousId": ANON_S})
                    if subject
                    else {"userId": ACC}
                )
                after = answered.is_set()
                r = client.post(
                    f"{srv.base}/track", json={**body, "event": f"Tick {n}"}, headers=srv.headers
                )
                key = next(iter(body))
                with lock:
                    calls.append((subject, after, _id(r), key))

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()

    def sent(after: bool, subject: bool, key: str) -> int:
        with lock:
            return sum(c[:2] == (subject, after) and c[3] == key for c in calls)

    def until(after: bool, n: int) -> None:
        """Until the senders have made `n` calls of each kind (the subject's by userId and by
        anonymousId, the other user's) on that side of the answer."""
        deadline = time.monotonic() + 120
        kinds = [(True, "userId"), (True, "anonymousId"), (False, "userId")]
        while min(sent(after, subject, key) for subject, key in kinds) < n:
            assert time.monotonic() < deadline, calls[-10:]
            time.sleep(0.05)

    until(False, 5)
    reg_id = _file(srv, "SUPPRESS", S)
    answered.set()
    until(True, 10)
    stop.set()
    for t in threads:
        t.join()
    drops = {c[2]: srv.dropped(c[2]) for c in calls if c[0] or c[1]}
    after = [c for c in calls if c[1]]
    # Every call of the subject sent after the answer, by userId and by anonymousId alike, was
    # answered 200 and dropped by the suppression; every other user's call after it was kept.
    by_key: dict[str, set[str | None]] = {}
    for c in after:
        if c[0]:
            by_key.setdefault(c[3], set()).add(drops[c[2]])
    assert by_key == {"userId": {"suppress"}, "anonymousId": {"suppress"}}, by_key
    assert {drops[c[2]] for c in after if not c[0]} == {None}
    stored = [c[2] for c in calls if drops.get(c[2]) is None]
    wait_landed(srv.data_dir, stored)
    subject_stored = [c for c in calls if c[0] and drops[c[2]] is None]
    assert subject_stored, "the subject's calls before the answer are stored"
    assert _landed_rows(srv, user_id=S, anonymous_id=ANON_S) == len(subject_stored) + 1
    _finished(srv, reg_id)


def test_unsuppress_lets_the_subject_in_again(srv: Server) -> None:
    _finished(srv, _file(srv, "UNSUPPRESS", S))
    event_id = _id(srv.post("track", {"userId": S, "event": "Back"}))
    assert srv.dropped(event_id) is None
    wait_landed(srv.data_dir, [event_id])


def test_no_track_drops_tracking_but_not_api_identify_or_commands_and_track_undoes_it(
    srv: Server,
) -> None:
    _finished(srv, _file(srv, "NO_TRACK", N))
    assert srv.dropped(_id(srv.post("track", {"userId": N, "event": "Viewed"}))) == "no_track"
    assert srv.dropped(_id(srv.post("page", {"userId": N, "event": "page"}))) == "no_track"
    identify = {"userId": N, "event": "identify", "traits": {}}
    assert srv.dropped(_id(srv.post("identify", identify))) is None
    command = {"userId": N, "event": "send_email", "assetId": "welcome"}
    assert srv.dropped(_id(srv.post("track", command))) is None
    tag = httpx.post(
        f"{srv.url}/cdp/events/std/i",
        content=json.dumps(
            {
                "type": "identify",
                "userId": N,
                "anonymousId": f"a-{U}",
                "writeKey": srv.creds["writeKey"],
            }
        ),
        headers={"content-type": "text/plain"},
        timeout=30,
    )
    assert srv.dropped(_id(tag)) == "no_track"
    _finished(srv, _file(srv, "TRACK", N))
    assert srv.dropped(_id(srv.post("track", {"userId": N, "event": "Viewed"}))) is None


def test_delete_after_suppress_removes_the_subject(srv: Server) -> None:
    _finished(srv, _file(srv, "SUPPRESS", S))
    done = _finished(srv, _file(srv, "DELETE", S))
    assert done["evidence"]["rowsRemainingTotal"] == 0 == done["evidence"]["bytesFoundTotal"]
    assert done["evidence"]["rowsDeleted"]["raw.messages"] > 0
    assert srv.get(f"profiles/userId:{S}/traits").status_code == 404
    assert _landed_rows(srv, user_id=S, anonymous_id=ANON_S) == 0
    assert srv.get(f"profiles/userId:{ACC}/traits").status_code == 200
    # The run is the Dagster job the UI shows, with its steps, in the data dir's instance.
    with dg.DagsterInstance.from_config(str(srv.data_dir / "dagster")) as instance:
        runs = instance.get_run_records(
            dg.RunsFilter(job_name="regulation", tags={"regulation": done["regulationId"]})
        )
        assert [r.dagster_run.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]
        steps = {
            e.step_key
            for e in instance.all_logs(runs[0].dagster_run.run_id)
            if e.dagster_event and e.dagster_event.event_type_value == "STEP_SUCCESS"
        }
    assert {"catch_up", "purge_rows", "purge_files", "verify_and_finish"} <= steps


def test_access_zip_downloads_with_the_subjects_events(srv: Server) -> None:
    done = _finished(srv, _file(srv, "ACCESS", ACC))
    r = srv.get(f"regulations/{done['regulationId']}/download")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/zip")
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("manifest.json"))
        events = [json.loads(line) for line in z.read("events.jsonl").splitlines()]
    assert {"profile.json", "events.jsonl", "messages.jsonl", "README.md"} <= names
    customer = srv.get(f"profiles/userId:{ACC}/meta").json()["id"]
    conn = lake_connection(DataPaths(srv.data_dir))
    try:
        stored = conn.execute(
            "select event_id from lake.marts.events where customer_id = ?", [customer]
        ).fetchall()
    finally:
        conn.close()
    assert sorted(e["eventId"] for e in events) == sorted(r[0] for r in stored)
    assert manifest["rows_by_table"]["marts.events"] == len(stored) > 1
    first_page = srv.get(f"profiles/userId:{ACC}/events").json()["data"]
    assert {e["eventId"] for e in first_page} <= {e["eventId"] for e in events}
