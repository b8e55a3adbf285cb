"""What a pass looks like in the Dagster UI, from real passes in this process against a temporary
lake: the watcher's runs say they are the watcher's, a plain `mallard pipeline run` says so too,
the dbt assets are grouped by layer, and no run leaves an output it selected without a result."""

from __future__ import annotations

import threading
from pathlib import Path

import dagster as dg

from mallard.paths import DataPaths
from orchestration.defs import build_definitions
from orchestration.defs.ingest import PIPELINE
from orchestration.pipeline import (
    BY_HAND,
    BY_THE_WATCHER,
    LAUNCHED_BY,
    StepResult,
    run_pipeline,
    watch_pipeline,
)
from orchestration.resources import LakeResource
from tests.unit.orchestration.test_load import write_landing


def watch_passes(
    paths: DataPaths, passes: int = 2, full_every_s: float = 0
) -> list[list[StepResult]]:
    """The watcher's first `passes` passes: the first takes the files landed before it starts,
    the second the files landed after the first (nothing lands after that). full_every_s 0:
    every pass full."""
    reports: list[list[StepResult]] = []
    stop = threading.Event()

    def report(steps: list[StepResult]) -> None:
        reports.append(steps)
        if len(reports) == 1:
            write_landing(paths, events=40, seed=2, files=1)
        if len(reports) == passes:
            stop.set()

    write_landing(paths, events=120, seed=1)
    watch_pipeline(paths.root, stop, report, poll_s=0.05, full_every_s=full_every_s)
    return reports


def test_passes_in_the_dagster_ui(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    reports = watch_passes(paths)
    assert len(reports) == 2
    by_hand = run_pipeline(paths.root)
    for steps in [*reports, by_hand]:
        assert all(step.ok for step in steps), steps
        # The marts' health checks ran after the models, in the watcher's passes too.
        assert [s.summary for s in steps if s.name == "marts health"] == ["3/3 checks passed"]
    dbt = [next(s.summary for s in steps if s.name == "dbt build") for steps in reports]
    assert "unit tests" in dbt[0] and "unit tests" not in dbt[1], dbt  # every test, then fewer

    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        runs = list(reversed(instance.get_runs()))  # oldest first
        passes = [run for run in runs if run.job_name == PIPELINE]
        # The first pass runs every test (none passed on this project yet); the next ones select
        # only the checks of the tests every pass runs, and evaluate each.
        checks = [
            sum(
                e.dagster_event_type == "ASSET_CHECK_EVALUATION"
                for e in instance.all_logs(run.run_id)
            )
            for run in passes
        ]
        assert checks[0] > checks[1] == checks[2] > 0, checks
        assert [run.tags.get(LAUNCHED_BY) for run in passes] == [
            BY_THE_WATCHER,
            BY_THE_WATCHER,
            BY_HAND,
        ]
        messages = [
            event.user_message
            for run in runs
            for event in instance.all_logs(run.run_id)
            if event.user_message
        ]
    assert messages, "no events recorded"
    assert not [m for m in messages if "did not yield" in m]
    # dagster-dbt says so when dbt ran a test whose check the run did not select.
    assert not [m for m in messages if "instead of an `AssetCheckResult`" in m]

    # The daemon's sensor asks for the same selection as the watcher's passes.
    defs = build_definitions(paths.root)
    write_landing(paths, events=10, seed=3, files=1)
    with dg.DagsterInstance.ephemeral() as instance:
        tick = defs.resolve_sensor_def("landing_files_sensor").evaluate_tick(
            dg.build_sensor_context(
                instance=instance,
                definitions=defs,
                resources={"lake": LakeResource(data_dir=str(paths.root))},
            )
        )
    (request,) = tick.run_requests or []
    assert request.asset_check_keys and len(request.asset_check_keys) == checks[1]

    graph = defs.resolve_asset_graph()
    groups = {
        key.to_user_string(): graph.get(key).group_name
        for key in graph.get_all_asset_keys()
        if graph.get(key).is_materializable
    }
    assert groups["raw/messages"] == "ingest"
    assert groups["staging/stg_messages"] == "staging"
    assert groups["intermediate/int_messages_deduped"] == "intermediate"
    assert groups["marts/events"] == "marts"
    assert "default" not in groups.values(), groups
