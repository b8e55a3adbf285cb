"""The pass window the orchestrator writes to the pass manifest, and where it reads it from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
from dagster_dbt.asset_utils import extract_runtime_selection_from_args

from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.context import DBT_DIR
from orchestration.environment import dbt_env
from orchestration.load import load_new_files
from orchestration.warehouse import ensure_warehouse
from orchestration.window import (
    Window,
    current_window,
    dbt_build_args,
    full_tests_due,
    models_epoch,
    open_pass,
    record_full_tests_passed,
)
from tests.unit.orchestration.test_load import write_landing

T1 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
T2 = datetime(2026, 1, 1, 12, 0, 0, 123457, tzinfo=UTC)


def test_first_pass_builds_whole() -> None:
    assert Window(None, None).dbt_args() == ["--full-refresh"]
    assert Window(None, T1).dbt_args() == ["--full-refresh"]


def test_later_passes_take_what_loaded_after_the_last_finished_one() -> None:
    # No --vars: a change of vars makes dbt parse the whole project again.
    assert Window(T1, T2).dbt_args() == []


def _manifest(conn: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    return conn.execute(
        "select pass_id, models_epoch, loaded_after, loaded_through"
        " from lake.state.pass_manifest order by pass_id"
    ).fetchall()


def test_window_comes_from_the_finished_pass_and_the_newest_load(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    ensure_warehouse(paths)
    assert current_window(paths) == Window(None, None)  # nothing loaded, nothing built

    write_landing(paths, 50, seed=1)
    load_new_files(paths)
    conn = connect(paths)
    try:
        row = conn.execute("select max(loaded_at) from lake.raw.messages").fetchone()
        loaded = row[0] if row else None
        assert current_window(paths) == Window(None, loaded)
        # Passes opened (the manifest) but none finished (no freshness row names one).
        assert open_pass(paths, Window(None, T1)) == 1
        assert open_pass(paths, Window(T1, T2)) == 2
        assert _manifest(conn) == [(1, models_epoch(), None, T1), (2, models_epoch(), T1, T2)]
        assert current_window(paths) == Window(None, loaded)
        # The freshness mart names the pass that built it: the next one starts after its window.
        conn.execute("create table lake.marts.freshness as select now() as built_at, 1 as pass_id")
        assert current_window(paths) == Window(T1, loaded)
        # State of older models (an upgrade changed them): build whole once.
        conn.execute("update lake.state.pass_manifest set models_epoch = models_epoch - 1")
        assert current_window(paths) == Window(None, loaded)
        conn.execute("update lake.state.pass_manifest set models_epoch = models_epoch + 1")
        conn.execute("update lake.marts.freshness set pass_id = 2")
    finally:
        conn.close()
    assert current_window(paths) == Window(T2, loaded)


def test_every_test_runs_again_only_when_the_project_changed(tmp_path: Path) -> None:
    def manifest(raw_code: str, compiled: str, invocation: str) -> str:
        node = {"raw_code": raw_code, "compiled_code": compiled, "config": {"x": 1}}
        return json.dumps({"metadata": {"invocation_id": invocation}, "nodes": {"m": node}})

    (tmp_path / "manifest.json").write_text(manifest("select 1", "select 1 -- t1", "a"))
    assert full_tests_due(tmp_path)  # never passed
    record_full_tests_passed(tmp_path)
    assert not full_tests_due(tmp_path)
    # Every dbt run writes the manifest again with what it compiled: not a change.
    (tmp_path / "manifest.json").write_text(manifest("select 1", "select 1 -- t2", "b"))
    assert not full_tests_due(tmp_path)
    # The models changed: parse again.
    (tmp_path / "manifest.json").write_text(manifest("select 2", "select 2", "c"))
    assert full_tests_due(tmp_path)

    window = Window(T1, T2)
    assert dbt_build_args(window, True) == ["build", *window.dbt_args()]


def test_other_passes_run_the_marts_data_tests_only(tmp_path: Path) -> None:
    """What dbt itself selects with a pass's arguments (`dbt ls` on the project): the marts'
    data tests, without the unit tests, the intermediate and staging models' tests, and the
    tests tagged `definition`; with every test, all of them. Views are built only by passes
    that run every test, and by whole builds."""
    paths = DataPaths(tmp_path)

    def selected(
        full: bool, kinds: tuple[str, ...] = ("test", "unit_test"), window: Window | None = None
    ) -> set[str]:
        # A build's arguments after `build`: its selection (the window is in the environment;
        # `dbt ls` takes no --full-refresh).
        build = dbt_build_args(window or Window(T1, T2), full)
        args = [a for a in build[1:] if a != "--full-refresh"]
        out = subprocess.run(
            [
                str(Path(sys.executable).with_name("dbt")),
                "ls",
                *(a for kind in kinds for a in ("--resource-type", kind)),
                *args,
                "--output",
                "name",
                "--quiet",
                "--project-dir",
                str(DBT_DIR),
                "--profiles-dir",
                str(DBT_DIR),
                "--target-path",
                str(tmp_path / "target"),
                "--log-path",
                str(tmp_path / "logs"),
            ],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, **dbt_env(paths)},
        )
        return set(out.stdout.split())

    # dagster-dbt pulls --exclude out of the arguments (its first value only) before dbt sees
    # them: nothing of the selection may be left behind.
    cleaned, _, excludes = extract_runtime_selection_from_args(
        dbt_build_args(Window(T1, T2), False)
    )
    assert cleaned == ["build", "--exclude-resource-type", "unit_test"], cleaned
    assert "tag:definition,resource_type:test" in excludes
    assert "config.materialized:view" in excludes

    every, light = selected(True), selected(False)
    assert light < every
    assert "unique_events_event_id" in light
    assert "unique_customer_profiles_customer_id" in light
    dropped = every - light
    assert "accepted_values_customer_event_objects_end_of_history__first__last" in dropped
    assert "unique_customer_profiles_subscription_id" in dropped
    assert any(name.startswith("unique_int_") for name in dropped), dropped
    assert not any(name.startswith(("unique_int_", "not_null_int_", "accepted_")) for name in light)
    # Unit tests: only with every test.
    assert any("event_action" in name for name in dropped), dropped

    views = {
        "audiences",
        "stg_messages",
        "stg_pass_manifest",
        "int_pass_window",
        "customers",
        "customer_preferences",
        "customer_event_winners",
        "customer_identifiers",
        "groups",
        "group_members",
    }
    models = selected(True, ("model",))
    assert views < models
    assert models - selected(False, ("model",)) == views
    assert views < selected(False, ("model",), Window(None, T2))  # a whole build
