"""`mallard import customers` on real processes: a served data dir, the CLI, `mallard pipeline run`.

A 100,000-row CSV with three bad rows stores nothing and names exactly those lines; fixed, it
makes 100,000 customers whose traits the profile API serves, with createdBy naming the file;
imported again, nothing in the marts changes. A suppressed user's row is dropped and counted;
.parquet, .jsonl and --map read too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from mallard.harness import mallard
from mallard.paths import DataPaths
from mallard.warehouse import connect
from tests.conftest import Server, free_port, init_data_dir

N = 100_000
BAD = {
    17: "userId is empty",
    5_003: 'email is not a valid address: "nobody"',
    88_000: "userId is empty",
}
SUPPRESSED = "imp-suppressed"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("import") / "data"
    server = Server(d, free_port(), init_data_dir(d))
    server.start()
    yield server
    server.stop()


def import_file(srv: Server, path: Path, *extra: str) -> Any:
    c = srv.creds
    return mallard(
        "import", "customers", str(path), "--client", c["clientId"], "--account",
        c["accountId"], "--json", *extra, data_dir=srv.data_dir, check=False,
    )  # fmt: skip


def customers_csv(path: Path, bad: bool) -> Path:
    """Line L of the file (header: line 1) is user imp-(L-2); BAD lines broken when asked."""
    users = [f"imp-{i}" for i in range(N)]
    emails = [f"user{i}@example.com" for i in range(N)]
    if bad:
        for line, reason in BAD.items():
            if reason.startswith("userId"):
                users[line - 2] = "" if line % 2 else "  "
            else:
                emails[line - 2] = "nobody"
    pl.DataFrame(
        {
            "user_id": users,
            "email": emails,
            "firstName": [f"First{i % 97}" for i in range(N)],
            "plan": [("free", "pro", "team")[i % 3] for i in range(N)],
        }
    ).write_csv(path)
    return path


def import_segments(srv: Server) -> list[Path]:
    paths = DataPaths(srv.data_dir)
    wal = [p for p in (paths.wal_dir / "import").glob("*") if not p.name.startswith(".")]
    return wal + list(paths.landing_dir.glob("*/import-*.parquet"))


def marts(srv: Server) -> tuple[int, int, int]:
    """Customers made by the big file, a checksum of their traits and createdBy, raw rows."""
    conn = connect(DataPaths(srv.data_dir), read_only=True)
    try:
        count, checksum = conn.execute(
            "select count(*), sum(hash(user_id, traits::varchar, metadata -> 'createdBy'))"
            " from lake.marts.customers where regexp_full_match(user_id, 'imp-[0-9]+')"
        ).fetchone()  # type: ignore[misc]
        (raw,) = conn.execute("select count(*) from lake.raw.messages").fetchone()  # type: ignore[misc]
    finally:
        conn.close()
    return int(count), int(checksum), int(raw)


def traits(srv: Server, user: str) -> dict[str, Any]:
    r = srv.get(f"profiles/userId:{user}/traits")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_bad_rows_are_reported_by_line_and_nothing_is_stored(srv: Server, tmp_path: Path) -> None:
    out = import_file(srv, customers_csv(tmp_path / "customers.csv", bad=True))
    assert out.returncode == 1, out.stdout + out.stderr
    reported = [line for line in out.stderr.splitlines() if line.startswith("line ")]
    assert reported == [f"line {line}: {reason}" for line, reason in sorted(BAD.items())]
    assert "3 bad row(s)" in out.stderr
    assert import_segments(srv) == []


def test_import_lands_customers_with_traits_and_created_by(srv: Server, tmp_path: Path) -> None:
    c = srv.creds
    r = httpx.post(
        f"{srv.url}/track/{c['clientId']}/{c['accountId']}/{c['brandId']}/v1/regulations",
        json={"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": [SUPPRESSED]}},
        headers=srv.headers,
        timeout=60,
    )
    assert r.status_code in (200, 201, 202), r.text

    big = customers_csv(tmp_path / "customers.csv", bad=False)
    out = import_file(srv, big)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["read"], summary["stored"], summary["droppedByRegulations"]) == (N, N, 0)

    lines = tmp_path / "more.jsonl"
    lines.write_text(
        "\n".join(
            json.dumps(row)
            for row in (
                {"userId": "imp-json-1", "email": "j1@example.com", "age": 41, "vip": True},
                {"userId": SUPPRESSED, "email": "gone@example.com"},
                {"userId": 12345, "tags": ["a", "b"]},
            )
        )
        + "\n"
    )
    out = import_file(srv, lines)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["read"], summary["stored"], summary["droppedByRegulations"]) == (3, 2, 1)

    parquet = tmp_path / "more.parquet"
    pl.DataFrame(
        {"userId": ["imp-pq-1"], "score": [2.5], "address": [{"city": "Lyon", "zip": "69001"}]}
    ).write_parquet(parquet)
    assert import_file(srv, parquet).returncode == 0

    mapped = tmp_path / "mapped.csv"
    mapped.write_text("id,mail,Plan,junk\nimp-map-1,m1@example.com,gold,x\n")
    out = import_file(srv, mapped, "--map", "id=userId", "--map", "mail=email",
                      "--map", "Plan=traits.plan", "--map", "junk=-")  # fmt: skip
    assert out.returncode == 0, out.stderr

    srv.pipeline()
    count, _, _ = marts(srv)
    assert count == N
    for i in (0, 1, 4_242, N - 1):
        t = traits(srv, f"imp-{i}")
        assert t["email"] == f"user{i}@example.com"
        assert (t["firstName"], t["plan"]) == (f"First{i % 97}", ("free", "pro", "team")[i % 3])
    meta = srv.get("profiles/userId:imp-7/metadata").json()
    assert meta["createdBy"]["filename"] == "customers.csv"
    assert meta["createdBy"]["type"] == "import"
    assert meta["createdBy"]["createdTime"].endswith("Z")

    j = traits(srv, "imp-json-1")
    assert (j["email"], j["age"], j["vip"]) == ("j1@example.com", 41, True)
    assert traits(srv, "12345")["tags"] == ["a", "b"]
    assert srv.get(f"profiles/userId:{SUPPRESSED}/traits").status_code == 404
    assert traits(srv, "imp-pq-1")["address"] == {"city": "Lyon", "zip": "69001"}
    m = traits(srv, "imp-map-1")
    assert (m["email"], m["plan"]) == ("m1@example.com", "gold")
    assert "junk" not in m and "mail" not in m


def test_importing_again_changes_nothing(srv: Server, tmp_path: Path) -> None:
    before = marts(srv)
    big = customers_csv(tmp_path / "customers.csv", bad=False)
    out = import_file(srv, big)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stored"] == N
    srv.pipeline()
    after = marts(srv)
    # The raw copies are deduplicated by messageId: the customers and their traits are the same.
    assert after[:2] == before[:2]
