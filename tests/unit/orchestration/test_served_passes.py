"""Served passes, from real passes in this process against temporary lakes: a served pass builds
the marts the read API answers from (the same rows a full pass gives them) and leaves the rest to
the next full pass, which continues after the last full pass and ends with the marts of a lake
that only ever had full passes; the watcher runs a full pass first, served passes while files
keep landing, and a full pass again once they stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from mallard.paths import DataPaths
from orchestration.defs.ingest import PIPELINE
from orchestration.pipeline import StepResult, run_pipeline
from orchestration.window import PASS_KIND_TAG, PassKind
from tests.reliability.test_crashes import copy_data_dir, lake_rows, marts_state
from tests.unit.orchestration.test_load import write_landing
from tests.unit.orchestration.test_pass_in_dagster import watch_passes

SERVED_MARTS = ["marts.events", "marts.customer_profiles", "marts.customer_identifiers"]


def _ok(steps: list[StepResult]) -> list[StepResult]:
    assert all(step.ok for step in steps), steps
    return steps


def _manifest(paths: DataPaths) -> list[tuple[Any, ...]]:
    return lake_rows(
        paths.root,
        "select pass_id, kind, loaded_after, loaded_through from lake.state.pass_manifest"
        " order by pass_id",
    )


def test_a_served_pass_serves_and_the_next_full_pass_completes(tmp_path: Path) -> None:
    served, full = DataPaths(tmp_path / "served"), DataPaths(tmp_path / "full")
    write_landing(served, events=300, seed=1)
    _ok(run_pipeline(served.root))  # the first pass: full, every test
    copy_data_dir(served.root, full.root)  # the same secret: the same subscription ids
    for paths in (served, full):
        write_landing(paths, events=300, seed=2)

    steps = _ok(run_pipeline(served.root, kind=PassKind.SERVED))
    names = [step.name for step in steps]
    assert names[0] == "served" and "marts health" not in names and "dispatch" not in names
    dbt = next(step.summary for step in steps if step.name == "dbt build")
    assert "data tests" not in dbt, dbt  # no test runs in a served pass
    _ok(run_pipeline(full.root))
    after_served, after_full = marts_state(served.root), marts_state(full.root)
    # What the read API answers from: the same as after a full pass of the same messages.
    for table in SERVED_MARTS:
        assert after_served[table] == after_full[table], table
    # The rest waits for the next full pass: the new client retries are not in duplicates yet.
    assert after_served["marts.duplicates"] != after_full["marts.duplicates"]
    (first, _, _, first_through), (second, kind, _, _) = _manifest(served)
    assert kind == "served"
    assert lake_rows(served.root, "select pass_id, full_pass_id from lake.marts.freshness") == [
        (second, first)
    ]

    _ok(run_pipeline(served.root))
    *_, (third, kind, after, _) = _manifest(served)
    assert (kind, after) == ("full", first_through)  # after the last full pass, not the served
    assert lake_rows(served.root, "select pass_id, full_pass_id from lake.marts.freshness") == [
        (third, third)
    ]
    assert marts_state(served.root) == marts_state(full.root)


def test_the_watcher_serves_between_full_passes(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    # After the second (served) pass nothing lands: the full pass comes once it is due.
    reports = watch_passes(paths, passes=3, full_every_s=2.0)
    assert [_ok(steps)[0].name == "served" for steps in reports] == [False, True, False]
    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        runs = list(reversed(instance.get_runs(dg.RunsFilter(job_name=PIPELINE))))
        assert [run.tags[PASS_KIND_TAG] for run in runs] == ["full", "served", "full"]
    assert [kind for _, kind, _, _ in _manifest(paths)] == ["full", "served", "full"]
