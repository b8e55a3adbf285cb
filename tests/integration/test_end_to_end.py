"""The walking skeleton: HTTP in, WAL, landing Parquet, Dagster load, dbt, read API out.

The two pass tests share one server and data dir (shared_server; a server and its first pass
cost a test ~20 s), each sending as a user of its own; the watcher test has its own."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from mallard.paths import DataPaths
from orchestration.locks import lake_writer
from tests.conftest import Server, free_port, init_data_dir, wait_landed


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("e2e") / "data"
    srv = Server(d, free_port(), init_data_dir(d), env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _events_of(server: Server, user_id: str) -> list[dict[str, Any]]:
    r = server.get("events/", params={"sort": "asc", "size": 100})
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()["data"]
    assert len(events) < 100, "more events than a page: page through them"
    return [e for e in events if e["userId"] == user_id]


def _send_demo(server: Server, user_id: str = "e2e-1") -> list[str]:
    ids = []
    r = server.post(
        "identify",
        {
            "userId": user_id,
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
        r = server.post("track", {"userId": user_id, "event": name, "properties": {"n": 1}})
        assert r.status_code == 200, r.text
        ids.append(r.json()["eventId"])
    return ids


def test_identify_and_track_flow_through_to_the_read_api(shared_server: Server) -> None:
    server = shared_server
    ids = _send_demo(server)
    wait_landed(server.data_dir, ids)

    first = server.pipeline()
    assert "load" in first.stdout

    events = _events_of(server, "e2e-1")
    assert [e["eventId"] for e in events] == ids
    assert [e["eventAction"] for e in events] == ["identify", "logged_in", "order_completed"]

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
    again = _events_of(server, "e2e-1")
    assert [e["eventId"] for e in again] == ids

    # /health tells how the last pass ended, whoever ran it, and who holds the writer's turn.
    health = httpx.get(f"{server.url}/health", timeout=30).json()
    last = health["lastPass"]
    assert (last["kind"], last["ok"], last["error"]) == ("full", True, None), last
    assert last["launched_by"] == "mallard pipeline run" and last["pass_number"] >= 2
    assert health["lakeWriter"] is None
    with lake_writer(DataPaths(server.data_dir), "compaction"):
        writer = httpx.get(f"{server.url}/health", timeout=30).json()["lakeWriter"]
    assert (writer["pid"], writer["doing"]) == (os.getpid(), "compaction"), writer
    assert writer["held_s"] >= 0 and writer["since"]


def test_pipeline_twice_loads_each_landing_file_once(shared_server: Server) -> None:
    server = shared_server
    ids = _send_demo(server, "e2e-2")
    wait_landed(server.data_dir, ids)
    server.pipeline()
    server.pipeline()
    from mallard.warehouse import connect

    conn = connect(DataPaths(server.data_dir), read_only=True)
    marks = ",".join("?" * len(ids))
    raw = conn.execute(
        "select count(*), count(distinct event_id) from lake.raw.messages"
        f" where event_id in ({marks})",
        ids,
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
    landing files are there (no pass while none land); SIGTERM in the middle of a pass lets it
    finish (its data is served after), then the watcher exits 0."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from mallard.harness import REPO

    # Everything lands before the watcher starts: its first pass then holds all of it, and no
    # file lands after that pass began, so no second pass is due.
    wait_landed(server.data_dir, _send_demo(server))
    log = server.data_dir / "watch.log"
    with open(log, "wb") as out:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", "pipeline", "run", "--watch", "--poll", "0.2"],
            cwd=REPO,
            env={**os.environ, "MALLARD_DATA_DIR": str(server.data_dir)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def traits() -> dict[str, Any]:
        r = server.get("profiles/userId:e2e-1/traits")
        return dict(r.json()) if r.status_code == 200 else {}

    def wait_for(what: str, ok: Callable[[], bool], timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            assert watcher.poll() is None, log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"{what} did not happen:\n{log.read_text()}")

    def pass_ended() -> bool:
        """The last pass begun has printed its steps (a pass prints them once it has ended)."""
        text = log.read_text()
        after = text[text.rfind("pass: ") :] if "pass: " in text else ""
        return any(line.startswith(("ok  ", "FAIL")) for line in after.splitlines())

    try:
        wait_for("the first pass", lambda: traits().get("plan") == "pro")
        wait_for("the end of the first pass", pass_ended)
        passes = log.read_text().count("pass: ")
        # Idle: no file lands, so no pass begins. The window only observes; on a slow host it
        # sees fewer of the watcher's looks, and nothing in it can start a pass.
        time.sleep(3)
        assert log.read_text().count("pass: ") == passes >= 1
        r = server.post(
            "identify", {"userId": "e2e-1", "event": "identify", "traits": {"plan": "team"}}
        )
        assert r.status_code == 200, r.text
        wait_for("a pass to start", lambda: log.read_text().count("pass: ") > passes)
        wait_for("its dbt build", lambda: bool(_children(watcher.pid)))
        watcher.send_signal(signal.SIGTERM)  # in the middle of the pass, while dbt builds
        assert watcher.wait(240) == 0, log.read_text()
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    text = log.read_text()
    assert "FAIL" not in text and "Interrupted" not in text, text
    assert "BetaWarning" not in text, text  # Dagster's beta notice, once at every pass
    assert text.rstrip().endswith(f"stopped after {passes + 1} passes"), text
    assert traits().get("plan") == "team"  # the interrupted-by-SIGTERM pass finished


def _children(pid: int) -> list[int]:
    """The child processes of a process, whichever of its threads started them."""
    import os

    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return out
