"""A Delete killed (SIGKILL) after each of its steps, run again each time (the last time by
`mallard pipeline run`, which carries unfinished regulations forward), ends in the state an
uninterrupted Delete of the same lake reaches: same marts, same landing files, nothing left of
the subject, and the evidence of the attempts adds up to the uninterrupted one's."""

from __future__ import annotations

import secrets
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from mallard.paths import DataPaths
from mallard.regulations import RegulationStore
from orchestration.warehouse import lake_connection
from tests.conftest import Server, free_port, init_data_dir, mallard, wait_landed

pytestmark = [pytest.mark.integration, pytest.mark.faults]

U = secrets.token_hex(4)
SUBJECT, OTHER, ANON = f"killed-{U}", f"kept-{U}", f"anon-killed-{U}"
# Each run of the Delete is killed once this step has done its work.
KILLED_AT = ["resolve", "purge_rows", "purge_landing", "purge_files", "purge_side_stores", "forget"]
QUERIES = [
    "select event_id, customer_id, record from lake.marts.events",
    "select customer_id, user_id, traits, subscription_id from lake.marts.customers",
    "select customer_id, id_type, id_value from lake.marts.customer_identifiers",
    "select account_id, anonymous_id, user_id from lake.intermediate.int_identity_map",
    "select event_id, user_id, anonymous_id from lake.raw.messages",
]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data dir with the subject's and another user's messages modelled; no server left."""
    data = tmp_path_factory.mktemp("killed") / "data"
    srv = Server(data, free_port(), init_data_dir(data), env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    srv.start()
    try:
        ids = []
        for body in (
            {"type": "page", "anonymousId": ANON, "event": "page"},
            {
                "type": "identify",
                "event": "identify",
                "userId": SUBJECT,
                "anonymousId": ANON,
                "traits": {"a": U},
            },
            {"type": "track", "userId": SUBJECT, "event": "Bought"},
            {"type": "identify", "event": "identify", "userId": OTHER, "traits": {"b": U}},
            {"type": "track", "userId": OTHER, "event": "Bought"},
        ):
            r = srv.post(str(body["type"]), body)
            assert r.status_code == 200, r.text
            ids.append(r.json()["eventId"])
        wait_landed(data, ids)
        srv.pipeline()
    finally:
        srv.stop()
    yield data


def _delete(data: Path, kill_at: list[str]) -> dict[str, Any]:
    store = RegulationStore(DataPaths(data))
    reg = store.file("demo", "demo", "DEMO", "SUPPRESS_WITH_DELETE", [SUBJECT], {SUBJECT: [ANON]})
    for step in kill_at:
        out = mallard(
            "regulations",
            "run",
            reg.regulation_id,
            data_dir=data,
            check=False,
            env={"MALLARD_FAULT_KILL_AT": step},
        )
        assert out.returncode == -9, (step, out.returncode, out.stdout, out.stderr)
        assert store.get(reg.regulation_id).status == "running", step  # type: ignore[union-attr]
    if kill_at:
        # `mallard pipeline run` carries the unfinished regulation forward (a detached run).
        mallard("pipeline", "run", data_dir=data)
        deadline = time.monotonic() + 240
        while store.get(reg.regulation_id).status == "running":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "not carried forward"
            time.sleep(0.5)
    else:
        mallard("regulations", "run", reg.regulation_id, data_dir=data)
    done = store.get(reg.regulation_id)
    assert done is not None and done.status == "finished", done
    return done.evidence or {}


def _state(data: Path) -> list[list[tuple[Any, ...]]]:
    conn = lake_connection(DataPaths(data))
    try:
        return [sorted(conn.execute(q).fetchall(), key=repr) for q in QUERIES]
    finally:
        conn.close()


def _landing(data: Path) -> list[str]:
    return sorted(
        e
        for f in data.glob("landing/date=*/*.parquet")
        for e in pq.read_table(f, columns=["event_id"]).column("event_id").to_pylist()
    )


def test_killed_after_each_step_ends_as_an_uninterrupted_delete(lake: Path, tmp_path: Path) -> None:
    calm = tmp_path / "calm"
    shutil.copytree(lake, calm, symlinks=True)
    # DuckLake's catalog names its data path: the copy's names the copy's.
    with sqlite3.connect(calm / "lake" / "catalog.sqlite") as catalog:
        catalog.execute(
            "update ducklake_metadata set value = ? where key = 'data_path'",
            [f"{calm}/lake/files/"],
        )
    killed = _delete(lake, KILLED_AT)
    uninterrupted = _delete(calm, [])
    assert _state(lake) == _state(calm)
    assert _landing(lake) == _landing(calm)
    assert SUBJECT not in str(_state(lake)) and OTHER in str(_state(lake))
    for evidence in (killed, uninterrupted):
        assert evidence["rowsRemainingTotal"] == 0 and evidence["bytesFoundTotal"] == 0
    assert killed["rowsDeleted"] == uninterrupted["rowsDeleted"]
    assert killed["landingRowsRemoved"] == uninterrupted["landingRowsRemoved"] > 0
