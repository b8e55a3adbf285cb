"""`GET {base}/events/{eventId}/status` and the Dagster `dispatch` job, on a real server, a
`mallard pipeline run` and a loopback SMTP sink (tests/integration/test_dispatch.py's).

The tests share one server, data dir and sink (test_dispatch.py's module fixtures, one of each
per module): each sends as users of its own and counts only the messages it made reach the
sink."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from mallard.paths import DataPaths
from tests.conftest import REPO, Server, wait_landed
from tests.integration.test_dispatch import (  # noqa: F401 - the fixtures
    Sink,
    dispatch_server,
    new_messages,
    smtp_sink,
)

UNKNOWN = "019ac2b0-5d1e-7000-8a3c-1f2e3d4c5b6a"


def _post(server: Server, action: str, body: dict[str, Any]) -> str:
    r = server.post(action, body)
    assert r.status_code == 200, r.text
    return str(r.json()["eventId"])


def _status(server: Server, event_id: str) -> dict[str, Any]:
    r = server.get(f"events/{event_id}/status")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert body["eventId"] == event_id
    return body


def test_status_unknown_received_processed(dispatch_server: Server) -> None:  # noqa: F811
    server = dispatch_server
    r = server.get(f"events/{UNKNOWN}/status")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"

    event_id = _post(server, "track", {"userId": "status-u1", "event": "Page Viewed"})
    first = _status(server, event_id)  # in the log or a landing file: not loaded yet
    assert first == {
        "eventId": event_id,
        "status": "received",
        "reason": None,
        "errors": [],
        "sends": [],
    }
    wait_landed(server.data_dir, [event_id])
    assert _status(server, event_id)["status"] == "received"
    _run_jobs(server, "load")  # lake.raw.messages only, no models
    assert _status(server, event_id)["status"] == "loaded"

    out = server.pipeline()
    assert out.returncode == 0, out.stdout + out.stderr
    assert _status(server, event_id) == {
        "eventId": event_id,
        "status": "processed",
        "reason": None,
        "errors": [],
        "sends": [],
    }
    assert server.get(f"events/{UNKNOWN}/status").status_code == 404


def test_command_status_lists_its_sends(
    dispatch_server: Server,  # noqa: F811
    smtp_sink: tuple[Sink, int],  # noqa: F811
) -> None:
    server, (handler, _) = dispatch_server, smtp_sink
    before = len(handler.messages)
    ids = [
        _post(
            server,
            "identify",
            {"userId": "cmd-u1", "event": "identify", "traits": {"email": "cmd@example.com"}},
        ),
        _post(server, "track", {"userId": "cmd-u1", "event": "send_email", "assetId": "welcome"}),
        _post(
            server, "track", {"anonymousId": "cmd-v-1", "event": "send_email", "assetId": "welcome"}
        ),
    ]
    wait_landed(server.data_dir, ids)
    server.pipeline()
    assert [m["To"] for m in new_messages(handler, before)] == ["cmd@example.com"]

    sent = _status(server, ids[1])
    assert sent["status"] == "processed" and sent["errors"] == []
    [send] = sent["sends"]
    assert send["channel"] == "email" and send["status"] == "sent" and send["reason"] is None
    assert send["attempts"] == 1 and send["at"].endswith("Z") and len(send["sendId"]) == 32

    failed = _status(server, ids[2])
    assert failed["status"] == "failed"
    assert [e["code"] for e in failed["errors"]] == ["customer_not_identified"]
    [send] = failed["sends"]
    assert (send["status"], send["reason"]) == ("failed", "customer_not_identified")

    # An identify is no command: no sends.
    assert _status(server, ids[0])["sends"] == []


_RUN_JOB = """
import sys
from pathlib import Path
import dagster as dg
from mallard.paths import DataPaths
from orchestration.defs import build_definitions

paths = DataPaths(Path(sys.argv[1]))
defs = build_definitions(paths.root)
with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
    for name in sys.argv[2:]:
        if name == "load":  # the pipeline's load step alone
            job = defs.resolve_job_def("pipeline").get_subset(
                asset_selection={dg.AssetKey(["raw", "messages"])}
            )
        else:
            job = defs.resolve_job_def(name)
        result = job.execute_in_process(instance=instance)
        assert result.success, name
        print(name, "ok")
"""


# The dispatch sensor evaluated on the last pipeline run's success, then again while a
# watcher holds the lock; prints what each evaluation answered.
_SENSOR = """
import sys
from pathlib import Path
import dagster as dg
from mallard.paths import DataPaths
from orchestration.defs.delivery import dispatch_after_pass
from orchestration.locks import watcher_lock
from orchestration.resources import LakeResource

