"""`mallard sql` against a real server and pipeline: the DuckDB shell on the lake, read-only.

One module-scoped server and data dir; a first pass builds a lake with a few identified
customers. Every shell runs with proxies pointed at a closed port, so any download would fail.
The last test runs a second pass and queries while it writes, so it stays last.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mallard.harness import REPO
from mallard.paths import DataPaths
from mallard.sql_shell import init_sql
from tests.conftest import Server, free_port, init_data_dir, wait_landed

pytestmark = pytest.mark.integration

FIRST, MORE = 5, 7  # identified customers before and in the second pass
COUNT = "select count(*) from customers"
QUERY_EVERY_S = 1.5  # plus ~0.6 s per query: a start of Python and the shell
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}


def identify(server: Server, users: range) -> None:
    ids: list[str] = []
    for n in users:
        user = f"sql-user-{n}"
        traits = {"email": f"{user}@example.com"}
        r = server.post("identify", {"event": "identify", "userId": user, "traits": traits})
        assert r.status_code == 200, r.text
        ids.append(r.json()["eventId"])
    wait_landed(server.data_dir, ids)


def sql(server: Server, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mallard.cli", "sql", *args],
        cwd=REPO,
        env={**os.environ, "MALLARD_DATA_DIR": str(server.data_dir), **OFFLINE},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("sql") / "data"
    srv = Server(d, free_port(), init_data_dir(d), env={"MALLARD_ROLL_INTERVAL_S": "0.2"})
    srv.start()
    identify(srv, range(FIRST))
    srv.pipeline()
    yield srv
    srv.stop()


def test_count_as_csv(server: Server) -> None:
    out = sql(server, "-c", COUNT, "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["count_star()", str(FIRST)]


def test_json_parses(server: Server) -> None:
    out = sql(server, "-c", "select user_id from customers order by 1", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"user_id": f"sql-user-{n}"} for n in range(FIRST)]


def test_bad_query_fails_with_duckdbs_error(server: Server) -> None:
    out = sql(server, "-c", "select nosuch from customers")
    assert out.returncode != 0
    assert 'Referenced column "nosuch" not found' in out.stderr, out.stderr


def test_lake_is_read_only(server: Server) -> None:
    out = sql(server, "-c", "create table lake.marts.scratch as select 1 as x")
    assert out.returncode != 0
    assert "read-only" in out.stderr.lower(), out.stderr


def test_extensions_come_from_the_data_dir(server: Server) -> None:
    paths = DataPaths(server.data_dir)
    assert not re.search(r"\binstall\b", init_sql(paths), re.IGNORECASE)
    out = sql(
        server,
        "-c",
        "select extension_name, install_path from duckdb_extensions()"
        " where loaded and install_path like '/%' order by 1",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {r["extension_name"] for r in rows} >= {"ducklake", "sqlite_scanner"}
    for r in rows:
        assert Path(r["install_path"]).is_relative_to(paths.extensions_dir), r


def test_interactive_shell_reads_stdin(server: Server) -> None:
    out = sql(server, "--format", "csv", stdin=f"{COUNT};\nselect count(*) from events;\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["count_star()", str(FIRST), "count_star()", str(FIRST)]


def test_answers_while_a_pass_writes(server: Server) -> None:
    identify(server, range(FIRST, FIRST + MORE))
    env = {**os.environ, "MALLARD_DATA_DIR": str(server.data_dir), **server.env}
    log = server.data_dir / "sql-pass.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", "pipeline", "run"],
            cwd=REPO,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    seen: list[int] = []
    try:
        while True:
            out = sql(server, "-c", COUNT, "--format", "csv")
            assert out.returncode == 0, out.stderr
            seen.append(int(out.stdout.splitlines()[1]))
            try:  # a query every ~2 s: back to back, they slowed the pass by half on 2 cores
                proc.wait(QUERY_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(600)
    assert proc.returncode == 0, log.read_text()
    assert len(seen) >= 3, seen  # the pass lasted several queries
    assert set(seen) <= {FIRST, FIRST + MORE}, seen
    assert seen == sorted(seen), seen  # committed snapshots only move forward
    out = sql(server, "-c", COUNT, "--format", "csv")
    assert out.stdout.splitlines() == ["count_star()", str(FIRST + MORE)]
