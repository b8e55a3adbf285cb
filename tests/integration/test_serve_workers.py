"""`mallard serve --workers 2` (MALLARD_SERVE_WORKERS): two server processes on one port, each a
collector of its own. Connections reach both; messages accepted by either land under its own
collector id, a pass models them all, and any worker answers reads of them; the supervisor's
SIGTERM stops both, and a killed supervisor takes its workers with it (the port is free again)."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mallard.workers import collector_id
from tests.conftest import Server, free_port, init_data_dir, mallard, wait_landed

pytestmark = pytest.mark.integration

ENV = {"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_SERVE_WORKERS": "2"}


def _workers(srv: Server) -> list[int]:
    assert srv.proc is not None
    children = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    return [int(pid) for pid in children]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _collectors_answering(srv: Server, tries: int = 200) -> Counter[str]:
    """Which collector answered /health, each on a new connection, until both have."""
    seen: Counter[str] = Counter()
    for _ in range(tries):
        seen[httpx.get(f"{srv.url}/health", timeout=10).json()["collectorId"]] += 1
        if len(seen) == 2:
            break
    return seen


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("workers") / "data"
    server = Server(data, free_port(), init_data_dir(data), env=ENV)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_both_workers_take_connections_and_land_under_their_own_ids(srv: Server) -> None:
    assert len(_workers(srv)) == 2
    assert set(_collectors_answering(srv)) == {"c0", collector_id("c0", 1)} == {"c0", "c0-w1"}

    users = [f"w-user-{i}" for i in range(40)]
    ids = []
    for user in users:  # a connection each: the kernel spreads them over the workers
        r = httpx.post(
            f"{srv.base}/identify",
            json={"userId": user, "event": "identify", "traits": {"n": user}},
            headers=srv.headers,
            timeout=10,
        )
        assert r.status_code == 200, r.text
        ids.append(r.json()["eventId"])
    wait_landed(srv.data_dir, ids)
    landed = {p.name.rsplit("-", 1)[0] for p in srv.data_dir.glob("landing/date=*/*.parquet")}
    assert landed == {"c0", "c0-w1"}

    srv.pipeline()
    for user in users:
        r = srv.get(f"profiles/userId:{user}/traits")
        assert r.status_code == 200, r.text
        assert r.json()["n"] == user


def test_sigterm_to_the_supervisor_stops_every_worker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = Server(data, free_port(), init_data_dir(data), env=ENV)
    srv.start()
    workers = _workers(srv)
    assert srv.stop() == 0
    assert not [pid for pid in workers if _alive(pid)]


def test_a_killed_supervisor_takes_its_workers_and_frees_the_port(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = Server(data, free_port(), init_data_dir(data), env=ENV)
    srv.start()
    workers = _workers(srv)
    assert srv.proc is not None
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)
    deadline = time.monotonic() + 30
    while [pid for pid in workers if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)]
    with socket.socket() as s:  # no worker holds the port
        s.bind(("127.0.0.1", srv.port))


def test_zero_workers_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    init_data_dir(data)
    out = mallard("serve", "--workers", "0", "--port", str(free_port()), data_dir=data, check=False)
    assert out.returncode == 2
    assert "--workers must be 1 or more" in out.stderr
