"""The walking skeleton: HTTP in, WAL, landing Parquet, Dagster load, dbt, read API out."""

from __future__ import annotations

from tests.conftest import Server, wait_landed


def _send_demo(server: Server) -> list[str]:
    ids = []
    r = server.post(
        "identify",
        {
            "userId": "e2e-1",
            "event": "identify",
            "traits": {
                "email": "E2E@example.com",
                "firstName": "Edna",
                "lastName": "Ewing",
                "plan": "pro",
            },
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["success"] is True
    ids.append(r.json()["eventId"])
    for name in ("Logged In", "Order Completed"):
        r = server.post("track", {"userId": "e2e-1", "event": name, "properties": {"n": 1}})
        assert r.status_code == 200, r.text
        ids.append(r.json()["eventId"])
    return ids


def test_identify_and_track_flow_through_to_the_read_api(server: Server) -> None:
    ids = _send_demo(server)
    wait_landed(server.data_dir, ids)

    first = server.pipeline()
    assert "load" in first.stdout

    events = server.get("events/", params={"sort": "asc"}).json()["data"]
    assert [e["eventId"] for e in events] == ids
    assert [e["eventAction"] for e in events] == ["identify", "logged_in", "order_completed"]
    assert {e["userId"] for e in events} == {"e2e-1"}

    traits = server.get("profiles/userId:e2e-1/traits")
    assert traits.status_code == 200, traits.text
    body = traits.json()
    assert body["email"] == "E2E@example.com"
    assert body["plan"] == "pro"
    assert body["name"] == "Edna Ewing"
    assert body["externalId"] == "e2e-1"
    assert body["id"]

    # A second pass finds nothing new and changes nothing.
    server.pipeline()
    again = server.get("events/", params={"sort": "asc"}).json()["data"]
    assert [e["eventId"] for e in again] == ids


def test_pipeline_twice_loads_each_landing_file_once(server: Server) -> None:
    ids = _send_demo(server)
    wait_landed(server.data_dir, ids)
    server.pipeline()
    server.pipeline()
    from mallard.paths import DataPaths
    from mallard.warehouse import connect

    conn = connect(DataPaths(server.data_dir), read_only=True)
    raw = conn.execute(
        "select count(*), count(distinct event_id) from lake.raw.messages"
    ).fetchone()
    files = conn.execute(
        "select count(*), count(distinct landing_file) from lake.raw.landing_files"
    ).fetchone()
    assert raw == (len(ids), len(ids))
    assert files is not None and files[0] == files[1] and files[0] >= 1


# Reads during a rebuild: tests/integration/test_read_api.py
# (test_scrolls_survive_and_reads_switch_atomically_during_a_rebuild).


def test_pipeline_watch_runs_a_pass_per_landing_and_stops_cleanly(server: Server) -> None:
    """`mallard pipeline run --watch` stays up and runs a pass in its own process whenever new
    landing files are there (no pass while none land); SIGTERM lets the pass under way finish."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from mallard.harness import REPO

    log = server.data_dir / "watch.log"
    with open(log, "wb") as out:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", "pipeline", "run", "--watch", "--poll", "0.2"],
            cwd=REPO,
            env={**os.environ, "MALLARD_DATA_DIR": str(server.data_dir)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def visible(user_id: str, key: str, value: str, timeout: float = 240) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                r = server.get(f"profiles/userId:{user_id}/traits")
                if r.status_code == 200 and r.json().get(key) == value:
                    return
                assert watcher.poll() is None, log.read_text()
                time.sleep(0.5)
            raise AssertionError(f"{user_id} not visible:\\n{log.read_text()}")

        wait_landed(server.data_dir, _send_demo(server))
        visible("e2e-1", "plan", "pro")
        r = server.post(
            "identify", {"userId": "e2e-1", "event": "identify", "traits": {"plan": "team"}}
        )
        assert r.status_code == 200, r.text
        wait_landed(server.data_dir, [r.json()["eventId"]])
        visible("e2e-1", "plan", "team")  # a second pass, by the same process
        time.sleep(3)  # idle: no new files, no pass
        passes = log.read_text().count("dbt build:")
        time.sleep(3)
        assert log.read_text().count("dbt build:") == passes >= 2
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(120) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert f"stopped after {passes} passes" in log.read_text()
