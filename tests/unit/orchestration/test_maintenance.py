"""Maintenance after incremental passes: fewer files, no delete files, same rows, old snapshots
and their files gone; compaction of the tables passes fragmented, started by a sensor."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from mallard.paths import DataPaths
from mallard.settings import get_settings
from mallard.warehouse import connect
from orchestration.defs.dbt import ensure_manifest
from orchestration.defs.maintenance import compaction, fragmentation_sensor, maintenance
from orchestration.folds import Fold, declared_folds
from orchestration.locks import watcher_lock
from orchestration.maintenance import compact_fragmented, maintain, needs_compaction
from orchestration.resources import LakeResource
from orchestration.warehouse import ensure_warehouse


def _lake(data_dir: Path) -> dict[str, LakeResource]:
    return {"lake": LakeResource(data_dir=str(data_dir))}


def _files(paths: DataPaths) -> list[tuple[str, str | None]]:
    conn = connect(paths, read_only=True)
    try:
        return [
            (str(r[0]), r[1])
            for r in conn.execute(
                "select data_file, delete_file"
                " from ducklake_list_files('lake', 'events', schema => 'marts')"
            ).fetchall()
        ]
    finally:
        conn.close()


def test_passes_leave_few_files_and_the_same_rows(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    conn = connect(paths)
    try:
        conn.execute(
            "create table lake.marts.events as"
            " select i as event_id, i % 100 as customer_id, repeat('x', 50) as record"
            " from range(5000) t(i)"
        )
        for p in range(6):  # six incremental passes: delete some customers' rows, insert anew
            conn.execute("begin")
            conn.execute(f"delete from lake.marts.events where customer_id % 7 = {p}")
            conn.execute(
                "insert into lake.marts.events"
                f" select i, i % 100, repeat('y', 50) from range(5000) t(i) where i % 100 % 7 = {p}"
            )
            conn.execute("commit")
        want = conn.execute("select * from lake.marts.events order by event_id").fetchall()
    finally:
        conn.close()
    before = _files(paths)
    assert len(before) > 2 and any(d for _, d in before)
    on_disk = {p for p in paths.lake_data.rglob("*.parquet")}

    result = maintain(paths, retention=timedelta(0))

    after = _files(paths)
    assert len(after) < len(before) and not any(d for _, d in after)
    assert (result.files_before, result.files_after) >= (len(before), len(after))
    assert result.snapshots_expired > 0 and result.files_deleted > 0
    conn = connect(paths, read_only=True)
    try:
        assert conn.execute("select * from lake.marts.events order by event_id").fetchall() == want
    finally:
        conn.close()
    # The old files are gone from disk, not only from the catalog.
    assert {p for p in paths.lake_data.rglob("*.parquet")} < on_disk | {Path(f) for f, _ in after}
    assert not {Path(f) for f, _ in before} - {Path(f) for f, _ in after} & set(
        paths.lake_data.rglob("*.parquet")
    )


def test_maintenance_drops_what_interrupted_builds_left(tmp_path: Path) -> None:
    """dbt replaces a table through `x__dbt_tmp` and `x__dbt_backup`; a build killed in between
    leaves them in the lake, where analysts see them and every maintenance compacted them."""
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    conn = connect(paths)
    try:
        for name in ("marts.profiles__dbt_backup", "intermediate.traits__dbt_tmp", "marts.kept"):
            conn.execute(f"create table lake.{name} as select 1 as x")
    finally:
        conn.close()
    result = maintain(paths)
    assert result.leftovers_dropped == (
        "intermediate.traits__dbt_tmp",
        "marts.profiles__dbt_backup",
    )
    assert "dropped 2 leftovers" in result.summary
    conn = connect(paths, read_only=True)
    try:
        names = {
            f"{s}.{t}"
            for s, t in conn.execute(
                "select schema_name, table_name from duckdb_tables() where database_name = 'lake'"
            ).fetchall()
        }
    finally:
        conn.close()
    assert "marts.kept" in names
    assert not {"marts.profiles__dbt_backup", "intermediate.traits__dbt_tmp"} & names
    assert maintain(paths).leftovers_dropped == ()


def test_the_maintenance_job_runs_in_dagster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLARD_DATA_DIR", str(tmp_path))
    ensure_warehouse(DataPaths(tmp_path))
    priority = (os.nice(0), os.sched_getscheduler(0))
    runs: list[dg.ExecuteInProcessResult] = []
    with dg.DagsterInstance.ephemeral() as instance:
        # On a thread of its own, as `mallard pipeline run --watch` runs passes: the job lowers
        # its thread's priority (yield_cpu_to_readers), which on this test's main thread stayed
        # for every later test and every server they started.
        worker = threading.Thread(
            target=lambda: runs.append(
                maintenance.execute_in_process(instance=instance, resources=_lake(tmp_path))
            )
        )
        worker.start()
        worker.join()
        result = runs[0]
        assert result.success
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any("snapshots expired" in m for m in logs), "the job reports what it did"
    assert (os.nice(0), os.sched_getscheduler(0)) == priority


def _fragment(paths: DataPaths, table: str, passes: int) -> None:
    """A table as incremental passes leave it: each pass deletes a 13th of the customers' rows
    and inserts their new rows as a new small file (no file loses every row in 12 passes)."""
    conn = connect(paths)
    try:
        conn.execute(
            f"create table lake.intermediate.{table} as"
            " select i as event_id, i % 100 as customer_id from range(5000) t(i)"
        )
        for p in range(passes):
            conn.execute("begin")
            conn.execute(f"delete from lake.intermediate.{table} where customer_id % 13 = {p % 13}")
            conn.execute(
                f"insert into lake.intermediate.{table}"
                f" select i, i % 100 from range(5000) t(i) where i % 100 % 13 = {p % 13}"
            )
            conn.execute("commit")
    finally:
        conn.close()


def _rows(paths: DataPaths, table: str) -> list[tuple[int, int]]:
    conn = connect(paths, read_only=True)
    try:
        rows = conn.execute(f"select * from lake.intermediate.{table} order by all").fetchall()
        return [(int(a), int(b)) for a, b in rows]
    finally:
        conn.close()


def test_compaction_takes_only_the_fragmented_tables(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    _fragment(paths, "churned", passes=8)
    _fragment(paths, "calm", passes=1)
    churned, calm = _rows(paths, "churned"), _rows(paths, "calm")

    fragmented = needs_compaction(paths, at=6)
    assert [(s, t) for s, t, _ in fragmented] == [("intermediate", "churned")]
    assert fragmented[0][2] >= 6
    assert needs_compaction(paths, at=0) == [], "0 turns compaction after passes off"

    result = compact_fragmented(paths, at=6)

    assert [t for _, t, _ in result.tables] == ["churned"]
    assert result.files_after < result.files_before
    assert "intermediate.churned" in result.summary
    # What compaction can fix is fixed: no file of churned keeps deletes or stays small beside
    # another; calm, left alone, still has its two (a file with deletes, one small file).
    assert needs_compaction(paths, at=2) == [("intermediate", "calm", 2)]
    assert _rows(paths, "churned") == churned and _rows(paths, "calm") == calm
    assert compact_fragmented(paths, at=6).summary == "no table fragmented"


def test_compaction_runs_in_slices_most_fragmented_table_first(tmp_path: Path) -> None:
    """A slice that has run out starts no other table (the one writer goes back to passes): the
    most fragmented table is compacted, the other left for the next slice, which takes it."""
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    _fragment(paths, "churned", passes=10)
    _fragment(paths, "busy", passes=8)
    churned, busy = _rows(paths, "churned"), _rows(paths, "busy")
    assert [t for _, t, _ in needs_compaction(paths, at=6)] == ["churned", "busy"]

    first = compact_fragmented(paths, at=6, slice_s=1e-9)

    assert [t for _, t, _ in first.tables] == ["churned"]
    assert [t for _, t, _ in first.left] == ["busy"]
    assert first.summary.endswith("; 1 left for the next pass"), first.summary
    assert [t for _, t, _ in needs_compaction(paths, at=6)] == ["busy"]
    second = compact_fragmented(paths, at=6, slice_s=1e-9)
    assert [t for _, t, _ in second.tables] == ["busy"] and not second.left
    assert needs_compaction(paths, at=6) == []
    assert _rows(paths, "churned") == churned and _rows(paths, "busy") == busy
    # No limit: every fragmented table in one call.
    _fragment(paths, "again", passes=8)
    _fragment(paths, "more", passes=8)
    assert len(compact_fragmented(paths, at=6, slice_s=0).tables) == 2


def test_the_fragmentation_sensor_requests_a_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLARD_DATA_DIR", str(tmp_path))
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    with dg.DagsterInstance.ephemeral() as instance:
        quiet = fragmentation_sensor(
            dg.build_sensor_context(instance=instance, resources=_lake(tmp_path))
        )
        assert not quiet.run_requests and quiet.skip_reason  # type: ignore[union-attr]

        _fragment(paths, "churned", passes=get_settings().compact_at_files + 2)
        asked = fragmentation_sensor(
            dg.build_sensor_context(instance=instance, resources=_lake(tmp_path))
        )
        assert len(asked.run_requests or []) == 1  # type: ignore[union-attr]
        with watcher_lock(paths):  # the pipeline watcher compacts after its own passes
            held = fragmentation_sensor(
                dg.build_sensor_context(instance=instance, resources=_lake(tmp_path))
            )
            assert not held.run_requests  # type: ignore[union-attr]
            assert "pipeline watcher" in held.skip_reason.skip_message  # type: ignore[union-attr]

        runs: list[dg.ExecuteInProcessResult] = []
        worker = threading.Thread(  # off the main thread, as in the maintenance job's test
            target=lambda: runs.append(
                compaction.execute_in_process(instance=instance, resources=_lake(tmp_path))
            )
        )
        worker.start()
        worker.join()
        assert runs[0].success
        assert "intermediate.churned" in runs[0].output_for_node("compact_fragmented_tables")
        after = fragmentation_sensor(
            dg.build_sensor_context(instance=instance, resources=_lake(tmp_path))
        )
        assert not after.run_requests  # type: ignore[union-attr]


def test_compacted_files_keep_every_row_findable_by_value(tmp_path: Path) -> None:
    """Two big files with deletes and 30 tiny ones (passes of a customer or two, none with an
    anonymous_id) rewritten into one: the tiny ones' rows make a last row group of their own,
    all null, and DuckLake (1.5.5) then records no min/max for the file's anonymous_id and
    answered `where anonymous_id = ...` with no rows. Compaction records them from the data."""
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    conn = connect(paths)
    try:
        for prefix in ("c", "d"):
            conn.execute(
                "create table if not exists lake.marts.visitors"
                " (customer_id varchar, anonymous_id varchar)"
            )
            conn.execute(
                f"insert into lake.marts.visitors select '{prefix}' || lpad(i::varchar, 6, '0'),"
                f" '{prefix}a' || i from range(20000) t(i) order by 1"
            )
        conn.execute("delete from lake.marts.visitors where customer_id like '_001%'")
        for k in range(30):
            conn.execute(f"insert into lake.marts.visitors values ('p{k}', null), ('q{k}', null)")
            conn.execute(f"delete from lake.marts.visitors where customer_id = 'q{k}'")
    finally:
        conn.close()

    result = compact_fragmented(paths, at=2)

    assert result.files_after == 1, result.summary
    conn = connect(paths)
    try:
        conn.execute("insert into lake.marts.visitors values ('e0', 'zz')")  # a file with stats
        found = conn.execute(
            "select count(*) from lake.marts.visitors where anonymous_id in ('ca9000', 'da42')"
        ).fetchone()
        missing = conn.execute(
            "select count(*) from __ducklake_metadata_lake.ducklake_file_column_stats"
            " where min_value is null and value_count > 0"
        ).fetchone()
    finally:
        conn.close()
    assert found == (2,)
    assert missing == (0,)
    assert result.stats_completed == 1 and "1 column stats completed" in result.summary


def test_folds_are_declared_once_in_the_dbt_project(tmp_path: Path) -> None:
    """Compaction folds the tables whose model declares `meta.fold`, read from dbt's manifest:
    no fold is written down in Python."""
    paths = DataPaths(tmp_path)
    assert declared_folds(paths) == {}  # before dbt parsed the project: compaction folds nothing
    ensure_manifest(paths)
    assert declared_folds(paths) == {
        ("state", "customer_event_objects"): Fold(
            "event_winners",
            ("customer_id", "event_action", "end_of_history"),
            candidate="event_id",
            unread=("event_object",),
        ),
        ("state", "customer_identifier_sightings"): Fold(
            "identifier_spans", ("customer_id", "account_id", "id_type", "id_value")
        ),
    }