paths = DataPaths(Path(sys.argv[1]))
with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
    [run] = instance.get_runs(filters=dg.RunsFilter(job_name="pipeline"), limit=1)
    [success] = [
        r.event_log_entry.dagster_event
        for r in instance.get_records_for_run(run.run_id).records
        if r.event_log_entry.dagster_event
        and r.event_log_entry.dagster_event.event_type_value == "PIPELINE_SUCCESS"
    ]
    ctx = dg.build_run_status_sensor_context(
        sensor_name="dispatch_after_pass",
        dagster_event=success,
        dagster_instance=instance,
        dagster_run=run,
        resources={"lake": LakeResource(data_dir=str(paths.root))},
    )
    print(type(dispatch_after_pass(ctx)).__name__)
    with watcher_lock(paths):
        print(type(dispatch_after_pass(ctx)).__name__)
"""


def _run_jobs(server: Server, *names: str, script: str = _RUN_JOB) -> str:
    out = subprocess.run(
        [sys.executable, "-c", script, str(server.data_dir), *names],
        cwd=REPO,
        env={**os.environ, **server.env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_dispatch_job_from_the_definitions(
    dispatch_server: Server,  # noqa: F811
    smtp_sink: tuple[Sink, int],  # noqa: F811
) -> None:
    server, (handler, _) = dispatch_server, smtp_sink
    before = len(handler.messages)
    ids = [
        _post(
            server,
            "identify",
            {"userId": "job-u1", "event": "identify", "traits": {"email": "job@example.com"}},
        ),
        _post(server, "track", {"userId": "job-u1", "event": "send_email", "assetId": "welcome"}),
    ]
    wait_landed(server.data_dir, ids)
    # The pipeline job as the daemon runs it: it loads and builds, it sends nothing itself.
    _run_jobs(server, "pipeline")
    assert new_messages(handler, before) == []
    assert _status(server, ids[1])["sends"] == []
    # Its success asks the sensor for a dispatch run, unless a watcher runs (it dispatches).
    sensor = _run_jobs(server, script=_SENSOR).split()
    assert sensor[-2:] == ["RunRequest", "SkipReason"], sensor
    # The dispatch job sends it; run again, it sends nothing twice.
    _run_jobs(server, "dispatch", "dispatch")
    assert [m["To"] for m in new_messages(handler, before)] == ["job@example.com"]
    [send] = _status(server, ids[1])["sends"]
    assert send["status"] == "sent"


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_data_through_is_not_older_than_an_event_the_answer_holds(
    dispatch_server: Server,  # noqa: F811
) -> None:
    server = dispatch_server
    event_id = _post(server, "track", {"userId": "through-u1", "event": "Through"})
    wait_landed(server.data_dir, [event_id])
    out = server.pipeline()
    assert out.returncode == 0, out.stdout + out.stderr
    deadline = time.monotonic() + 60
    while True:
        r = server.get("profiles/userId:through-u1/events", params={"size": 100})
        found = [e for e in r.json().get("data", [])] if r.status_code == 200 else []
        found = [e for e in found if e["eventId"] == event_id]
        if found:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
    received = _instant(found[0]["receivedTime"])
    assert _instant(r.headers["x-mallard-data-through"]) >= received, dict(r.headers)

    # A pass commits its events before its freshness row: an answer read from the snapshot in
    # between holds events newer than the last freshness row. Such a snapshot, made as a pass
    # makes it (the writer's turn, one commit to marts.events), must answer a header covering
    # the newest event it holds.
    from orchestration.locks import lake_writer
    from orchestration.warehouse import lake_connection

    paths = DataPaths(server.data_dir)
    later = received + timedelta(hours=1)
    with lake_writer(paths):
        conn = lake_connection(paths)
        try:
            conn.execute(
                "insert into lake.marts.events select * replace"
                " ($id as event_id, $at::timestamptz as received_time)"
                " from lake.marts.events where event_id = $was",
                {"id": f"{event_id}-later", "at": later, "was": event_id},
            )
        finally:
            conn.close()
    held = len(r.json()["data"])
    deadline = time.monotonic() + 60
    while True:  # until the server reads the new snapshot: one more row (its record is a copy)
        r = server.get("profiles/userId:through-u1/events", params={"size": 100})
        if r.status_code == 200 and len(r.json().get("data", [])) > held:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
    assert _instant(r.headers["x-mallard-data-through"]) >= later, dict(r.headers)
