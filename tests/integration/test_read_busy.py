"""The read API while the lake's SQLite catalog stays locked by another process: a read that
needs the catalog retries, then answers 503 in JSON with Retry-After (api/service/lake.py); once
the lock is released the same read answers 200 with the same rows, on the same server.

The lock is the strongest a SQLite writer takes: a write transaction in exclusive locking mode,
held by a process of its own. Readers of the catalog (DuckDB's DuckLake through its SQLite
extension) get "database is locked" for as long as it is held. An `asOf` read is always SQL on the
lake (api/service/as_of.py), so it needs the catalog on every request.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.paths import DataPaths
from tests.conftest import REPO, Server, free_port, init_data_dir, wait_landed

pytestmark = pytest.mark.integration

USERS = [f"busy-{i}" for i in range(3)]
AS_OF = "2100-01-01T00:00:00Z"
# A request stuck behind the lock answers only after its retries, each of which first waits out
# DuckDB's SQLite busy timeout: the client's timeout leaves room for all of them.
SLOW_ANSWER_S = 300

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("pragma locking_mode=exclusive")
conn.execute("begin exclusive")
print("held", flush=True)
sys.stdin.readline()
conn.execute("rollback")
conn.close()
print("released", flush=True)
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("busy") / "data"
    server = Server(d, free_port(), init_data_dir(d), env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    server.start()
    try:
        ids = []
        for i, user in enumerate(USERS):
            body = {"userId": user, "event": "Busy", "timestamp": f"2026-01-01T00:00:0{i}Z"}
            r = server.post("track", body)
            assert r.status_code == 200, r.text
            ids.append(r.json()["eventId"])
        wait_landed(d, ids)
        server.pipeline()
        yield server
    finally:
        server.stop()


class CatalogLock:
    """The catalog's exclusive lock, held by another process from `hold()` to `release()`."""

    def __init__(self, catalog: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(catalog)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "released"
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def _as_of_events(srv: Server) -> httpx.Response:
    return httpx.get(
        f"{srv.base}/events/",
        params={"asOf": AS_OF, "sort": "asc"},
        headers=srv.headers,
        timeout=SLOW_ANSWER_S,
    )


def _users(body: dict[str, Any]) -> list[str]:
    return [e["userId"] for e in body["data"]]


def test_a_read_needing_a_locked_catalog_answers_503_with_retry_after_then_recovers(
    srv: Server,
) -> None:
    before = _as_of_events(srv)
    assert before.status_code == 200, before.text
    assert _users(before.json()) == USERS

    lock = CatalogLock(DataPaths(srv.data_dir).lake_catalog)
    try:
        busy = _as_of_events(srv)
        assert busy.status_code == 503, busy.text
        assert busy.headers["content-type"].startswith("application/json")
        assert busy.json() == {
            "error": {"code": "internal_server_error", "message": "the warehouse is busy; retry"}
        }
        assert busy.headers.get("retry-after") == "1", dict(busy.headers)
        lock.release()
    finally:
        lock.stop()

    # The same server, no restart: the retry the 503 asked for is answered.
    after = _as_of_events(srv)
    assert after.status_code == 200, after.text
    assert after.json() == before.json()
