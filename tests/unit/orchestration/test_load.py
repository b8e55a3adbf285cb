"""Loading landing files exactly once, the HMAC pads, and the Dagster definitions."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from bench.generator import Traffic
from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.context import subscription_id
from orchestration.environment import hmac_pads
from orchestration.load import landing_files, load_new_files


def write_landing(paths: DataPaths, events: int, seed: int, files: int = 2) -> list[str]:
    tables = list(
        Traffic(seed=seed, customers=20, events=events).landing_batches(
            rows_per_batch=max(1, events // files)
        )
    )
    names = []
    for i, t in enumerate(tables):
        d = paths.landing_partition("2026-01-01")
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, d / f"t{seed}-{i:04d}.parquet")
        names.append(f"date=2026-01-01/t{seed}-{i:04d}.parquet")
    (d / ".t-tmp.parquet.tmp").write_bytes(b"partial")  # a roll in progress: never loaded
    return names


def counts(paths: DataPaths) -> tuple[int, int]:
    conn = connect(paths, read_only=True)
    try:
        rows = conn.execute("select count(*) from lake.raw.messages").fetchone()
        files = conn.execute("select count(*) from lake.raw.landing_files").fetchone()
        return int(rows[0]), int(files[0])  # type: ignore[index]
    finally:
        conn.close()


def test_each_file_loads_exactly_once(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    names = write_landing(paths, 300, seed=1)
    assert landing_files(paths) == names
    first = load_new_files(paths)
    assert (first.files, first.rows) == (len(names), 300)
    assert load_new_files(paths).files == 0
    more = write_landing(paths, 100, seed=2)
    second = load_new_files(paths)
    assert (second.files, second.rows) == (len(more), 100)
    assert counts(paths) == (400, len(names) + len(more))


def test_a_failed_load_leaves_nothing_and_the_rerun_loads_all(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    names = write_landing(paths, 200, seed=3)
    with pytest.raises(RuntimeError, match="injected"):
        load_new_files(paths, fail_before_commit=True)
    assert counts(paths) == (0, 0)
    assert load_new_files(paths).rows == 200
    assert counts(paths) == (200, len(names))


def test_hmac_pads_compose_the_hmac_in_duckdb() -> None:
    secret = os.urandom(32).hex()
    ipad, opad = hmac_pads(secret)
    got = duckdb.sql(
        f"select sha256(unhex('{opad}') || unhex(sha256(unhex('{ipad}') || 'cust-42'::blob)))"
    ).fetchone()
    want = hmac.new(bytes.fromhex(secret), b"cust-42", hashlib.sha256).hexdigest()
    assert got == (want,)
    assert subscription_id(secret, "cust-42") == want


def test_definitions_load(tmp_path: Path) -> None:
    import dagster as dg

    from orchestration.defs import build_definitions

    defs = build_definitions(tmp_path)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"raw/messages", "staging/stg_messages", "marts/events", "marts/customers"} <= keys
    graph = defs.resolve_asset_graph()
    assert (
        dg.AssetKey(["raw", "messages"])
        in graph.get(dg.AssetKey(["staging", "stg_messages"])).parent_keys
    )
    assert defs.resolve_job_def("pipeline")
    assert defs.resolve_sensor_def("landing_files_sensor")
    assert defs.resolve_schedule_def("pass_every_15_minutes")
